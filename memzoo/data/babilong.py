"""BABILong samples as released (`RMT-team/babilong`, `RMT-team/babilong-1k-samples`) and as the
local generator writes them (memzoo.data.babi_stories): rows {input, question, target}, read from the
hub through `datasets` (config = length, split = task) or from local files, and both scorers.

The prompt a byte-level model sees is `input` then QUESTION_TEMPLATE; it is trained to answer with
ANSWER_TEMPLATE (" kitchen."). Scored two ways, side by side:
- official (the BABILong authors' metric): the output lower-cased and cut at its first "."; the
  task's labels found in it, minus those that occur in the question; correct iff exactly the target
  remains. Labels are matched as substrings, as the authors do.
- exact (as fine-tuned RMT/ARMT are scored): the output, leading spaces dropped and cut at its first
  "." or newline, equals the target exactly.

Local layouts, under a folder DIR: DIR/LENGTH/TASK.json (a JSON list, or JSON lines), .jsonl,
.parquet or TASK-*.parquet (a hub snapshot of `RMT-team/babilong-1k-samples`); or DIR/TASK/LENGTH*
(a hub snapshot of `RMT-team/babilong`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from memzoo.core.config import ConfigError

QUESTION_TEMPLATE = "\nQuestion: {question}\nAnswer:"
ANSWER_TEMPLATE = " {target}."
FIELDS = ("input", "question", "target")

PLACES = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
# The answer labels of each task (bAbI's vocabulary; the official scorer's sets).
TASK_LABELS: dict[str, tuple[str, ...]] = {
    "qa1": PLACES, "qa2": PLACES, "qa3": PLACES, "qa4": PLACES,
    "qa5": ("Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"),
}
HUB_NAMES = ("RMT-team/babilong", "RMT-team/babilong-1k-samples")


@dataclass(frozen=True)
class Sample:
    """One row of the released schema."""

    input: str  # the context: facts among background sentences
    question: str
    target: str

    def prompt(self) -> bytes:
        """What the model reads before answering (UTF-8 bytes)."""
        return (self.input + QUESTION_TEMPLATE.format(question=self.question)).encode("utf-8")

    def answer(self) -> bytes:
        """What the model is trained to write after the prompt."""
        return ANSWER_TEMPLATE.format(target=self.target).encode("utf-8")


def check_task_name(task: str) -> None:
    """Raise naming the task unless the scorers know its labels."""
    if task not in TASK_LABELS:
        raise ConfigError(f"BABILong task {task!r}; expected one of {', '.join(TASK_LABELS)}")


def length_bytes(name: str) -> int:
    """A length name in bytes: '0k' -> 0, '4k' -> 4096, '1M' -> 1048576, '300' -> 300."""
    match = re.fullmatch(r"(\d+)([kKmM]?)", name.strip())
    if match is None:
        raise ConfigError(f"BABILong length {name!r}; expected a byte count such as 512, 4k or 1M")
    scale = {"": 1, "k": 2**10, "m": 2**20}[match.group(2).lower()]
    return int(match.group(1)) * scale


def labels_in(text: str, question: str, task: str) -> set[str]:
    """The task's labels (lower case) that occur in `text`, minus those that occur in the question."""
    check_task_name(task)
    labels = {label.lower() for label in TASK_LABELS[task]}
    text, question = text.lower(), question.lower()
    return {label for label in labels if label in text and label not in question}


def score_official(output: str, target: str, question: str, task: str) -> bool:
    """The BABILong authors' scorer: exactly the target among the labels before the first '.',
    labels that occur in the question not counted."""
    text = output.lower().split(".")[0].split("<context>")[0].split("<example>")[0]
    return labels_in(text, question, task) == {target.lower()}


def label_chance(sample: Sample, task: str) -> float:
    """The official scorer's expected accuracy for a guess drawn uniformly from the task's labels that
    occur in the input (minus those in the question): the floor of a model that learned which words
    answer but not which fact (0 when the target is not among them)."""
    candidates = labels_in(sample.input, sample.question, task)
    return 1.0 / len(candidates) if sample.target.lower() in candidates else 0.0


def score_exact(output: str, target: str) -> bool:
    """Strict exact match of the answer: leading spaces dropped, cut at the first '.' or newline."""
    return re.split(r"[.\n]", output.lstrip(" "), maxsplit=1)[0] == target


