"""Curriculum stages of a suite run: pretraining, then an ordered list of fine-tuning stages, each
starting from the previous stage's weights (RMT's and ARMT's recipe: grow the distance between
the key and the question stage by stage, 1 -> 2 -> 4 segments).

A suite's `finetune:` is one mapping (one stage, as before) or a list of mappings. Each entry is
run-config overrides merged onto the *previous stage's* config, so a later stage names only what
changes (e.g. `task: {key_segments_back: [2]}`, `train: {steps: 200}`).

Run folders, for a suite run NAME: NAME-lm (pretraining; NAME-c0 when the first stage trains a
task, as the `distance` suite's gap-1 recall does), NAME-c1 ... NAME-c{K-1} (the first K - 1
fine-tuning stages) and NAME (the last stage: the suite's row and what `longrange:` evaluates).
With the suite's `stop_at_reach`, the stages past the memory's reach are not trained at all
(`stages_within_reach`): the last stage within it is NAME. A finished stage (result.json, config unchanged) is never re-run; an unfinished one
resumes from its checkpoint. A stage whose config changed since it ran is stale: its folder, and
the folder of every later stage, is moved aside to FOLDER.stale-N and trained again.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from memzoo.core.config import ConfigError, run_schema
from memzoo.core.overrides import merge_checked
from memzoo.runs.configure import legacy_memory_options, resolve, saved_run_config
from memzoo.evaluations.reach import max_reach_segments

# Keys that change neither the weights nor the results: a change in them does not make a stage stale.
BOOKKEEPING = ("train.threads", "train.checkpoint_every", "train.log_every")
BOOKKEEPING_SECTIONS = ("log",)  # where metrics go (log.tracker, its project and group)
# Sections added after reference rows were shipped: hashed only where set away from their defaults,
# so the rows of runs that never use them keep their hash.
HASHED_WHEN_SET = ("model.attention_span", "model.qk_conv", "model.qk_conv_lr_mult", "task.min_gap_segments",
                   "task.rewrites", "task.babilong", "train.carry_state", "train.max_doc_segments", "train.doc_start", "train.tf32", "train.copy_share",
                   "train.copy_distance", "train.copy_layout", "train.copy_draw", "task.rebase_rope")


def stage_overrides(finetune: Any) -> list[Any]:
    """The suite's `finetune:` as an ordered list of override mappings (a single mapping is one stage)."""
    if isinstance(finetune, (DictConfig, dict)):
        return [finetune]
    if isinstance(finetune, (ListConfig, list)) and finetune and all(isinstance(s, (DictConfig, dict)) for s in finetune):
        return list(finetune)
    raise ConfigError(f"suite.finetune={OmegaConf.to_container(finetune) if isinstance(finetune, ListConfig) else finetune!r}; "
                      "expected run-config overrides (one stage) or a non-empty list of them (curriculum stages)")


def stage_name(name: str, index: int, count: int) -> str:
    """Folder name of fine-tuning stage `index` (0-based) of `count`: the last one is the run itself."""
    return name if index == count - 1 else f"{name}-c{index + 1}"


def finetune_chain(pretrain: DictConfig, finetune: Any, root: Path, name: str) -> list[DictConfig]:
    """[pretraining, stage 1, ..., last stage]: each fine-tuning stage is the previous stage's
    config under its overrides, renamed, starting from the previous stage's run folder."""
    return name_chain(merge_chain(pretrain, finetune, name), root, name)


def merge_chain(pretrain: DictConfig, finetune: Any, name: str) -> list[DictConfig]:
    """[pretraining, stage 1, ...]: each stage the previous one's config under its overrides, checked
    (errors name the stage and `name`) and resolved; not yet named (`name_chain`)."""
    overrides = stage_overrides(finetune)
    chain = [pretrain]
    for i, stage in enumerate(overrides):
        where = f"suite finetune[{i}] {name}" if len(overrides) > 1 else f"suite finetune {name}"
        chain.append(resolve(merge_checked(chain[-1], stage, where=where)))  # a full run config: the stage's keys checked
    return chain


def name_chain(chain: list[DictConfig], root: Path, name: str) -> list[DictConfig]:
    """The chain's run folders (in place): the pretraining `NAME-lm` (or `NAME-c0`), then each stage's,
    the last one `name` itself, each stage starting from the previous one's folder, its memory included."""
    first = chain[0]
    first.name = f"{name}-lm" if first.task.name == "lm" else f"{name}-c0"
    for i, cfg in enumerate(chain[1:]):
        cfg.name = stage_name(name, i, len(chain) - 1)
        cfg.task.init_from = str(root / "runs" / chain[i].name)
        cfg.task.init_backbone_only = False  # a stage continues the same model, its memory included
    return chain


