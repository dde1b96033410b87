"""The bAbI world the story generator simulates: four people move between six places and pick up and
drop three objects; each event is a fact sentence, and a question's answer is read off the world.

qa1 states moves only and asks "Where is Mary?"; qa2 adds objects ("Where is the football?"); qa3
asks where an object was before a place. A story belongs to one split by a hash of its text.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Optional

from memzoo.core.config import ConfigError
from memzoo.data.babilong import PLACES

PEOPLE = ("Mary", "John", "Daniel", "Sandra")
OBJECTS = ("apple", "football", "milk")
MOVES = ("moved to", "went to", "travelled to", "journeyed to", "went back to")
GETS = ("got", "grabbed", "picked up", "took")
DROPS = ("dropped", "discarded", "put down", "left")
STORY_TASKS = ("qa1", "qa2", "qa3")
DEFAULT_FACTS = {"qa1": (2, 8), "qa2": (4, 12), "qa3": (6, 16)}  # facts per story, inclusive
SPLITS = ("train", "test")


def longest_fact() -> int:
    """Bytes of the longest fact sentence the world can state."""
    person = max(PEOPLE, key=len)
    moves = [f"{person} {verb} the {place}." for verb in MOVES for place in PLACES]
    handles = [f"{person} {verb} the {obj}." for verb in GETS + DROPS for obj in OBJECTS]
    return max(map(len, moves + handles))


@dataclass
class World:
    """The simulated state: where each person is, who holds what, where each object has been."""

    place: dict[str, str] = field(default_factory=dict)  # person -> place (once known)
    holder: dict[str, str] = field(default_factory=dict)  # object -> the person holding it
    history: dict[str, list[str]] = field(default_factory=dict)  # object -> its places, consecutive repeats merged

    def where(self, obj: str) -> Optional[str]:
        """An object's place now (None: never seen)."""
        return self.history[obj][-1] if self.history.get(obj) else None

    def _visit(self, obj: str, place: str) -> None:
        trail = self.history.setdefault(obj, [])
        if not trail or trail[-1] != place:
            trail.append(place)

    def move(self, person: str, place: str) -> None:
        self.place[person] = place
        for obj, who in self.holder.items():
            if who == person:
                self._visit(obj, place)

    def get(self, person: str, obj: str) -> None:
        self.holder[obj] = person
        self._visit(obj, self.place[person])

    def drop(self, person: str, obj: str) -> None:
        del self.holder[obj]


@dataclass
class Story:
    task: str
    facts: list[str]
    question: str
    target: str
    world: World  # the state after the last fact: what the target was read from


def act(world: World, rng: random.Random, task: str) -> str:
    """One random event, applied to the world; returns its sentence."""
    known = [p for p in PEOPLE if p in world.place]
    gettable = [(p, o) for p in known for o in OBJECTS
                if o not in world.holder and world.where(o) in (None, world.place[p])]
    droppable = [(p, o) for o, p in world.holder.items()]
    kinds = ["move"] * 3
    if task != "qa1":  # qa1 states moves only
        kinds += ["get"] * (2 if gettable else 0) + ["drop"] * (1 if droppable else 0)
    kind = rng.choice(kinds)
    if kind == "get":
        person, obj = rng.choice(gettable)
        world.get(person, obj)
        return f"{person} {rng.choice(GETS)} the {obj}."
    if kind == "drop":
        person, obj = rng.choice(sorted(droppable))
        world.drop(person, obj)
        return f"{person} {rng.choice(DROPS)} the {obj}."
    person = rng.choice(PEOPLE)
    place = rng.choice([p for p in PLACES if p != world.place.get(person)])
    world.move(person, place)
    return f"{person} {rng.choice(MOVES)} the {place}."


def ask(world: World, rng: random.Random, task: str) -> Optional[tuple[str, str]]:
    """(question, answer) the world can answer for the task, or None."""
    if task == "qa1":
        people = sorted(world.place)
        if not people:
            return None
        person = rng.choice(people)
        return f"Where is {person}?", world.place[person]
    if task == "qa2":
        seen = sorted(o for o in OBJECTS if world.where(o))
        if not seen:
            return None
        obj = rng.choice(seen)
        return f"Where is the {obj}?", world.where(obj)
    choices = [(o, i) for o in sorted(world.history) for i, p in enumerate(world.history[o])
               if i >= 1 and world.history[o].count(p) == 1]
    if not choices:
        return None
    obj, i = rng.choice(choices)
    return f"Where was the {obj} before the {world.history[obj][i]}?", world.history[obj][i - 1]


def story_split(facts: list[str], question: str) -> str:
    """The split a story belongs to, by a hash of its text (half the stories each)."""
    return SPLITS[zlib.crc32(" ".join([*facts, question]).encode()) % 2]


def simulate(task: str, rng: random.Random, facts: tuple[int, int], split: str) -> Story:
    """A story of the task with a question the world answers, belonging to `split`."""
    for _ in range(1000):
        world = World()
        n = rng.randint(*facts)
        sentences = [act(world, rng, task) for _ in range(n)]
        asked = ask(world, rng, task)
        if asked is not None and story_split(sentences, asked[0]) == split:
            return Story(task, sentences, asked[0], asked[1], world)
    raise ConfigError(f"no {task} story with facts={list(facts)} has an answerable question; expected more facts")