def _rows(items: Iterable[dict[str, Any]], where: str, limit: Optional[int]) -> list[Sample]:
    """Samples from mappings that have the schema's fields (others ignored), at most `limit`."""
    out = []
    for i, row in enumerate(items):
        if limit is not None and len(out) >= limit:
            break
        missing = [f for f in FIELDS if f not in row]
        if missing:
            raise ConfigError(f"{where}: row {i} has no {', '.join(missing)}; expected fields {', '.join(FIELDS)}")
        out.append(Sample(str(row["input"]), str(row["question"]), str(row["target"])))
    return out


def _json_rows(path: Path) -> Iterator[dict[str, Any]]:
    """A JSON list, or one JSON object per line."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, list):
        yield from data
        return
    if isinstance(data, dict) and all(f in data for f in FIELDS):
        yield data
        return
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}: line {n} is not JSON ({err.msg}); expected a JSON list or JSON lines") from None


def _parquet_rows(paths: list[Path]) -> Iterator[dict[str, Any]]:
    import pandas as pd

    for path in paths:
        yield from pd.read_parquet(path, columns=list(FIELDS)).to_dict("records")


def local_files(root: Path, task: str, length: str) -> list[Path]:
    """The files of one (task, length) in a local folder, in either layout ([] if none)."""
    for folder, stem in ((root / length, task), (root / task, length)):
        for suffix in (".json", ".jsonl", ".parquet"):
            if (folder / f"{stem}{suffix}").is_file():
                return [folder / f"{stem}{suffix}"]
        shards = sorted(folder.glob(f"{stem}-*.parquet"))
        if shards:
            return shards
    return []


def read_local(root: Path, task: str, length: str, limit: Optional[int] = None) -> list[Sample]:
    """One (task, length) from a local folder."""
    files = local_files(root, task, length)
    if not files:
        raise FileNotFoundError(f"--data {str(root)!r} has no {task} samples of length {length}: expected "
                                f"{root / length / task}.json (.jsonl, .parquet or -*.parquet) or {root / task / length}*")
    rows = _parquet_rows(files) if files[0].suffix == ".parquet" else _json_rows(files[0])
    return _rows(rows, str(files[0]), limit)


def hub_unavailable(name: str, length: str, task: str, err: BaseException) -> ConfigError:
    """The one-line error for a hub dataset that cannot be read (offline, most often)."""
    first = (str(err).strip().splitlines() or [""])[0][:200]
    return ConfigError(
        f"--data 'hf:{name}': could not load config {length!r}, split {task!r} ({type(err).__name__}: {first}). "
        f"Offline, download it where there is network (`huggingface-cli download --repo-type dataset {name} "
        f"--local-dir DIR`), bring DIR here and pass --data DIR (its LENGTH/TASK-*.parquet files are read as they are)"
    )


def read_hub(name: str, task: str, length: str, limit: Optional[int] = None) -> list[Sample]:
    """One (task, length) of a dataset in the hub's layout (config = length, split = task), streamed."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"--data 'hf:{name}' needs the datasets library: pip install 'memzoo[datasets]'") from None
    try:
        stream = datasets.load_dataset(name, length, split=task, streaming=True)
        return _rows(stream, f"hf:{name} {length}/{task}", limit)
    except ConfigError:
        raise
    except Exception as err:  # offline, no such dataset, config or split: one clear line
        raise hub_unavailable(name, length, task, err) from err


def read_samples(source: str, task: str, length: str, limit: Optional[int] = None) -> list[Sample]:
    """The samples of one (task, length): `hf:NAME` (any dataset of the hub layout) or a local folder."""
    if limit is not None and limit < 1:
        raise ConfigError(f"max_samples={limit}; expected >= 1")
    if source.startswith("hf:"):
        name = source[len("hf:"):]
        if not name:
            raise ConfigError(f"--data {source!r}; expected hf:NAME, e.g. hf:{HUB_NAMES[0]}")
        return read_hub(name, task, length, limit)
    root = Path(source).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--data {source!r} is neither hf:NAME nor a folder of LENGTH/TASK.json files")
    return read_local(root, task, length, limit)


def write_samples(samples: Iterable[Sample], path: Path) -> Path:
    """Samples as JSON lines in the released schema (one object per line, UTF-8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps({"input": s.input, "question": s.question, "target": s.target}) + "\n")
    tmp.replace(path)
    return path
