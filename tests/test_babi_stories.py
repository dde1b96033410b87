"""The BABILong-style generator: every question is answerable from the facts in the input and its
answer is the simulated world's state; the facts appear in order at the requested depth; train and
test never share a story; the `babilong` training task trains on the answer bytes only."""
from __future__ import annotations

import re

import pytest
import torch

from memzoo.core.config import ConfigError
from memzoo.data.babi_stories import StorySettings, generate
from memzoo.data.babi_world import DROPS, GETS, MOVES, OBJECTS, PEOPLE, STORY_TASKS, story_split
from memzoo.data.babilong import PLACES
from memzoo.runs.configure import load_config

# Any sentence of the world, whatever the generator meant: found in the input independently of it.
FACT = re.compile(r"\b(" + "|".join(PEOPLE) + r") (" + "|".join(MOVES + GETS + DROPS) + r") the (\w+)\.")


def solve(facts: list[tuple[str, str, str]], question: str) -> str:
    """The answer from the facts alone, by replaying them (independent of the generator's World)."""
    where: dict[str, str] = {}  # person -> place
    held: dict[str, str] = {}  # object -> person
    trail: dict[str, list[str]] = {}  # object -> places

    def visit(obj: str, place: str) -> None:
        if not trail.setdefault(obj, []) or trail[obj][-1] != place:
            trail[obj].append(place)

    for person, verb, thing in facts:
        if verb in MOVES:
            where[person] = thing
            for obj in [o for o, p in held.items() if p == person]:
                visit(obj, thing)
        elif verb in GETS:
            held[thing] = person
            visit(thing, where[person])
        else:
            held.pop(thing)
    if m := re.fullmatch(r"Where is (\w+)\?", question):
        return where[m.group(1)]
    if m := re.fullmatch(r"Where is the (\w+)\?", question):
        return trail[m.group(1)][-1]
    m = re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question)
    places = trail[m.group(1)]
    assert places.count(m.group(2)) == 1, "the question must be unambiguous"
    return places[places.index(m.group(2)) - 1]


@pytest.mark.parametrize("task", STORY_TASKS)
def test_every_question_is_answered_by_the_facts_and_the_answer_is_the_world_state(task: str) -> None:
    settings = StorySettings()
    for index in range(40):
        length = (0, 2048)[index % 2]
        g = generate(task, length, "test", index, settings)
        found = FACT.findall(g.sample.input)
        assert [f"{p} {v} the {t}." for p, v, t in found] == g.story.facts, "the facts, in order, and no others"
        assert len(g.sample.input.encode()) <= max(length, sum(len(f) + 1 for f in g.story.facts))
        answer = solve(found, g.sample.question)
        assert answer == g.sample.target and answer in PLACES
        world = g.story.world
        if task == "qa1":
            assert answer == world.place[g.sample.question[len("Where is "):-1]]
        elif task == "qa2":
            assert answer == world.where(g.sample.question.split()[-1][:-1])
        for thing in OBJECTS + tuple(PEOPLE) + PLACES:  # the background names nothing of the world
            background = FACT.sub("", g.sample.input)
            assert not re.search(rf"\b{thing}\b", background, re.IGNORECASE), thing


def test_facts_sit_in_order_at_the_requested_depth() -> None:
    settings = StorySettings(depth=(0.25, 0.5))
    for index in range(20):
        g = generate("qa2", 4096, "test", index, settings)
        text = g.sample.input
        assert g.fact_offsets == sorted(g.fact_offsets)
        assert [text[o:o + len(f)] for o, f in zip(g.fact_offsets, g.story.facts)] == g.story.facts
        longest = 201  # a background sentence and its space, at most
        for i, offset in enumerate(g.fact_offsets):
            before = offset - sum(len(f) + 1 for f in g.story.facts[:i])  # background bytes ahead of the fact
            depth = before / g.background_bytes
            assert 0.25 - longest / g.background_bytes <= depth <= 0.5, (index, i, depth)
        assert 4096 - 220 <= len(text.encode()) <= 4096, "the input fills its length"


