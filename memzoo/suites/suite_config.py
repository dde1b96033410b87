"""A comparison suite's schema: `SuiteConfig` (what a suite YAML may say) and `load_suite` (schema,
then the YAML and its `defaults:` chain, then key=value overrides)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from memzoo.core.config import ConfigError
from memzoo.core.overrides import (apply_indexed, load_yaml_chain, merge_checked, parse_overrides, preset_path,
                                   split_indexed)


@dataclass
class SuiteConfig:
    name: str = "suite"
    base: str = "small"  # the run preset every run starts from; "{method}" in it is replaced per method
    run: Any = field(default_factory=dict)  # overrides of the run config shared by every run
    methods: Any = "all"  # "all": every registered method (plugins from other packages too), or a list
    exclude: list[str] = field(default_factory=list)
    options: Any = field(default_factory=dict)  # {method: {memory option: value}}
    # {method: {memory option or dotted run-config key (model.n_heads): [values, ...]}}: one run per combination;
    # null among the values is the option's default (that run named and configured as without the key)
    grid: Any = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    token_budget: Optional[int] = None  # training bytes per run, the same for every method (sets train.steps)
    imports: list[str] = field(default_factory=list)  # modules or .py files to import first (notebook plugins)
    jobs: int = 1  # worker processes
    threads_per_job: int = 0  # torch threads per worker; 0 = the usable cores that other suites leave, // jobs
    max_param_spread: float = 0.10  # (max - min) / min of the parameter counts across runs
    out_dir: str = "results"  # the suite's folder is out_dir/name
    # Optional fine-tuning after pretraining: run-config overrides (one stage, e.g. on the passkey
    # task), or a list of them (curriculum stages, each merged onto the previous stage's config and
    # starting from its weights; memzoo.training.curriculum). The pretrained run is kept as NAME-lm, earlier
    # stages as NAME-c1, NAME-c2, ...; the last stage is the suite's run.
    finetune: Any = None
    # Optional shared pretraining: run-config overrides (on base + run) of one language model per seed,
    # trained first, whose backbone every method's pretraining stage starts from
    # (task.init_backbone_only: each memory's own parameters at their initialisation). The Infini and
    # RMT papers add their memory to a pretrained transformer; one backbone for all also makes the
    # methods differ only in their memory. Kept as runs/backbone-sSEED.
    backbone: Any = None
    # Curriculum stages past a method's reach are not trained (memzoo.training.curriculum.stages_within_reach):
    # a memory whose window cannot bridge a stage's largest gap (memzoo.evaluations.reach) stops at the stage before.
    stop_at_reach: bool = False
    # Optional last stage: long-range evaluations of each run, a list of
    # memzoo.evaluations.passkey_recall.LongRangeConfig
    # options (e.g. [{task: passkey, lengths: [...], depths: [...]}]), with task: distance of
    # memzoo.evaluations.distance.DistanceConfig options (recall at gaps), or with task: babilong of
    # memzoo.evaluations.babilong.BabilongConfig options; their rows join the results table.
    longrange: Any = field(default_factory=list)
    # The metric `memzoo scorecard` ranks this suite by: a score its evaluations declare
    # (memzoo.evaluations.registry.Score); None: the first score of its last long-range kind that has
    # one, else of the kind that ends its runs' training (lm: bpb_after_segment_0; capacity: recall_accuracy).
    scorecard: Optional[str] = None
    # Cluster settings for `--launcher slurm|submitit-local` (memzoo.suites.launchers.LauncherConfig):
    # partition, account, gpus_per_node, cpus_per_task, mem_gb, timeout_min, additional, setup, ...
    launcher: Any = field(default_factory=dict)
    # Optional sweep over run-config keys applied to every method, one run per combination
    # (e.g. {"train.lr": [0.001, 0.003], "model.d_model": [32, 64], "task.gap_segments": [1, 2]}).
    # Parameter counts are then compared within each model.d_model group.
    sweep: Any = field(default_factory=dict)


def load_suite(name_or_path: Optional[str] = "quick", overrides: Optional[list[str]] = None) -> DictConfig:
    """Schema <- suite YAML (memzoo/configs/suites/NAME.yaml or a path; `defaults: [other.yaml]` builds on
    another suite file: mappings merge, lists are replaced) <- key=value overrides."""
    schema = OmegaConf.structured(SuiteConfig)
    path = Path(name_or_path) if name_or_path else None
    if path is None or not path.is_file():
        path = preset_path(f"suites/{name_or_path or 'quick'}")
    layers: list[Any] = [load_yaml_chain(path)]
    plain, indexed = split_indexed(list(overrides or []))
    if plain:
        layers.append(parse_overrides(plain))
    suite = apply_indexed(merge_checked(schema, *layers, where="suite"), indexed, where="suite")
    if suite.jobs < 1:
        raise ConfigError(f"suite.jobs={suite.jobs}; expected >= 1")
    return suite
