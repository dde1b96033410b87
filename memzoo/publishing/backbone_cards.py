"""The shipped backbones' cards as a table: each backbone's valid bits per byte and its copy probe (second
copy of a held-out text chunk and of a random one, bits per byte by distance), from
memzoo/backbones/index.json, so the backbone page's numbers are the cards' own."""
from __future__ import annotations

import pandas as pd

from memzoo.publishing.formats import markdown
from memzoo.training.backbones import shipped_index

SOURCE = "backbones"  # the generated tables' name for the cards
DISTANCES = (32, 128, 512, 1024, 2048, 4000)  # the probe's distances every card has (some add 256)


def card_rows() -> pd.DataFrame:
    """One row per (backbone, chunk kind, distance) of every shipped card with a copy probe."""
    rows = [{"backbone": name, "seed": card.get("seed", 0), "valid_bpb": card.get("valid_bpb"), "steps": card.get("steps"),
             "qk_conv": card.get("model", {}).get("qk_conv", 0), **probe}
            for name, card in shipped_index().items() for probe in card.get("copy_probe", [])]
    return pd.DataFrame(rows)


def probe_md(rows: pd.DataFrame) -> str:
    """Backbone (its training seed, valid bits per byte) x chunk kind: the second copy's bits per byte at each
    distance (the probe's 16 rows a distance)."""
    out = []
    for (name, kind), sub in rows.groupby(["backbone", "kind"], sort=False):
        by_d = sub.set_index("distance")["second_bits"]
        conv = f", {int(sub['qk_conv'].iloc[0])} taps" if sub["qk_conv"].iloc[0] else ""
        label = f"`{name}` ({int(sub['seed'].iloc[0])}; valid {sub['valid_bpb'].iloc[0]:.3f}{conv})"
        out.append([label, kind, *(f"{by_d[d]:.2f}" if d in by_d.index else "–" for d in DISTANCES)])
    return markdown(["backbone (training seed; valid)", "chunk", *(f"{d:,}" for d in DISTANCES)], out, right=range(2, 2 + len(DISTANCES)))
