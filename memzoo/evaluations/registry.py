"""The evaluation registry: every kind of evaluation a trained run can get registers itself once,
with its options (a dataclass), its run function, how its rows become columns of a suite's results
table, and its `memzoo` command. A suite's `longrange:` entries, the results table and the CLI all
read this registry, so a new evaluation is one module that calls `register_evaluation` plus its
name in BUILT_IN (outside memzoo: a suite's `imports:`, `memzoo --import FILE`, or an installed
package's `memzoo.evaluations` entry point); its report section and figure come with its registration.
docs/evaluations.md shows how.
"""
from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Optional

from memzoo.core.config import ConfigError

# The modules of memzoo's own evaluations, imported on first use of the registry (the registry line).
BUILT_IN = ("memzoo.evaluations.lm", "memzoo.evaluations.longrange", "memzoo.evaluations.distance", "memzoo.evaluations.babilong",
            "memzoo.evaluations.copy_distance",
            "memzoo.evaluations.capacity")

Row = dict[str, Any]


@dataclass(frozen=True)
class Command:
    """An evaluation's `memzoo NAME RUN_DIR ...` command: its arguments, the config options they give,
    and how its rows are printed (a table; `--json` prints them as they are)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    options: Callable[[argparse.Namespace], dict[str, Any]]  # the config's options from the parsed arguments
    show: Callable[[Row], dict[str, Any]]  # one row as printed
    columns: list[str]  # the printed columns, in order
    kept: str  # the file in the run folder that keeps the rows ("" when only result.json does)
    print_rows: Optional[Callable[[argparse.Namespace, list[Row]], None]] = None  # instead of the table or JSON
    name: str = ""  # the command's name when it is not the evaluation's


@dataclass(frozen=True)
class Figure:
    """An evaluation's figure in a suite's report: `draw(results) -> matplotlib Figure` (None when the
    table holds nothing to draw), saved as NAME.png under `caption`."""

    caption: str
    draw: Callable[[Any], Any]


@dataclass(frozen=True)
class Score:
    """A metric a scorecard ranks a suite's runs by: its name (the column it fills), which way is
    better, and how a result row gives it (None: the row's column `name` as it is)."""

    name: str
    higher_is_better: bool
    of_row: Optional[Callable[[Any], float]] = None  # a result row (a pandas Series) -> the value


@dataclass(frozen=True)
class Evaluation:
    """One kind of evaluation. `run(run_dir, cfg, resume=True, progress=True)` measures a trained run
    folder, keeps its rows there (and under `name` in result.json) and returns them; `columns(row)`
    turns a result.json row's entry of this kind into table columns in place (default: the rows as
    one JSON column `NAME_json`, which memzoo.analysis reads back)."""

    name: str  # the kind: a suite `longrange:` entry's `task:` and the key of its rows in result.json
    config: type  # its options, a dataclass whose `task` field is `name`
    run: Callable[..., list[Row]]
    command: Optional[Command] = None
    columns: Optional[Callable[[Row], None]] = None
    in_suite: bool = True  # whether a suite's `longrange:` list may name it (lm runs at the end of training)
    # Its part of a suite's report, from the suite's results DataFrame: `section(results) -> [(heading,
    # table), ...]` (None: one generic section of its rows per run; a table's numbers are formatted per
    # column, its strings kept as they are) and its figure (None: no figure).
    section: Optional[Callable[[Any], list[tuple[str, Any]]]] = None
    figure: Optional[Figure] = None
    # The evaluation that ends training, for the runs `ends_training(cfg)` is true of: `finish(run_dir,
    # cfg, model, progress) -> the run's result.json row`. Training asks the registry (end_of_training),
    # so a task scored by something other than bits per byte needs no branch in the training loop.
    ends_training: Optional[Callable[[Any], bool]] = None
    finish: Optional[Callable[..., Row]] = None
    # What a scorecard ranks a suite that runs this kind by (the first, unless the suite's `scorecard`
    # names another); a kind without scores leaves a suite to the kinds before it (memzoo.publishing.scorecard).
    scores: tuple[Score, ...] = ()
    # The rest of its report part: `notes(results) -> [str]`, what its columns mean; `summary(results) ->
    # table`, what `memzoo compare` prints when a suite of its rows ends; `holds(results)`, whether a
    # results table holds its rows (None: the table has its column NAME_json); `replaces`, the kinds whose
    # part it takes the place of where both hold rows (distance runs are capacity runs, reported by distance).
    notes: Optional[Callable[[Any], list[str]]] = None
    summary: Optional[Callable[[Any], Any]] = None
    holds: Optional[Callable[[Any], bool]] = None
    replaces: tuple[str, ...] = ()
    module: str = field(default="", compare=False)

    def in_results(self, results: Any) -> bool:
        """Whether a suite's results table (a DataFrame) holds rows of this kind."""
        return self.holds(results) if self.holds is not None else f"{self.name}_json" in results.columns

    def table_columns(self, row: Row) -> None:
        """This kind's entry of a result.json row as table columns (in place)."""
        if self.columns is not None:
            self.columns(row)
        elif self.name in row:
            row[f"{self.name}_json"] = json.dumps(row.pop(self.name))


_REGISTRY: dict[str, Evaluation] = {}


def register_evaluation(evaluation: Evaluation) -> Evaluation:
    """Add a kind to the registry (at its module's import); a name another module registered is an error."""
    module = evaluation.module or getattr(evaluation.run, "__module__", "")
    known = _REGISTRY.get(evaluation.name)
    if known is not None and known.module != module:
        raise ConfigError(f"evaluation {evaluation.name!r} is registered twice: by {known.module} and by {module}")
    _REGISTRY[evaluation.name] = replace(evaluation, module=module)
    return _REGISTRY[evaluation.name]


def unregister_evaluation(name: str) -> None:
    """Remove a kind (tests and notebooks that register a throwaway one)."""
    _REGISTRY.pop(name, None)


ENTRY_POINT_GROUP = "memzoo.evaluations"  # installed packages declare their kinds' modules here
_LOADED_ENTRY_POINTS: list[bool] = []


def load_entry_points(again: bool = False) -> None:
    """Import every module an installed package declares under ENTRY_POINT_GROUP (once per process, or
    `again`), so its kinds register, their commands included; one that fails to import is an error naming it."""
    if _LOADED_ENTRY_POINTS and not again:
        return
    from importlib import metadata

    _LOADED_ENTRY_POINTS.append(True)
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            point.load()
        except Exception as err:  # a broken plugin package: say which, do not hide it
            raise ConfigError(f"the {ENTRY_POINT_GROUP} entry point {point.name!r} ({point.value}) failed to import: "
                              f"{type(err).__name__}: {err}") from err


def evaluations() -> dict[str, Evaluation]:
    """Every registered kind by name (memzoo's own first, in BUILT_IN's order, then installed packages'
    and notebooks' in the order they registered)."""
    for module in BUILT_IN:
        importlib.import_module(module)
    load_entry_points()
    rank = {module: i for i, module in enumerate(BUILT_IN)}  # stable: then in the order they registered
    return dict(sorted(_REGISTRY.items(), key=lambda item: rank.get(item[1].module, len(rank))))


def reported(results: Any) -> dict[str, Evaluation]:
    """The kinds a suite's report shows for its results table: those whose rows it holds, in the
    registry's order, less any that another of them replaces."""
    held = {name: e for name, e in evaluations().items() if e.in_results(results)}
    replaced = {name for e in held.values() for name in e.replaces}
    return {name: e for name, e in held.items() if name not in replaced}


DEFAULT_KIND = "lm"  # ends the training of every run no other kind claims (end_of_training)


def end_of_training(cfg: Any) -> Evaluation:
    """The kind that evaluates a run when its training ends: the one whose `ends_training(cfg)` holds
    (capacity for recall across segments), else `lm`, which claims every other run."""
    known = evaluations()
    claims = [e for e in known.values() if e.finish is not None and e.ends_training is not None and e.ends_training(cfg)]
    if len(claims) > 1:
        raise ConfigError(f"kinds {[e.name for e in claims]} all claim to end this run's training; one must")
    return claims[0] if claims else known[DEFAULT_KIND]


def get_evaluation(name: str) -> Evaluation:
    """The kind registered as `name`; an unknown name is an error listing the registered ones."""
    known = evaluations()
    if name not in known:
        raise ConfigError(f"evaluation task={name!r} is not registered; registered: {', '.join(known)}")
    return known[name]


def evaluation_config(options: dict[str, Any]) -> Any:
    """One `longrange:` entry (or a command's options) as its kind's config: `task` names the kind
    (default passkey); the config's own ValueError or TypeError names a bad option. `threads`, which
    a suite's runner sets for every entry, reaches only the configs that have it."""
    name = options.get("task", "passkey")
    evaluation = get_evaluation(name)
    if not evaluation.in_suite:
        raise ConfigError(f"task={name!r} runs at the end of training, not as a long-range stage")
    if "threads" in options and "threads" not in {f.name for f in fields(evaluation.config)}:
        options = {k: v for k, v in options.items() if k != "threads"}
    return evaluation.config(**options)


def run_evaluation(run_dir: Path, options: dict[str, Any]) -> list[Row]:
    """One `longrange:` entry on a trained run, resuming what it already measured."""
    cfg = evaluation_config(options)
    return get_evaluation(cfg.task).run(run_dir, cfg, resume=True, progress=False)


def table_columns(row: Row) -> Row:
    """A result.json row with every kind's entry turned into its table columns."""
    for evaluation in evaluations().values():
        evaluation.table_columns(row)
    return row


def numbers(kind: type, what: str) -> Callable[[str], list]:
    """An argparse type: comma-separated numbers of `kind`."""
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: expected comma-separated numbers, got {text!r}") from None
    return parse


def names(what: str) -> Callable[[str], list[str]]:
    """An argparse type: a non-empty comma-separated list of names."""
    def parse(text: str) -> list[str]:
        found = [x.strip() for x in text.split(",") if x.strip()]
        if not found:
            raise argparse.ArgumentTypeError(f"{what}: expected comma-separated names, got {text!r}")
        return found
    return parse


def fmt(value: Any, spec: str) -> str:
    """A printed cell: empty for None."""
    return "" if value is None else format(value, spec)


def add_stream_options(s: argparse.ArgumentParser, segments_per_call: int, time_limit: str) -> None:
    """The options every streamed evaluation (passkey, recall, distance) shares."""
    s.add_argument("--seed", type=int, default=0, help="the examples' seed (the same examples for every run)")
    s.add_argument("--segments-per-call", type=int, default=segments_per_call, help="segments per model call while streaming")
    s.add_argument("--time-limit", type=float, default=900.0, help=time_limit)
    s.add_argument("--memory-limit-mb", type=float, default=None, help="resident MB before 'out of budget' (default 60%% of RAM)")
    s.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    s.add_argument("--recompute", action="store_true", help="measure again what the run folder already holds")
    s.add_argument("--json", action="store_true", help="print the rows as a JSON list")
