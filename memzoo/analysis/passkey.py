"""Long-range rows (passkey, recall) as a table, passkey heatmaps by length and depth, and the
streaming cost against length."""
from __future__ import annotations

import json
from typing import Optional

import pandas as pd

from memzoo.analysis.palette import colour, marker, ordered_legend


LONGRANGE_COLUMNS = ["method", "seed", "task", "length", "depth", "accuracy", "tokens_per_s", "peak_rss_mb", "status"]


def longrange_table(df: pd.DataFrame, task: str = "passkey", reset: Optional[bool] = False) -> pd.DataFrame:
    """Long-range rows (memzoo passkey / recall, suite `longrange` stages) in long form: one row per
    (run, length, depth), from the `passkey_json` / `recall_json` column (or a `passkey` list).
    reset: False (default) the plain rows, True the memory-reset ablation's (`reset_after_key`),
    None both. Each row carries its run's `seed` and `gates_json` (where the run has one); the seed
    that drew the row's prompts is `prompt_seed`."""
    rows = []
    for _, r in df.iterrows():
        cell = r.get(f"{task}_json", r.get(task))
        if cell is None or (isinstance(cell, float) and cell != cell):
            continue
        gates = {"gates_json": r["gates_json"]} if isinstance(r.get("gates_json"), str) else {}
        for item in json.loads(cell) if isinstance(cell, str) else cell:
            if reset is None or bool(item.get("reset_after_key", False)) == reset:
                # the row's own "seed" draws its prompts; the run's seed is what intervals over seeds group by
                prompts = {"prompt_seed": item["seed"]} if "seed" in item else {}
                rows.append({**item, **prompts, "method": r["method"], "seed": r.get("seed", 0), **gates})
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=LONGRANGE_COLUMNS)
    return out[[c for c in LONGRANGE_COLUMNS if c in out.columns] + [c for c in out.columns if c not in LONGRANGE_COLUMNS]]


def length_label(n: int) -> str:
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


def passkey_heatmaps(df: pd.DataFrame):
    """Passkey accuracy per method: depth (rows) x length (columns), mean over seeds; cells out of
    budget are grey and marked "oob". Returns the figure, or None when no run has passkey rows."""
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    table = longrange_table(df, "passkey")
    if table.empty:
        return None
    methods = sorted(table["method"].unique())
    cols = min(3, len(methods))
    rows_n = -(-len(methods) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 2.6 * rows_n), squeeze=False)
    for ax, m in zip(axes.flat, methods):
        sub = table[table["method"] == m]
        acc = sub.pivot_table(index="depth", columns="length", values="accuracy", aggfunc="mean", dropna=False)
        ok = sub.assign(ok=sub["status"] == "ok").pivot_table(index="depth", columns="length", values="ok", aggfunc="max")
        acc = acc.reindex(index=ok.index, columns=ok.columns)
        within = ok.fillna(False).values.astype(bool)
        values = acc.astype(float).where(within)  # out of budget: a grey cell marked "oob"
        sns.heatmap(values, vmin=0, vmax=1, cmap="viridis", annot=True, fmt=".2f", cbar=False, ax=ax,
                    xticklabels=[length_label(int(c)) for c in acc.columns], yticklabels=[f"{d:g}" for d in acc.index])
        ax.set_facecolor("#cccccc")
        for i, j in zip(*np.nonzero(~within)):
            ax.text(j + 0.5, i + 0.5, "oob", ha="center", va="center", color="#333333")
        ax.set_title(m)
        ax.set_xlabel("prompt length (bytes)")
        ax.set_ylabel("key depth")
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def cost_vs_length(df: pd.DataFrame, task: str = "passkey", axes=None):
    """Peak resident memory and streaming throughput against prompt length, one line per method
    (log length axis; rows out of budget are left out). A bounded memory gives flat lines."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    table = longrange_table(df, task)
    table = table[table["status"] == "ok"]
    if table.empty:
        return None
    per_length = table.groupby(["method", "length"], as_index=False)[["peak_rss_mb", "tokens_per_s"]].mean()
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    methods = sorted(per_length["method"].unique())
    look = dict(hue="method", style="method", dashes=False, palette={m: colour(m) for m in methods},
                markers={m: marker(m) for m in methods})
    sns.lineplot(data=per_length, x="length", y="peak_rss_mb", **look, ax=axes[0])
    sns.lineplot(data=per_length, x="length", y="tokens_per_s", **look, ax=axes[1], legend=False)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (bytes, log)")
    axes[0].set_ylabel("peak resident memory (MB)")
    axes[1].set_ylabel("streaming tokens per second")
    axes[0].legend(*ordered_legend(axes[0]), fontsize=8, loc="upper left", bbox_to_anchor=(-0.02, -0.15), ncol=5, frameon=False)  # below the panels
    return axes


def length_cost_table(df: pd.DataFrame, task: str = "passkey", short: int = 32768, long: int = 1048576) -> pd.DataFrame:
    """Per method: peak resident memory and streaming throughput at each length, and the ratios
    long / short (the bounded-memory targets: memory ratio within 1.10, throughput ratio near 1),
    between streams of the same batch size (`ratio_of` names the lengths compared). A length out of
    budget has no numbers."""
    table = longrange_table(df, task)
    if table.empty:
        return pd.DataFrame()
    out = []
    for method, sub in table.groupby("method"):
        row: dict = {"method": method}
        for length, at in sub.groupby("length"):
            ok = at[at["status"] == "ok"]
            label = length_label(int(length))
            row[f"rss_mb_{label}"] = ok["peak_rss_mb"].mean() if len(ok) == len(at) else None
            row[f"tokens_per_s_{label}"] = ok["tokens_per_s"].mean() if len(ok) == len(at) else None
            if task == "passkey":
                row[f"accuracy_{label}"] = ok["accuracy"].mean() if len(ok) == len(at) else None
        # Ratios compare streams of the same batch (rows per batch); when `short` was streamed with
        # another batch, the longest shorter length that matches `long`'s batch stands in for it.
        batch = sub.groupby("length")["rows_in_batch"].max() if "rows_in_batch" in sub else None
        base = short
        if batch is not None and long in batch.index and short in batch.index and batch[short] != batch[long]:
            same = [n for n in batch.index if n < long and batch[n] == batch[long]]
            base = max(same) if same else None
        s, l = (length_label(base) if base else None), length_label(long)
        if s and row.get(f"rss_mb_{s}") and row.get(f"rss_mb_{l}"):
            row["ratio_of"] = f"{l} / {s}"
            row["rss_ratio"] = row[f"rss_mb_{l}"] / row[f"rss_mb_{s}"]
            row["tokens_per_s_ratio"] = row[f"tokens_per_s_{l}"] / row[f"tokens_per_s_{s}"]
        else:
            row["ratio_of"] = row["rss_ratio"] = row["tokens_per_s_ratio"] = None
        out.append(row)
    return pd.DataFrame(out)
