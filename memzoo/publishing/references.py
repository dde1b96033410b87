"""Reference results shipped inside the package: the measured rows of the built-in methods in the
suites of SHIPPED_SUITES, so a new memory is compared without re-running them.

Each suite's rows live in `memzoo/references/SUITE.parquet`, one row per finished run exactly as the
suite's results table has it, plus `config_hash` (what the run trained and measured, folders aside:
`memzoo.training.curriculum.config_hash`) and `memzoo_version`. `memzoo/references/index.json`
records, per suite, the version, the seeds, the methods, the training hours and the device they were
spent on (GPU runs sharing one device each count their own), and when the rows were frozen.
A row is shipped only when its saved config hashes equal to the run the suite's current config
would make (`freeze` refuses the others, and a test holds every shipped row to it).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from memzoo.core.config import ConfigError
from memzoo.training.backbones import is_shipped
from memzoo.runs.configure import saved_run_config
from memzoo.training.curriculum import config_hash
from memzoo.conformance.catalog import rounding_sensitive
from memzoo.suites.compare import expand, load_suite
from memzoo.suites.expansion import RunSpec, grid_columns

# The window suites that fine-tune their own ceiling from a backbone that copies, each published with the same
# blocks (headroom table, segment 0 and ablation, bands, copying at distance) and figures: a new one is
# registered here, and only here.
CEILING_SUITES = ("lm-window-copy", "lm-window-rope", "lm-window-rope3", "lm-window-pairs", "lm-window-conv",
                  "lm-window-conv3", "lm-window-conv4", "lm-window-conv5", "lm-window-conv6")
SHIPPED_SUITES = ("lm-window", *CEILING_SUITES, "lm-stream", "lm-stream-sotu", "lm-stream-gpu", "quick", "capacity-top",
                  "distance")
INDEX = "index.json"
HOURS = "train_cpu_hours"  # the index's key: training hours of the shipped runs, every stage counted
DEVICE = "train_device"  # the index's key: the train.device the shipped runs were configured with


def memzoo_version() -> str:
    """The installed package's version (from its metadata: this layer does not import `memzoo` itself)."""
    from importlib import metadata

    try:
        return metadata.version("memzoo")
    except metadata.PackageNotFoundError:
        return "unknown"


def references_dir() -> Path:
    """The folder of the shipped tables (inside the installed package or the checkout)."""
    return Path(str(resources.files("memzoo") / "references"))


def load_index() -> dict[str, Any]:
    path = references_dir() / INDEX
    return json.loads(path.read_text()) if path.is_file() else {}


def load_references(suite: str) -> pd.DataFrame:
    """The shipped rows of one suite (an empty table when none are shipped)."""
    if suite not in SHIPPED_SUITES:
        raise ConfigError(f"no shipped references for suite {suite!r}; expected one of {SHIPPED_SUITES}")
    path = references_dir() / f"{suite}.parquet"
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


# Device measurements shipped as CSV rows, not suite runs: 'gpu-speed' (benchmarks/gpu/gpu.py) and 'cpu-cost'
# (benchmarks/speed/cpu_cost.py: one training window of every lm-window variant on the CPU, memzoo.suites.cpu_cost).
MEASURED = ("gpu-speed", "cpu-cost")


def rows_path(name: str) -> Path:
    """The shipped file of a suite's rows (NAME.parquet) or of a measurement (NAME.csv)."""
    return references_dir() / (f"{name}.csv" if name in MEASURED else f"{name}.parquet")


def load_measured(name: str) -> pd.DataFrame:
    """Shipped device measurements (memzoo/references/NAME.csv), e.g. 'gpu-speed': training tokens/s per
    method at the paper-gpu backbone, each with the ratio to `local` measured in the same call; 'cpu-cost':
    CPU seconds of one training window per variant of a suite, with its speed against `local` timed in
    the same rounds (an empty table while none are shipped)."""
    if name not in MEASURED:
        raise ConfigError(f"no shipped measurements {name!r}; expected one of {MEASURED}")
    path = rows_path(name)
    return pd.read_csv(path, keep_default_na=False) if path.is_file() else pd.DataFrame()


def load_rows(name: str) -> pd.DataFrame:
    """The shipped rows of a suite or a measurement (memzoo figures draws from either)."""
    return load_measured(name) if name in MEASURED else load_references(name)


def suite_specs(suite: str, methods: Optional[list[str]] = None) -> dict[str, RunSpec]:
    """Run name -> spec of every run the suite's current config makes (optionally for some methods)."""
    overrides = [f"methods=[{','.join(methods)}]"] if methods else None
    return {spec.name: spec for spec in expand(load_suite(suite, overrides))}


def suite_hashes(suite: str, methods: Optional[list[str]] = None) -> dict[str, str]:
    """Run name -> config hash of every run the suite's current config makes (optionally for some methods)."""
    return {name: config_hash(spec.cfg) for name, spec in suite_specs(suite, methods).items()}


def with_grid_columns(rows: pd.DataFrame, suite: str) -> pd.DataFrame:
    """Shipped rows with the grid columns the suite's current runs of their names have, where a row lacks
    one (a key added to a method's grid later, with null keeping these runs as they were)."""
    specs = suite_specs(suite, sorted(rows["method"].unique()))
    rows = rows.copy()
    for i, name in rows["name"].astype(str).items():
        for column, value in grid_columns(specs[name].grid if name in specs else {}).items():
            if column not in rows.columns:
                rows[column] = None
            if pd.isna(rows.at[i, column]):
                rows.at[i, column] = value
    return rows


