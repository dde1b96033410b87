"""Gate values per head and layer (sigmoid(beta) for Infini, sigmoid(b) for Memorizing), as a table
and as heatmaps: the Infini paper's Figure 3."""
from __future__ import annotations
from memzoo.analysis.results import variant_labels

import json

import pandas as pd



def gate_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per-head gate values (sigmoid(β) for Infini; sigmoid(b) for Memorizing) as rows
    (method, variant, state, seed, layer, head, gate), from the `gates_json` (or `gates`) column; `state`
    is the run's measured footprint (a method swept over its memory size has one set of gates per
    size), `variant` its `variant_labels` (grid points of equal state, e.g. two normalisers, apart)."""
    rows = []
    variants = variant_labels(df) if len(df) else pd.Series(dtype=str)
    for i, r in df.iterrows():
        gates = r.get("gates_json", r.get("gates", "{}"))
        gates = json.loads(gates) if isinstance(gates, str) else (gates or {})
        state = r.get("footprint_measured", None)
        for layer, values in gates.items():
            for head, g in enumerate(values):
                rows.append({"method": r["method"], "variant": variants[i], "state": state, "seed": r["seed"],
                             "layer": int(layer), "head": head, "gate": g})
    return pd.DataFrame(rows, columns=["method", "variant", "state", "seed", "layer", "head", "gate"])


def gate_heatmaps(df: pd.DataFrame):
    """The Infini paper's Figure 3: gate per layer and head (0 = local only, 1 = memory only), one
    panel per gated method (first seed). Returns the figure, or None when no run has gates."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    table = gate_table(df)
    if table.empty:
        return None
    panels = list(table.groupby(["variant", "state"], dropna=False, sort=True))
    several = table.groupby("variant")["state"].nunique(dropna=False)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, ((v, state), sub) in zip(axes[0], panels):
        sub = sub[sub["seed"] == sub["seed"].min()]
        grid = sub.pivot(index="layer", columns="head", values="gate")
        sns.heatmap(grid, vmin=0, vmax=1, cmap="coolwarm", annot=True, fmt=".2f", cbar=False, ax=ax)
        ax.set_title(v if several[v] == 1 else f"{v}, state {int(state):,}")
    fig.tight_layout()
    return fig
