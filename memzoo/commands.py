"""What each `memzoo` command does, one function per command (memzoo.cli builds the parser and
dispatches to these): each takes the parsed arguments and returns the exit status."""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from memzoo.core.config import ConfigError


def _print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))


def cmd_list(args: argparse.Namespace) -> int:
    from memzoo.conformance.catalog import catalogue

    rows = catalogue()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        r["implemented"] = "yes" if r["implemented"] else "no"
    _print_table(rows, ["name", "implemented", "family", "footprint_formula", "effective_context"])
    print()
    for r in rows:
        print(f"{r['name']}: {r['paper']}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from memzoo.runs.configure import load_config
    from memzoo.runs.distributed import env_info
    from memzoo.evaluations.lm import print_summary
    from memzoo.training.train import train

    cfg = load_config(args.config, args.overrides)
    run_dir = train(cfg, resume=not args.restart)
    if not env_info().is_main:  # under torchrun only rank 0 writes (and reports) the run
        return 0
    result = json.loads((run_dir / "result.json").read_text())
    print(f"run folder: {run_dir}")
    print_summary(result)
    return 0


def cmd_backbone(args: argparse.Namespace) -> int:
    """Train a backbone from a config, ship it under NAME with its card, and probe its copying by distance."""
    from memzoo.training.make_backbone import make_backbone
    from memzoo.training.backbones import card_cost

    card = make_backbone(args.config, args.name, args.overrides, args.dest, not args.restart, args.distances,
                         args.probe_rows, args.chunk_len)
    print(f"shipped backbone:{args.name} ({card_cost(card)})")
    for r in card["copy_probe"]:
        print(f"  copy {r['kind']:6s} at {r['distance']:5d} bytes: first {r['first_bits']:.2f}, "
              f"second {r['second_bits']:.2f} bits per byte")
    return 0


def cmd_footprint(args: argparse.Namespace) -> int:
    from memzoo.runs.configure import load_config
    from memzoo.conformance.footprint import footprint_table

    cfg = load_config(args.config, args.overrides)
    rows = footprint_table(cfg, measure=not args.no_measure)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        for k in ("analytic", "card", "measured"):
            if isinstance(r.get(k), int):
                r[k] = f"{r[k]:,}"
        r["compression"] = f"{r['compression']}x" if r.get("compression") else ""
    _print_table(rows, ["method", "analytic", "card", "measured", "compression", "footprint_formula"])
    return 0


def _option_value(text: str) -> object:
    """A --options value as YAML reads it (8 -> int, 0.5 -> float, true -> bool, kv -> str)."""
    import yaml

    return yaml.safe_load(text)


def cmd_check(args: argparse.Namespace) -> int:
    from memzoo.conformance.check import device_checks, plugin_memories, run_checks
    from memzoo.conformance.invariants import INVARIANTS

    options: dict = {}
    if args.options_json:
        try:
            options = json.loads(args.options_json)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--options-json is not JSON: {err}") from None
        if not isinstance(options, dict):
            raise ConfigError("--options-json must be a JSON object of memory options")
    for item in args.options:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--options expects key=value, got {item!r}")
        options[key] = _option_value(value)
    unknown = sorted(set(args.only or []) - set(INVARIANTS))
    if unknown:
        raise ConfigError(f"--only: unknown invariant(s) {unknown}; known: {', '.join(INVARIANTS)}")
    names = plugin_memories(args.plugin)
    results, width = [], max(len(n) for n in names)
    checks = run_checks(names, options, args.only)
    if args.device:
        checks = itertools.chain(checks, device_checks(names, args.device, options))
    for r in checks:
        results.append(r)
        if not args.json:
            line = f"{r.memory:{width}s}  {r.invariant:16s}  {r.status}"
            print(line + (f"  {r.message}" if r.message else ""), flush=True)
    failed = [r for r in results if r.status == "FAIL"]
    if args.json:
        print(json.dumps([vars(r) for r in results], indent=1))
    else:
        counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
        print(f"{len(names)} memor{'y' if len(names) == 1 else 'ies'}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if failed else 0


def cmd_compare(args: argparse.Namespace) -> int:
    from memzoo.suites.compare import collect_suite, load_suite, run_suite, suite_dir
    from memzoo.publishing.sections import console_table

    suite_name, overrides = args.suite, list(args.overrides)
    if suite_name and "=" in suite_name:  # `memzoo compare key=value` runs the default suite
        suite_name, overrides = None, [suite_name, *overrides]
    suite = load_suite(suite_name or "quick", overrides)
    if args.collect:
        df = collect_suite(suite)
    else:
        launcher = None if args.launcher == "local" else args.launcher  # None: local worker processes
        df = run_suite(suite, jobs=args.jobs, launcher=launcher, wait=not args.no_wait)
    root = suite_dir(suite)
    if df.empty:
        print(f"no finished run yet in {root}; jobs.json lists the submitted jobs")
        return 0
    print(console_table(df).to_string(index=False))
    print(f"results: {root / 'results.parquet'}")
    if not args.no_report:
        from memzoo.publishing.report import write_report

        md, html_path = write_report(root)
        print(f"report: {html_path} and {md}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from memzoo.publishing.report import write_report

    md, html_path = write_report(args.results_dir)
    print(f"report: {html_path} and {md}")
    return 0


def cmd_references(args: argparse.Namespace) -> int:
    from memzoo.publishing.references import SHIPPED_SUITES, freeze, hours_label, load_index, load_references

    if args.freeze:
        if not args.suite:
            raise ConfigError(f"--freeze needs the suite the results belong to, one of {SHIPPED_SUITES}")
        frozen = freeze(Path(args.freeze), args.suite, add=args.add)
        print(f"shipped {frozen.rows} rows of {args.suite}")
        for name, why in frozen.refused.items():
            print(f"  not shipped: {name}: {why}")
        return 0
    index = load_index()
    for suite in [args.suite] if args.suite else SHIPPED_SUITES:
        meta = index.get(suite)
        if meta is None:
            print(f"{suite}: no shipped rows")
            continue
        rows = load_references(suite)
        print(f"{suite}: {meta['rows']} rows, seeds {meta['seeds']}, memzoo {meta['memzoo_version']}, frozen "
              f"{meta['frozen']}, {hours_label(meta)}; methods: {', '.join(meta['methods'])}")
        if args.suite:
            print(rows.drop(columns=[c for c in rows.columns if rows[c].map(lambda v: hasattr(v, "__len__") and not isinstance(v, str)).any()]).to_string(index=False))
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    from memzoo.publishing.figures import draw_figures, stale_figures, stale_pages

    root = Path(args.root)
    if not (root / "README.md").is_file() or not (root / "docs").is_dir():
        raise ConfigError(f"--root {root}: expected a memzoo checkout (README.md and docs/)")
    pages = stale_pages(root, write=not args.check)
    figures = {} if args.no_figures else stale_figures(root / "docs")
    if args.check:
        for page in pages:
            print(f"stale tables: {page.relative_to(root)}")
        for rel, why in figures.items():
            print(f"stale figure: docs/{rel}: {why}")
        return 1 if pages or figures else 0
    drawn = [] if args.no_figures else draw_figures(root / "docs")
    print(f"tables rewritten in {len(pages)} page(s); {len(drawn)} figure(s) drawn from the shipped rows")
    return 0


def cmd_scorecard(args: argparse.Namespace) -> int:
    from memzoo.suites.compare import plugin_methods
    from memzoo.publishing.scorecard import scorecard

    methods, imports = plugin_methods(args.plugin)
    suites = [s for s in args.suites.split(",") if s]
    launcher = None if args.launcher == "local" else args.launcher
    path, _ = scorecard(methods, imports, suites, Path(args.out), seeds=args.seeds, jobs=args.jobs,
                        launcher=launcher, overrides=list(args.overrides), figures=not args.no_figures)
    print(path.read_text())
    print(f"scorecard: {path}")
    return 0


def _evaluation_device(args: argparse.Namespace) -> str:
    """Where an evaluation command runs, said in one line on stderr: --device, else the run's train.device
    (a run trained on CUDA falls back to the CPU on a machine without one; a --device cuda there is an
    error). A --device choice reaches the model's loading, and the worker processes of an isolated
    evaluation, through the environment."""
    import os

    from memzoo.runs.checkpoints import EVAL_DEVICE_ENV, eval_device, run_config

    device, why = eval_device(run_config(args.run_dir), args.device)
    if args.device:
        os.environ[EVAL_DEVICE_ENV] = args.device
    print(f"memzoo {args.command}: evaluating on {device} ({why})", file=sys.stderr)
    return str(device)


def cmd_evaluation(args: argparse.Namespace) -> int:
    """A registered evaluation's command (memzoo.evaluations.registry): its config from the arguments,
    its rows measured (or read back from the run folder) and shown."""
    from memzoo.evaluations.registry import get_evaluation

    evaluation = get_evaluation(args.evaluation)
    command = evaluation.command
    _evaluation_device(args)
    try:
        cfg = evaluation.config(**{"task": evaluation.name, **command.options(args)})
    except ValueError as err:  # the config's own check: one line naming the bad value
        raise ConfigError(str(err)) from None
    rows = evaluation.run(args.run_dir, cfg, resume=not getattr(args, "recompute", False), progress=not args.json)
    if command.print_rows is not None:
        command.print_rows(args, rows)
    elif args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print_table([command.show(r) for r in rows], command.columns)
        print(f"rows kept in {Path(args.run_dir) / command.kept} and result.json")
    return 0


def cmd_babilong_generate(args: argparse.Namespace) -> int:
    from memzoo.data.babi_stories import StorySettings, write_generated

    settings = StorySettings(tuple(args.facts) if args.facts else None, tuple(args.depth), args.background, args.seed)
    paths = write_generated(Path(args.out_dir), args.tasks, args.lengths, args.samples, args.split, settings)
    print(f"wrote {len(paths)} files of {args.samples} samples ({args.split} split) under {args.out_dir}; "
          f"evaluate with: memzoo babilong RUN_DIR --data {args.out_dir} --tasks {','.join(args.tasks)} "
          f"--lengths {','.join(args.lengths)}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from memzoo.data.tasks import bytes_to_tensor
    from memzoo.runs.checkpoints import load_trained
    from memzoo.evaluations.generate import StreamingDecoder

    prompt = Path(args.prompt_file).read_bytes() if args.prompt_file else args.prompt.encode()
    if not prompt:
        raise ConfigError("the prompt is empty; give --prompt TEXT or --prompt-file FILE")
    _evaluation_device(args)
    cfg, model = load_trained(args.run_dir)
    decoder = StreamingDecoder(model, 1, precision=cfg.train.precision)
    decoder.feed(bytes_to_tensor(prompt)[None].to(next(model.parameters()).device))
    gen = torch.Generator().manual_seed(args.seed)
    new = decoder.generate(args.max_new_tokens, temperature=args.temperature, generator=gen, feed_last=False)
    sys.stdout.write(bytes(new[0].tolist()).decode("utf-8", errors="replace") + "\n")
    return 0
