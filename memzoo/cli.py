"""The `memzoo` command: train, eval, compare, report, list, footprint, check, passkey, recall, distance,
babilong, babilong-generate, generate, references, scorecard, figures."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from memzoo.commands import (cmd_list, cmd_train, cmd_backbone, cmd_footprint, cmd_check, cmd_compare, cmd_report,
                             cmd_references, cmd_figures, cmd_scorecard, cmd_evaluation, cmd_babilong_generate, cmd_generate)
from memzoo.core.config import ConfigError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memzoo", description="A zoo of memory-augmented transformers on one backbone.")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="import a plugin first (a .py file or a module; repeatable): the memories and evaluation "
                        "kinds it registers get their commands (installed packages: the memzoo.evaluations entry point)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="the catalogue of methods")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("train", help="train and evaluate one run: memzoo train CONFIG [key=value ...]")
    s.add_argument("config", help="a YAML file or a shipped preset name (e.g. infini-linear)")
    s.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.steps=100")
    s.add_argument("--restart", action="store_true", help="ignore an existing checkpoint in the run folder")
    s.set_defaults(fn=cmd_train)

    s = sub.add_parser("backbone", help="train a backbone from a config and ship it: memzoo backbone CONFIG NAME [key=value ...]")
    s.add_argument("config", help="a YAML file or a shipped config (e.g. backbones/copy-stdlib)")
    s.add_argument("name", help="the shipped name: fine-tune from it with task.init_from=backbone:NAME")
    s.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.steps=100")
    s.add_argument("--dest", default=None, help="where to ship it (default: the package's memzoo/backbones)")
    s.add_argument("--restart", action="store_true", help="ignore an existing checkpoint in the run folder")
    s.add_argument("--distances", type=int, nargs="+", default=[32, 128, 512, 1024, 2048, 4000],
                   help="copy probe distances in bytes (those within the training reads are probed)")
    s.add_argument("--probe-rows", type=int, default=16, help="probe rows per distance and kind of chunk")
    s.add_argument("--chunk-len", type=int, default=32, help="bytes of the probe's chunk (at most the shortest distance)")
    s.set_defaults(fn=cmd_backbone)

    s = sub.add_parser("compare", help="run a comparison suite: memzoo compare [SUITE] [key=value ...]")
    s.add_argument("suite", nargs="?", default=None, help="a suite YAML or a shipped suite (quick, paper-gpu); default quick")
    s.add_argument("overrides", nargs="*", help="suite overrides, e.g. seeds=[0,1] token_budget=100000")
    s.add_argument("--jobs", type=int, default=None, help="worker processes (default: the suite's `jobs`)")
    s.add_argument("--no-report", action="store_true", help="do not write report.html/report.md at the end")
    s.add_argument("--launcher", default="local", choices=["local", "submitit-local", "slurm"],
                   help="local worker processes (default), or one submitit job per run: SLURM, or submitit's "
                        "local executor (settings: the suite's launcher: section, launcher.KEY=VALUE)")
    s.add_argument("--no-wait", action="store_true", help="submit the jobs and return (then --collect, or re-run to wait)")
    s.add_argument("--collect", action="store_true", help="build results.parquet and the report from the runs finished so far")
    s.set_defaults(fn=cmd_compare)

    s = sub.add_parser("report", help="report.html and report.md from a results folder")
    s.add_argument("results_dir")
    s.set_defaults(fn=cmd_report)

    from memzoo.evaluations.babilong import add_story_options
    from memzoo.evaluations.registry import evaluations, names

    for evaluation in evaluations().values():  # one command per registered evaluation
        if evaluation.command is not None:
            s = sub.add_parser(evaluation.command.name or evaluation.name, help=evaluation.command.help)
            evaluation.command.add_arguments(s)
            _device_option(s)
            s.set_defaults(fn=cmd_evaluation, evaluation=evaluation.name)

    s = sub.add_parser("babilong-generate", help="write generated BABILong-style samples: OUT_DIR/LENGTH/TASK.jsonl")
    s.add_argument("out_dir")
    s.add_argument("--tasks", type=names("--tasks"), default=["qa1"], help="comma-separated, of qa1,qa2,qa3")
    s.add_argument("--lengths", type=names("--lengths"), default=["0k", "1k", "4k"],
                   help="input bytes, comma-separated: 0k (facts only), 512, 1k, 4k, 1M")
    s.add_argument("--samples", type=int, default=100, help="samples per (task, length)")
    s.add_argument("--split", choices=["train", "test"], default="test")
    add_story_options(s)
    s.set_defaults(fn=cmd_babilong_generate)

    s = sub.add_parser("generate", help="continue a prompt with a trained run (memory is read inside every segment)")
    s.add_argument("run_dir")
    s.add_argument("--prompt", default="", help="prompt text")
    s.add_argument("--prompt-file", default=None, help="read the prompt bytes from a file (e.g. a long document)")
    s.add_argument("--max-new-tokens", type=int, default=200)
    s.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    s.add_argument("--seed", type=int, default=0)
    _device_option(s)
    s.set_defaults(fn=cmd_generate)

    s = sub.add_parser("references", help="the shipped reference rows of the built-in methods (memzoo.publishing.references.SHIPPED_SUITES)")
    s.add_argument("suite", nargs="?", default=None, help="one suite's rows in full (default: a summary of all)")
    s.add_argument("--freeze", metavar="RESULTS_DIR", default=None,
                   help="(maintainers) ship the rows of a finished suite folder whose configs match the suite")
    s.add_argument("--add", action="store_true",
                   help="with --freeze: keep the rows already shipped and add the folder's new runs")
    s.set_defaults(fn=cmd_references)

    s = sub.add_parser("figures", help="redraw every results table (README, docs/) and figure from the shipped rows")
    s.add_argument("--root", default=".", help="the checkout whose README.md and docs/ to rewrite (default .)")
    s.add_argument("--check", action="store_true", help="write nothing; list what is stale, exit status 1 if any")
    s.add_argument("--no-figures", action="store_true", help="the tables only (no matplotlib)")
    s.set_defaults(fn=cmd_figures)

    s = sub.add_parser("scorecard", help="a plugin's memories through the reference suites, ranked beside the shipped rows")
    s.add_argument("plugin", help="a .py file, a module (my_pkg.decay) or an installed entry point's name")
    s.add_argument("overrides", nargs="*", help="suite overrides (smoke runs only: the rows are then not comparable)")
    s.add_argument("--suites", default="lm-stream,capacity-top,distance",
                   help="comma-separated shipped suites (`memzoo references` lists them): lm-window-conv6 (the "
                        "README's headline) and the other window suites, lm-stream, lm-stream-sotu, lm-stream-gpu (needs "
                        "CUDA), quick (the smoke comparison), capacity-top, distance "
                        "(default: lm-stream, capacity-top, distance)")
    s.add_argument("--seeds", type=int, default=None, help="the first N of each suite's seeds (default all)")
    s.add_argument("--out", default="scorecard", help="folder for the runs, the reports and scorecard.md")
    s.add_argument("--jobs", type=int, default=None, help="worker processes (default: each suite's `jobs`)")
    s.add_argument("--launcher", default="local", choices=["local", "submitit-local", "slurm"])
    s.add_argument("--no-figures", action="store_true", help="the reports' tables without their figures")
    s.set_defaults(fn=cmd_scorecard)

    s = sub.add_parser("check", help="run every invariant on the memories a plugin registers: memzoo check PLUGIN")
    s.add_argument("plugin", help="a module path (mypkg.mymemory), a .py file, or an installed memzoo.memories entry point")
    s.add_argument("--options", nargs="*", default=[], metavar="KEY=VALUE",
                   help="memory options for every memory checked (over the in-tree methods' tiny defaults)")
    s.add_argument("--options-json", default=None, help="memory options as one JSON object (--options win)")
    s.add_argument("--only", type=lambda t: [x for x in t.split(",") if x], default=None,
                   help="comma-separated invariants to run (default: all)")
    s.add_argument("--json", action="store_true", help="print the results as a JSON list")
    s.add_argument("--device", default=None, metavar="DEVICE",
                   help="also run each memory on DEVICE (cuda, cuda:N, cpu) against the float64 CPU oracle in fp32, tf32 "
                        "and bf16: logits, state and every gradient (memzoo.conformance.device)")
    s.set_defaults(fn=cmd_check)

    s = sub.add_parser("footprint", help="state size per method: analytic, card formula, measured")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--json", action="store_true")
    s.add_argument("--no-measure", action="store_true", help="skip building models to measure real states")
    s.set_defaults(fn=cmd_footprint)
    return p


def _device_option(s: argparse.ArgumentParser) -> None:
    """--device of every evaluation command (memzoo.runs.checkpoints.eval_device)."""
    s.add_argument("--device", default=None, help="where to evaluate: cpu, cuda, cuda:INDEX, auto (default: the run's train.device)")


def take_imports(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the modules or .py files named by `--import X` before the command, the arguments without them)."""
    imports, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--import" and i + 1 < len(argv):
            imports.append(argv[i + 1])
            i += 2
        elif argv[i].startswith("--import="):
            imports.append(argv[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(argv[i])
            i += 1
    return imports, rest


def main(argv: Optional[list[str]] = None) -> int:
    from memzoo.core.plugins import UnknownMethodError
    from memzoo.runs.checkpoints import CheckpointError
    from memzoo.runs.disk import DiskFullError, disk_full, is_disk_full
    from memzoo.runs.lock import RunLockedError
    from memzoo.suites.suite_plugins import import_plugins

    imports, argv = take_imports(list(sys.argv[1:] if argv is None else argv))
    try:
        import_plugins(imports)  # first: a memory or evaluation kind they register gets its command
    except ConfigError as err:
        print(f"memzoo: error: {err}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow flags (`footprint CFG --json a=b`): gather them here.
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    try:
        return args.fn(args)
    except (ConfigError, UnknownMethodError, FileNotFoundError, CheckpointError, DiskFullError, RunLockedError) as err:
        msg = str(err).splitlines()[0]
        print(f"memzoo: error: {msg}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as err:  # a full disk met by a write memzoo does not name (a report, a figure)
        if not is_disk_full(err):
            raise
        name = getattr(err, "filename", None)
        folder, what = (Path(name).parent, f"a file ({Path(name).name})") if name else (Path.cwd(), "a file")
        print(f"memzoo: error: {disk_full(folder, what)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memzoo: interrupted; the run folder keeps its last checkpoint (run the same command to resume)", file=sys.stderr)
        return 130


def command() -> int:
    """The `memzoo` command as installed: `main`, with SIGTERM stopping it as Ctrl-C does (a suite's
    workers are told too), so a `kill` or a scheduler's stop keeps checkpoints and releases locks."""
    from memzoo.core.interrupt import raise_on_sigterm

    raise_on_sigterm()
    return main()


if __name__ == "__main__":
    sys.exit(command())

