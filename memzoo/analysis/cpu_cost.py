"""The CPU cost of a suite's variants (rows of memzoo.suites.cpu_cost: one training window each, timed beside
`local` in the same rounds): a table of speeds and the figure of them."""
from __future__ import annotations

import pandas as pd

from memzoo.analysis.palette import colour, legend_order, marker, variant_lines

REFERENCE = "local"


def cpu_cost_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per variant: its median CPU seconds and speed against local (local's median / its own) at
    each carried position (columns `seconds_BYTES`, `speed_BYTES`), fastest first at no bytes carried."""
    wide = rows.pivot_table(index="variant", columns="carried_bytes", values=["median_s", "speed_vs_local"],
                            aggfunc="first")
    out = pd.DataFrame(index=wide.index)
    for carried in sorted(rows["carried_bytes"].unique()):
        out[f"seconds_{carried}"] = wide[("median_s", carried)]
        out[f"speed_{carried}"] = wide[("speed_vs_local", carried)]
    out["rounds"] = rows.groupby("variant")["rounds"].min()
    out["method"] = rows.groupby("variant")["method"].first()
    first = f"speed_{min(rows['carried_bytes'])}"
    return out.sort_values(first, ascending=False, kind="stable").reset_index()


def cpu_cost_figure(rows: pd.DataFrame):
    """Left: each variant's speed against local (one training window, no bytes carried), slowest at the
    bottom, 1 marked. Right: the median CPU seconds of the window against the bytes carried before it,
    per variant (local black): what grows with the context it holds."""
    import matplotlib.pyplot as plt

    table = cpu_cost_table(rows)
    carried = sorted(int(c) for c in rows["carried_bytes"].unique())
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 1.15]})
    shown = table.iloc[::-1]  # barh draws from the bottom: fastest on top
    first = f"speed_{carried[0]}"
    bars.barh(shown["variant"], shown[first], color=[colour(v) for v in shown["variant"]], edgecolor="black",
              linewidth=0.4)
    for y, value in enumerate(shown[first]):
        bars.text(value + 0.01, y, f"{value:.2f}", va="center", fontsize=8)
    bars.axvline(1.0, color="black", linewidth=0.8, linestyle=":")
    bars.set_xlabel(f"speed against local: local's CPU seconds / the variant's\n({carried[0]:,} bytes carried before the window)")
    bars.set_xlim(0, max(1.1, float(shown[first].max()) + 0.12))
    bars.tick_params(axis="y", labelsize=8)
    styles = variant_lines(list(table["variant"]))
    for v in table["variant"]:
        sub = rows[rows["variant"] == v].sort_values("carried_bytes")
        if len(sub) < 2:
            continue
        lines.plot(sub["carried_bytes"], sub["median_s"], color=colour(v), marker=marker(v), linestyle=styles[v],
                   linewidth=2.2 if v in (REFERENCE, "full") else 1.2, markersize=6, label=v)
    lines.set_xticks(carried, [f"{c:,}" for c in carried])
    lines.set_xlabel("bytes of the document streamed before the window\n(its state carried into it)")
    lines.set_ylabel("CPU seconds per training window (median)")
    lines.set_ylim(bottom=0)
    lines.legend(*legend_order(*lines.get_legend_handles_labels()), loc="center left", bbox_to_anchor=(1.0, 0.5),
                 fontsize=8, frameon=False)
    first_row = rows.iloc[0]
    fig.suptitle(f"One training window ({first_row['batch_size']} rows x {first_row['window_segments']} segments x "
                 f"{first_row['segment_len']} bytes, forward and backward), {first_row['suite']}: median of "
                 f"{int(rows['rounds'].min())} interleaved rounds, {first_row['threads']} thread", fontsize=10)
    fig.tight_layout()
    return fig
