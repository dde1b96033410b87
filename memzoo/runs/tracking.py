"""Where a run's metrics go: one small tracker interface that `metrics.jsonl` goes through, with
TensorBoard and Weights & Biases beside it (`log.tracker: none | tensorboard | wandb`).

The JSONL writer is always on; the chosen tracker gets the same rows (train and valid bits per
byte, learning rate, gradient norm, throughput), the resolved config at the start, and at the end
a summary (final validation bits per byte, per-head gate values) that the JSONL file leaves to
result.json. TensorBoard and W&B are imported only when chosen; a missing package is a one-line
ConfigError naming the extra to install. Under DDP only rank 0 logs (the other ranks get no tracker).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import secrets
from pathlib import Path
from typing import Any, Optional, Protocol

from omegaconf import DictConfig

from memzoo.core.config import ConfigError
from memzoo.runs.disk import writing
from memzoo.runs.distributed import DistInfo

TRACKERS = ("none", "tensorboard", "wandb")
# tracker -> (the modules it imports, the pip extra that installs them)
PACKAGES = {"tensorboard": (("tensorboard", "torch.utils.tensorboard"), "tensorboard"), "wandb": (("wandb",), "wandb")}


class Tracker(Protocol):
    """Receives a run's metrics: `config` once at the start, `log` per logged step, `summary` at the end."""

    def config(self, values: dict[str, Any]) -> None: ...

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def summary(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _missing(tracker: str, err: Optional[BaseException] = None) -> ConfigError:
    """The one-line error for a tracker whose package is not installed, naming the extra."""
    modules, extra = PACKAGES[tracker]
    why = f" ({str(err).splitlines()[0]})" if err is not None else ""
    return ConfigError(f"log.tracker={tracker} needs the {modules[0]} package, which is not installed{why}; "
                       f"pip install 'memzoo[{extra}]' (or set log.tracker=none)")


WANDB_FORBIDDEN = "/\\#?%:"  # characters W&B refuses in a project name


def check_log(log: DictConfig) -> None:
    """The log section's values W&B would refuse: a project name of 1..128 characters without
    / \\ # ? % :, a group of at most 128."""
    project, group = log.project, log.group
    if not isinstance(project, str) or not 0 < len(project) <= 128 or any(c in project for c in WANDB_FORBIDDEN):
        raise ConfigError(f"log.project={project!r}; expected 1 to 128 characters, none of {' '.join(WANDB_FORBIDDEN)}")
    if group is not None and (not isinstance(group, str) or len(group) > 128):
        raise ConfigError(f"log.group={group!r}; expected at most 128 characters, or null")


def check_tracker(tracker: str) -> None:
    """Raise ConfigError if `tracker` is unknown or its package is missing (without importing it:
    suites check before starting any run)."""
    if tracker not in TRACKERS:
        raise ConfigError(f"log.tracker={tracker!r}; expected one of {', '.join(TRACKERS)}")
    if tracker == "none":
        return
    top = PACKAGES[tracker][0][0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules without a spec
        found = False
    if not found:
        raise _missing(tracker)


def _require(tracker: str) -> list[Any]:
    """Import the tracker's modules now (lazily: only the chosen one), or raise the one-line error."""
    try:
        return [importlib.import_module(name) for name in PACKAGES[tracker][0]]
    except ImportError as err:
        raise _missing(tracker, err) from None


class JsonlTracker:
    """metrics.jsonl: one JSON object per logged step ({"step": s, **scalars}); the summary is result.json's."""

    def __init__(self, path: Path, start_step: int = 0):
        self.path = Path(path)
        self._truncate(start_step)

    def _truncate(self, step: int) -> None:
        """Drop rows past `step` (a resumed run logs them again; a restarted one, from step 0, anew)."""
        if not self.path.is_file():
            return
        rows = [line for line in self.path.read_text().splitlines() if line.strip()]
        kept = [line for line in rows if json.loads(line).get("step", 0) <= step]
        if len(kept) != len(rows):
            with writing(self.path.parent, f"the metrics ({self.path.name})"):
                self.path.write_text("".join(line + "\n" for line in kept))

    def config(self, values: dict[str, Any]) -> None:
        """Nothing: the run folder's config.yaml is the record."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        with writing(self.path.parent, f"the metrics ({self.path.name})"), open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **scalars}) + "\n")

    def summary(self, step: int, scalars: dict[str, float]) -> None:
        """Nothing: result.json holds the run's final numbers."""

    def close(self) -> None:
        """Nothing to flush: every row is written when logged."""


class TensorBoardTracker:
    """Event files in the run folder (`tensorboard --logdir` on out_dir lists runs by name); scalars
    under metrics.jsonl's keys, the config as text. A resumed run hides what was logged after its
    checkpoint (purge_step), as metrics.jsonl drops those rows."""

    def __init__(self, run_dir: Path, start_step: int = 0):
        _, tb = _require("tensorboard")
        self.writer = tb.SummaryWriter(log_dir=str(run_dir), purge_step=start_step + 1)

    def config(self, values: dict[str, Any]) -> None:
        text = json.dumps(values, indent=1, default=str)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)  # preformatted

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def summary(self, step: int, scalars: dict[str, float]) -> None:
        self.log(step, scalars)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run named after the memzoo run (a suite's run name), grouped by log.group, its files in
    the run folder unless WANDB_DIR says otherwise. Its id is kept in the run folder (wandb-id), so
    a resumed run continues the same W&B run; a fresh or restarted run starts a new one."""

    def __init__(self, cfg: DictConfig, run_dir: Path, start_step: int = 0):
        (self.wandb,) = _require("wandb")
        id_file = Path(run_dir) / "wandb-id"
        run_id = id_file.read_text().strip() if start_step and id_file.is_file() else None
        if run_id is None:
            run_id = secrets.token_hex(6)  # W&B ids: lowercase letters and digits
            id_file.write_text(run_id + "\n")
        where = None if os.environ.get("WANDB_DIR") else str(run_dir)
        try:
            self.run = self.wandb.init(project=cfg.log.project, name=str(cfg.name), group=cfg.log.group, id=run_id,
                                       resume="allow", dir=where)
        except Exception as err:  # wandb.errors.*: not logged in, no network, a name W&B refuses
            raise ConfigError(f"log.tracker=wandb: wandb.init failed ({type(err).__name__}: {str(err).splitlines()[0]}); "
                              "log in (`wandb login`), or run offline with WANDB_MODE=offline") from None

    def config(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def summary(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(dict(scalars), step=step)
        self.run.summary.update(dict(scalars))

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """Several trackers as one (metrics.jsonl and the chosen one); none at all on a rank other than 0."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def config(self, values: dict[str, Any]) -> None:
        for t in self.trackers:
            t.config(values)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for t in self.trackers:
            t.log(step, scalars)

    def summary(self, step: int, scalars: dict[str, float]) -> None:
        for t in self.trackers:
            t.summary(step, scalars)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def make_tracker(cfg: DictConfig, run_dir: Path, rank: DistInfo, start_step: int = 0) -> Trackers:
    """metrics.jsonl plus `cfg.log.tracker` for the run in `run_dir` starting at `start_step` (rows
    after it are dropped or hidden); on a rank other than 0, nothing."""
    if not rank.is_main:
        return Trackers([])
    tracker = cfg.log.tracker
    check_tracker(tracker)
    trackers: list[Tracker] = [JsonlTracker(Path(run_dir) / "metrics.jsonl", start_step)]
    if tracker == "tensorboard":
        trackers.append(TensorBoardTracker(Path(run_dir), start_step))
    elif tracker == "wandb":
        trackers.append(WandbTracker(cfg, Path(run_dir), start_step))
    return Trackers(trackers)


def gate_scalars(gates: dict[str, list[float]]) -> dict[str, float]:
    """Per-head gate values ({layer: [head values]}, memzoo.evaluations.run_result.gate_values) as scalars
    named gate/layer{L}/head{H}."""
    return {f"gate/layer{layer}/head{h}": float(v) for layer, values in gates.items() for h, v in enumerate(values)}
