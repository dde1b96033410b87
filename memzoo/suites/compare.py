"""Comparison suites: one config names the methods, the shared backbone and data, seeds, an optional
grid of memory options and one token budget; `run_suite` trains and evaluates every run in worker
processes and keeps `results.parquet` (one row per finished run) up to date.

Resumable by construction: a run with a `result.json` is finished and skipped; an unfinished run
resumes from its checkpoint; the table is rewritten atomically from the finished runs' rows after
each run, so a killed suite loses no finished result and never leaves a half-written row.

This module gathers the suite's parts under one name, each in its own module by job: the schema
(suite_config), plugin discovery (suite_plugins), run expansion (expansion), the long-range stages
(stages; the evaluations themselves are memzoo.evaluations.registry' registry), the parameter check
(params), the results table (table), and running with its progress (runner, progress).
"""
from __future__ import annotations

from memzoo.evaluations.registry import evaluation_config, run_evaluation
from memzoo.suites.expansion import RunSpec, backbone_name, backbone_specs, expand, suite_dir, sweep_points
from memzoo.suites.params import check_parameter_spread, check_parameter_spread_by_width, parameter_counts
from memzoo.suites.progress import SuiteProgress
from memzoo.suites.runner import collect_suite, run_suite, worker, worker_args
from memzoo.suites.stages import is_finished, longrange_configs, stages_signature
from memzoo.suites.suite_config import SuiteConfig, load_suite
from memzoo.suites.suite_plugins import import_plugins, plugin_methods, suite_methods
from memzoo.suites.results import result_row, write_table

__all__ = ["RunSpec", "SuiteConfig", "SuiteProgress", "backbone_name", "backbone_specs", "check_parameter_spread",
           "check_parameter_spread_by_width", "collect_suite", "evaluation_config", "expand", "import_plugins",
           "is_finished", "load_suite", "longrange_configs", "parameter_counts", "plugin_methods", "result_row",
           "run_evaluation", "run_suite", "stages_signature", "suite_dir", "suite_methods", "sweep_points", "worker",
           "worker_args", "write_table"]
