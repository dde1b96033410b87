"""Long-range retrieval recipes: passkey accuracy against prompt length, accuracy by the key's
segment counted back from the question (with the memory-reset ablation beside it), the answer loss
over fine-tuning, the language model and the gates before and after fine-tuning.

    from memzoo.analysis import load_results, passkey_length_curves, accuracy_by_key_segment
    df = load_results("results/longrange/results.parquet")
    passkey_length_curves(df).figure.savefig("passkey_vs_length.png")

Passkey intervals here are Wilson's 95% score interval over the pooled trials (every key of every
depth and seed at that length): one run gives few seeds and many keys, and a proportion at 0 or 1
still gets an interval.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np
import pandas as pd

from memzoo.analysis.palette import ordered_legend, style as style_of
from memzoo.analysis.passkey import length_label, longrange_table
from memzoo.analysis.stats import wilson_interval

PASSKEY_INTERVAL = "95% Wilson score interval over the pooled keys (all depths, trials and seeds of a length)"


def _pooled(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Correct keys and keys tried per group (rows in budget only), accuracy and its Wilson interval."""
    ok = table[table["status"] == "ok"]
    trials = ok["trials"] if "trials" in ok else pd.Series(1, index=ok.index)
    correct = ok["correct"] if "correct" in ok else ok["accuracy"] * trials
    data = ok.assign(correct=correct.fillna(ok["accuracy"] * trials).round().astype(int), n=trials.astype(int))
    out = data.groupby(keys, as_index=False).agg(correct=("correct", "sum"), n=("n", "sum"))
    out["accuracy"] = out["correct"] / out["n"]
    bounds = [wilson_interval(int(c), int(n)) for c, n in zip(out["correct"], out["n"])]
    out["lo"], out["hi"] = [b[0] for b in bounds], [b[1] for b in bounds]
    return out


def passkey_by_length(df: pd.DataFrame, reset: bool = False) -> pd.DataFrame:
    """Per method and length: passkey accuracy pooled over depths, trials and seeds (`correct` of
    `n` keys) with its Wilson interval (`lo`, `hi`); lengths where any row ran out of budget have
    `within_budget` False and count only the rows that finished."""
    table = longrange_table(df, "passkey", reset=reset)
    if table.empty:
        return pd.DataFrame(columns=["method", "length", "correct", "n", "accuracy", "lo", "hi", "within_budget"])
    out = _pooled(table, ["method", "length"])
    budget = table.assign(ok=table["status"] == "ok").groupby(["method", "length"], as_index=False)["ok"].all()
    out = budget.merge(out, on=["method", "length"], how="left").rename(columns={"ok": "within_budget"})
    return out[["method", "length", "correct", "n", "accuracy", "lo", "hi", "within_budget"]].astype({"length": int})


