"""A bits-per-byte suite against training steps: every run's evaluations by step (evals.jsonl and
result.json), the last step every run reached (where a suite cut off by a lease compares alike), and
the paired differences from `local` and headroom recovered as Markdown tables
(experiments/lm-stream/curve.py prints and writes them)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from memzoo.publishing.tables import markdown

RANGES = {"segment 0": (0, 0), "segments 1-7": (1, 7), "segments 8-31": (8, 31), "segments >= 1": (1, None),
          "segments 28-31": (28, 31)}


def curve_rows(folder: Path) -> pd.DataFrame:
    """One row per (run, evaluated step): method, seed, step and bits per byte by segment; a run still
    training gives the steps it has evaluated so far."""
    import yaml

    rows = []
    for config in sorted(folder.rglob("config.yaml")):
        run_dir = config.parent
        cfg = yaml.safe_load(config.read_text())
        run = {"method": cfg["memory"]["name"], "seed": cfg["seed"]}
        evals = run_dir / "evals.jsonl"
        for line in evals.read_text().splitlines() if evals.is_file() else []:
            ev = json.loads(line)
            rows.append({**run, "step": ev["step"], "bpb_by_segment": ev["bpb_by_segment"],
                         "tokens_by_segment": ev["tokens_by_segment"]})
        if (run_dir / "result.json").is_file():
            res = json.loads((run_dir / "result.json").read_text())
            rows.append({**run, "step": res["train_steps"], "bpb_by_segment": res["bpb_by_segment"],
                         "tokens_by_segment": res["tokens_by_segment"]})
    if not rows:
        raise FileNotFoundError(f"no evaluated run under {folder}: run `memzoo compare lm-stream` first")
    return pd.DataFrame(rows)


def common_step(rows: pd.DataFrame) -> int:
    """The last step every run (method and seed) with an evaluation has evaluated: where a cut-off suite
    compares alike (a run cut off before its first evaluation has no row here and is not waited for)."""
    return int(rows.groupby(["method", "seed"])["step"].max().min())


def step_table(table: pd.DataFrame, headroom: pd.DataFrame, step: int) -> str:
    """Per method at one step: the difference from `local` on segment 0 and on segments >= 1 (paired over
    seeds, 95% t half-width) beside headroom recovered with its 95% interval, best first."""
    at = table[table["step"] == step].set_index(["method", "range"])
    rows = []
    for _, h in headroom.iterrows():
        cells = []
        for rng in ("segment 0", "segments >= 1"):
            d = at.loc[(h["method"], rng)]
            cells.append("ref" if h["method"] == "local" else f"{d['diff_vs_local']:+.3f} ± {d['ci']:.3f}")
        if h["method"] in ("local", "full"):
            share = "0 (floor)" if h["method"] == "local" else "1 (ceiling)"
        elif h["headroom_status"] == "bounded":
            share = f"{h['headroom']:.2f} [{h['headroom_lo']:.2f}, {h['headroom_hi']:.2f}]"
        else:
            share = f"{h['headroom']:.2f} ({h['headroom_status']})" if h["headroom"] == h["headroom"] else h["headroom_status"]
        rows.append([f"`{h['method']}`", str(int(h["runs"])), *cells, share])
    return markdown(["method", "seeds", f"vs local, segment 0 (step {step})", f"vs local, segments ≥ 1 (step {step})",
                     f"headroom recovered (step {step})"], rows)


def curve_table(table: pd.DataFrame, method: str) -> str:
    """Steps down, ranges across: `method - local` as mean ± half-width."""
    sub = table[table["method"] == method]
    cells = sub.assign(cell=[f"{d:+.3f} ± {c:.3f}" if c == c else f"{d:+.3f}" for d, c in zip(sub["diff_vs_local"], sub["ci"])])
    wide = cells.pivot(index="step", columns="range", values="cell")[list(RANGES)]
    rows = [[str(step), *row] for step, row in wide.iterrows()]
    return markdown(["step", *wide.columns], rows, right=range(len(RANGES) + 1))