def test_background_sentences_that_name_the_world_are_left_out(tmp_path) -> None:
    """A background text full of the world's names (and of "question"/"answer") gives inputs whose
    only mentions of people, places and objects are the facts."""
    noisy = ["Mary went to the kitchen.", "The office was quiet today.", "A football rolled past.",
             "Bill never answered the letter.", "That question stays open."]
    clean = [f"Clean sentence {i} says nothing of the sort." for i in range(40)]
    text = tmp_path / "noisy.txt"
    text.write_text(" ".join(s for pair in zip(noisy * 8, clean) for s in pair))
    settings = StorySettings(background=str(text))
    for index in range(10):
        g = generate("qa2", 700, "train", index, settings)
        background = g.sample.input
        for fact in g.story.facts:
            background = background.replace(fact, "", 1)
        assert "Clean sentence" in background
        for word in (*PEOPLE, *PLACES, *OBJECTS, "Bill", "question", "answer"):
            assert not re.search(rf"\b{word}\b", background, re.IGNORECASE), (word, background)


def test_train_and_test_never_share_a_story() -> None:
    settings = StorySettings(facts=(2, 2))  # the smallest story space: collisions would show here first
    train = [generate("qa1", 0, "train", i, settings) for i in range(400)]
    test = [generate("qa1", 0, "test", i, settings) for i in range(400)]
    train_keys = {(g.sample.input, g.sample.question) for g in train}
    test_keys = {(g.sample.input, g.sample.question) for g in test}
    assert len(test_keys) > 100 and not train_keys & test_keys
    assert all(story_split(g.story.facts, g.sample.question) == "train" for g in train)
    again = generate("qa1", 0, "test", 7, settings)
    assert again.sample == generate("qa1", 0, "test", 7, settings).sample, "deterministic in its arguments"


def test_bad_settings_name_the_value() -> None:
    with pytest.raises(ConfigError, match="story task 'qa5'"):
        StorySettings().check(["qa5"], [0])
    with pytest.raises(ConfigError, match=r"story depth=\[0.5, 0.2\]"):
        StorySettings(depth=(0.5, 0.2)).check(["qa1"], [0])
    with pytest.raises(ConfigError, match="story length 100 bytes"):
        StorySettings().check(["qa1"], [100])
    with pytest.raises(ConfigError, match="task.babilong: story task 'qa4'"):
        load_config("local", ["task.name=babilong", "task.lengths=[0]", "task.babilong.tasks=[qa4]"])


def test_the_training_task_trains_on_the_answer_only(tmp_path) -> None:
    """Stories over a local text's sentences: the loss sees the answer " place." and nothing else."""
    from memzoo.data.tasks import TaskSampler

    text = tmp_path / "prose.txt"
    text.write_text(" ".join(f"Sentence number {i} of a long and quiet text goes on." for i in range(400)))
    cfg = load_config("local", ["task.name=babilong", "task.lengths=[0,600]", "task.babilong.tasks=[qa1,qa3]",
                                f"task.babilong.background={text}", "model.segment_len=64"])
    sampler = TaskSampler(cfg.task, 64, seed=3)
    for step in range(3):
        batch = sampler.sample(step, 3)
        for row in range(3):
            tokens, targets = batch.tokens[row].flatten(), batch.targets[row].flatten()  # [S N]
            mask = batch.mask[row].flatten()
            answer = bytes(targets[mask].tolist()).decode()
            assert re.fullmatch(r" (" + "|".join(PLACES) + r")\.", answer), answer
            text = bytes(tokens[: int(mask.nonzero()[-1]) + 1].tolist()).decode()
            assert text.endswith("\nAnswer:" + answer[:-1]) and answer[1:-1] == solve(
                FACT.findall(text), re.search(r"Question: (.*)\n", text).group(1))
    assert torch.equal(sampler.sample(1, 3).tokens, sampler.sample(1, 3).tokens)