def seeded_stages(finetune: Any) -> list[bool]:
    """Per config of the chain [pretraining, stage 1, ...]: whether its seed is the run's (inherited
    from the pretraining), not one that a stage's overrides (or an earlier stage's) set."""
    out, inherited = [True], True
    for stage in stage_overrides(finetune):
        inherited = inherited and "seed" not in stage
        out.append(inherited)
    return out


def stages_within_reach(first: DictConfig, finetune: Any) -> list[Any]:
    """The fine-tuning stages a run trains when nothing is trained past its memory's reach: the
    leading stages whose largest gap (task.gap_segments, each stage merged onto the ones before)
    the memory of `first` can bridge by construction (memzoo.evaluations.reach); from the first stage
    past it on, none. The first stage (`first`, the suite's run config) is always trained."""
    reach = max_reach_segments(first)
    if reach is None:
        return stage_overrides(finetune)
    kept, cfg = [], first
    for stage in stage_overrides(finetune):
        cfg = OmegaConf.merge(cfg, stage)
        if cfg.task.name != "recall" or not cfg.task.gap_segments:
            raise ConfigError(f"suite.stop_at_reach needs recall-across-segments stages (task.name=recall, "
                              f"task.gap_segments >= 1); got task.name={cfg.task.name!r}, "
                              f"gap_segments={cfg.task.gap_segments}")
        if int(cfg.task.gap_segments) > reach:
            break
        kept.append(stage)
    return kept


# Keys added after reference rows were shipped, at the value that trains what runs without them
# trained: omitted from config_hash there, so the shipped rows stay the runs their suites make.
def _comparable(cfg: DictConfig) -> dict[str, Any]:
    """A run config as a plain dict under the current schema (keys added since take their defaults),
    without the bookkeeping keys."""
    merged = OmegaConf.merge(run_schema(), cfg)
    out = OmegaConf.to_container(merged, resolve=True)
    for key in BOOKKEEPING:
        section, leaf = key.split(".")
        out.get(section, {}).pop(leaf, None)
    for section in BOOKKEEPING_SECTIONS:
        out.pop(section, None)
    return out


def config_hash(cfg: DictConfig) -> str:
    """A short hash of what a run trains and measures: the comparable config without its folder
    (out_dir, and init_from reduced to the folder's name), so the same run hashes alike anywhere; a
    memory option at its plugin's legacy value hashes as the config from before it existed."""
    out = _comparable(cfg)
    out.pop("out_dir", None)
    defaults = OmegaConf.to_container(run_schema())
    for key in HASHED_WHEN_SET:
        section, leaf = key.split(".")
        if out.get(section, {}).get(leaf, defaults[section][leaf]) == defaults[section][leaf]:
            out.get(section, {}).pop(leaf, None)
    memory = out.get("memory", {})
    for key, value in legacy_memory_options(memory.get("name")).items():
        if memory.get(key) == value:  # an option at the value runs had before it existed: hashed as absent
            memory.pop(key)
    task = out.get("task", {})
    if task.get("init_from"):
        task["init_from"] = Path(str(task["init_from"])).name
    return hashlib.sha256(json.dumps(out, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_matches(run_dir: Path, cfg: DictConfig) -> bool:
    """The run folder was trained (or is being trained) under `cfg`, bookkeeping keys aside. Where
    the folder lies is not part of the run: a results folder moved or copied elsewhere (out_dir and
    init_from's parent changed) still matches, so its runs are not trained again."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return False
    try:
        return config_hash(saved_run_config(path)) == config_hash(cfg)
    except OmegaConfBaseException:  # a key the schema no longer has: another config
        return False


def finished(run_dir: Path, cfg: DictConfig) -> bool:
    """A stage that is done: result.json written under this very config."""
    return (Path(run_dir) / "result.json").is_file() and config_matches(run_dir, cfg)


def move_aside(run_dir: Path) -> Path:
    """Rename a stale stage folder to FOLDER.stale-N (the first N free); returns the new path."""
    n = 1
    while (target := run_dir.with_name(f"{run_dir.name}.stale-{n}")).exists():
        n += 1
    run_dir.rename(target)
    return target


def prepare_stage(run_dir: Path, cfg: DictConfig, upstream_retrained: bool) -> bool:
    """Whether the stage in `run_dir` must (still) be trained; a stale folder (config changed, or an
    earlier stage trained again since) is moved aside first, so training starts afresh from the
    previous stage. A folder with a checkpoint and the same config resumes."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return True
    if upstream_retrained or not config_matches(run_dir, cfg):
        if (run_dir / "config.yaml").is_file() or (run_dir / "checkpoint.pt").is_file():
            move_aside(run_dir)
        return True
    return not (run_dir / "result.json").is_file()