def passkey_length_curves(df: pd.DataFrame, ax=None):
    """Passkey accuracy against prompt length (log axis), one line per method, depths pooled, with
    Wilson's 95% interval over the pooled keys as error bars; the memory-reset ablation, where
    measured, dashed in the method's colour. Returns the Axes, or None without passkey rows."""
    import matplotlib.pyplot as plt

    plain, ablated = passkey_by_length(df), passkey_by_length(df, reset=True)
    plain, ablated = plain[plain["n"] > 0], ablated[ablated["n"] > 0]
    if plain.empty:
        return None
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    for method in sorted(plain["method"].unique()):
        colour, mark = style_of(method)
        for data, style, label in ((plain, f"-{mark}", method), (ablated, "--x", f"{method} (reset after key)")):
            sub = data[data["method"] == method].sort_values("length")
            if sub.empty:
                continue
            err = np.vstack([sub["accuracy"] - sub["lo"], sub["hi"] - sub["accuracy"]]).clip(min=0)  # [2, lengths]
            ax.errorbar(sub["length"], sub["accuracy"], yerr=err, fmt=style, color=colour, capsize=3, label=label,
                        alpha=1.0 if style == "-o" else 0.6)
    ax.set_xscale("log", base=2)
    lengths = sorted(plain["length"].unique())
    ax.set_xticks(lengths, [length_label(int(n)) for n in lengths])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("prompt length (bytes, log)")
    ax.set_ylabel("passkey accuracy (depths pooled; 95% Wilson)")
    ax.legend(*ordered_legend(ax), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the data
    return ax


def _bucket(k: int) -> str:
    """0, 1, 2-3, 4-7, ...: segments back, in powers of two."""
    if k < 2:
        return str(k)
    lo = 1 << (int(k).bit_length() - 1)
    return f"{lo}-{2 * lo - 1}"


def accuracy_by_key_segment(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and the key's segment counted back from the question's (0 = the same segment,
    buckets in powers of two): passkey accuracy pooled over lengths, depths, trials and seeds, and
    the same with the memory reset right after the key's segment (`accuracy_reset`, where
    measured). Where the memory carried the key, `accuracy_reset` falls to chance (0 for 5 digits)."""
    parts = []
    for reset in (False, True):
        table = longrange_table(df, "passkey", reset=reset)
        if table.empty or "key_segments_back" not in table:
            continue
        table = table[table["key_segments_back"].notna()]
        table = table.assign(first=table["key_segments_back"].astype(int),
                             segments_back=table["key_segments_back"].astype(int).map(_bucket))
        pooled = _pooled(table, ["method", "segments_back"])
        order = table.groupby(["method", "segments_back"], as_index=False)["first"].min()
        pooled = pooled.merge(order, on=["method", "segments_back"])
        suffix = "_reset" if reset else ""
        parts.append(pooled.rename(columns={c: f"{c}{suffix}" for c in ("accuracy", "n", "lo", "hi", "correct")}))
    if not parts:
        return pd.DataFrame(columns=["method", "segments_back", "accuracy", "n"])
    out = parts[0] if len(parts) == 1 else parts[0].merge(parts[1], on=["method", "segments_back", "first"], how="outer")
    out = out.sort_values(["method", "first"]).drop(columns=["first"]).reset_index(drop=True)
    cols = ["method", "segments_back"] + [c for c in ("accuracy", "n", "accuracy_reset", "n_reset") if c in out]
    return out[cols]


def answer_loss_table(df: pd.DataFrame) -> pd.DataFrame:
    """The answer loss over fine-tuning in long form: (method, seed, step, stage, train_bpb), from
    the `answer_loss_json` column (steps counted across the curriculum's stages)."""
    rows = []
    for _, r in df.iterrows():
        cell = r.get("answer_loss_json")
        if isinstance(cell, str):
            rows += [{"method": r["method"], "seed": r.get("seed", 0), **item} for item in json.loads(cell)]
    return pd.DataFrame(rows, columns=["method", "seed", "step", "stage", "train_bpb"])


def answer_loss_curves(df: pd.DataFrame, ax=None):
    """The task's training loss on the answer bytes (bits per byte) over the fine-tuning steps, one
    line per run (colour: method), not a band: seeds that learn at different steps (or not at all)
    average into a curve no run followed, and a t interval over two seeds spans ±12 standard errors.
    Dotted lines mark where a curriculum stage starts. Returns the Axes, or None when the table
    has no fine-tuning."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    data = answer_loss_table(df)
    if data.empty:
        return None
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    sns.lineplot(data=data, x="step", y="train_bpb", hue="method", units="seed", estimator=None, linewidth=1,
                 palette={m: style_of(m)[0] for m in data["method"].unique()}, ax=ax)
    first = data[data["seed"] == data["seed"].min()]
    starts = first.groupby("stage")["step"].min().sort_index().tolist()[1:]
    for step in sorted(set(starts)):
        ax.axvline(step, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("fine-tuning step (curriculum stages in order)")
    ax.set_ylabel("answer loss (bits per byte)")
    ax.legend(*ordered_legend(ax), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the data
    return ax


def lm_before_after(df: pd.DataFrame) -> pd.DataFrame:
    """Per method (mean over seeds): validation bits per byte before fine-tuning, after, and after /
    before (the target is within 1.05)."""
    if "valid_bpb_pretrain" not in df or df["valid_bpb_pretrain"].isna().all():
        return pd.DataFrame(columns=["method", "valid_bpb_pretrain", "valid_bpb", "valid_bpb_ratio"])
    cols = ["valid_bpb_pretrain", "valid_bpb", "valid_bpb_ratio"]
    return df.groupby("method", as_index=False)[cols].mean()


def gate_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per gated method: heads, mean gate before and after fine-tuning, and after it the share of
    heads near local only (< 0.1) and near memory only (> 0.9) - the paper's specialisation."""
    rows = []
    for _, r in df.iterrows():
        after = json.loads(r["gates_json"]) if isinstance(r.get("gates_json"), str) else {}
        before = json.loads(r["gates_pretrain_json"]) if isinstance(r.get("gates_pretrain_json"), str) else {}
        a = [g for values in after.values() for g in values]
        if not a:
            continue
        b = [g for values in before.values() for g in values]
        rows.append({"method": r["method"], "heads": len(a), "gate_before": float(np.mean(b)) if b else np.nan,
                     "gate_after": float(np.mean(a)), "local_heads": float(np.mean([g < 0.1 for g in a])),
                     "memory_heads": float(np.mean([g > 0.9 for g in a]))})
    cols = ["method", "heads", "gate_before", "gate_after", "local_heads", "memory_heads"]
    if not rows:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(rows).groupby("method", as_index=False).mean()[cols]


def recall_generalisation(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and length: recall accuracy of the capacity models streamed with their pairs
    `length` bytes before the queries (`layout: training` rows), mean over seeds, with chance and
    the memory-reset ablation (`accuracy_reset`) beside it."""
    parts = []
    for reset in (False, True):
        table = longrange_table(df, "recall", reset=reset)
        if table.empty or "layout" not in table:
            continue
        table = table[(table["layout"] == "training") & (table["status"] == "ok")]
        if table.empty:
            continue
        agg = {"accuracy": ("accuracy", "mean")} | ({} if reset else {"chance": ("chance", "mean"),
                                                                     "runs": ("seed", "count")})
        out = table.groupby(["method", "length"], as_index=False).agg(**agg)
        parts.append(out.rename(columns={"accuracy": "accuracy_reset"}) if reset else out)
    if not parts:
        return pd.DataFrame(columns=["method", "length", "runs", "accuracy", "chance", "accuracy_reset"])
    out = parts[0] if len(parts) == 1 else parts[0].merge(parts[1], on=["method", "length"], how="left")
    return out.astype({"length": int}).sort_values(["method", "length"]).reset_index(drop=True)