@dataclass
class Frozen:
    rows: int
    refused: dict[str, str]  # run name -> why it was not shipped


def freeze(results: Path, suite: str, out_dir: Optional[Path] = None, add: bool = False) -> Frozen:
    """Ship the finished rows of `results` (a suite folder with results.parquet and runs/) whose saved
    configs match the suite's current runs; the others are listed with the reason.

    `add`: keep the rows already shipped and add these (more seeds or methods whose earlier runs'
    folders are gone); a run already shipped is refused, since its training hours cannot be taken
    out of the index's total: freeze the whole suite's folder to replace it."""
    table = pd.read_parquet(Path(results) / "results.parquet")
    expected = suite_hashes(suite, sorted(table["method"].unique()))
    out = Path(out_dir) if out_dir is not None else references_dir()
    index = json.loads((out / INDEX).read_text()) if (out / INDEX).is_file() else {}
    previous = pd.read_parquet(out / f"{suite}.parquet") if add and (out / f"{suite}.parquet").is_file() else None
    shipped_names = set() if previous is None else set(previous["name"].astype(str))
    keep, refused, hashes, devices = [], {}, [], set()
    for i, row in table.iterrows():
        name = str(row["name"])
        saved = Path(str(row["run_dir"])) / "config.yaml"
        if name not in expected:
            refused[name] = f"the suite {suite!r} makes no run of that name"
        elif name in shipped_names:
            refused[name] = "already shipped (--add only adds runs; freeze the whole suite's folder to replace one)"
        elif not saved.is_file():
            refused[name] = f"its config {saved} is missing"
        elif (h := config_hash(cfg := saved_run_config(saved))) != expected[name]:
            refused[name] = f"its config (hash {h}) differs from the suite's run (hash {expected[name]})"
        else:
            keep.append(i)
            hashes.append(h)
            devices.add(str(cfg.train.device))  # the config read once, for its hash and its device
    shipped = table.loc[keep].drop(columns=["run_dir"]).assign(config_hash=hashes, memzoo_version=memzoo_version())
    hours = training_hours([Path(str(table.loc[i, "run_dir"])) for i in keep])
    if previous is not None:
        previous = with_grid_columns(previous, suite)
        before = index.get(suite, {}).get(HOURS)
        devices |= {d for d in index.get(suite, {}).get(DEVICE, "").split(", ") if d}
        shipped = pd.concat([previous, shipped], ignore_index=True)
        hours = None if before is None or hours is None else round(before + hours, 2)
    out.mkdir(parents=True, exist_ok=True)
    shipped.to_parquet(out / f"{suite}.parquet", index=False)
    index[suite] = {
        "memzoo_version": memzoo_version(),
        "frozen": time.strftime("%Y-%m-%d"),
        "rows": len(shipped),
        "methods": sorted(shipped["method"].unique().tolist()),
        "seeds": sorted(int(s) for s in shipped["seed"].unique()),
        HOURS: hours,
        DEVICE: ", ".join(sorted(devices)),
    }
    marked = rounding_sensitive(shipped["method"].unique().tolist())
    if marked:  # methods whose result rounding decides (their cards say by how much)
        index[suite]["rounding_sensitive"] = marked
    (out / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return Frozen(len(shipped), refused)


def hours_label(meta: dict[str, Any]) -> str:
    """'N training hours' for an index entry, naming the device where it is not the CPU: runs sharing
    one GPU each count their own wall time, so GPU hours are process hours, not the GPU's."""
    device = meta.get(DEVICE, "cpu")
    if device == "cpu":
        return f"{meta[HOURS]} training hours"
    if "cuda" in device:
        return f"{meta[HOURS]} training hours on {device} (process hours: runs sharing one GPU each count their own)"
    return f"{meta[HOURS]} training hours (train.device {device})"


def training_hours(run_dirs: list[Path]) -> Optional[float]:
    """Training hours of the shipped runs, each with every stage it started from (its `task.init_from`
    chain: pretraining, curriculum stages), as training tokens over training throughput summed: the
    wall hours of one job each. None when a stage's result lacks them."""
    seconds, seen = 0.0, set()
    for run_dir in run_dirs:
        stage: Optional[Path] = Path(run_dir)
        while stage is not None and stage.resolve() not in seen:
            seen.add(stage.resolve())
            try:
                result = json.loads((stage / "result.json").read_text())
                seconds += float(result["train_tokens"]) / float(result["train_tokens_per_s"])
            except (FileNotFoundError, KeyError, TypeError, ValueError, ZeroDivisionError):
                return None
            parent = saved_run_config(stage / "config.yaml").task.init_from
            # a backbone shipped inside the package ends the chain: its cost is stated with it (memzoo/backbones)
            stage = Path(str(parent)) if parent and not is_shipped(parent) else None
    return round(seconds / 3600, 2)


def stale_rows(suite: str) -> dict[str, str]:
    """Shipped rows whose config no longer matches the run the suite's current config makes."""
    rows = load_references(suite)
    if rows.empty:
        return {}
    expected = suite_hashes(suite, sorted(rows["method"].unique()))
    return {str(r.name): ("no such run in the suite" if r.name not in expected
                          else f"shipped {r.config_hash}, suite {expected[r.name]}")
            for r in rows.itertuples() if expected.get(r.name) != r.config_hash}
