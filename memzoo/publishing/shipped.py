"""The shipped rows as the generated tables read them: a source's rows (a suite's parquet or a
measurement's CSV, empty where none are shipped yet) and the window suite's rows with the ceiling's."""
from __future__ import annotations

import pandas as pd

from memzoo.analysis.bpb import CEILING
from memzoo.publishing import backbone_cards
from memzoo.publishing.references import MEASURED, SHIPPED_SUITES, load_measured, load_references, references_dir


def shipped_rows(source: str) -> pd.DataFrame:
    """A source's shipped rows: a suite's (memzoo/references/SUITE.parquet) or a measurement's
    (memzoo/references/NAME.csv, e.g. gpu-speed, cpu-cost), or the backbones' cards; empty where none
    are shipped yet."""
    if source in SHIPPED_SUITES:
        return load_references(source)
    if source in MEASURED:
        return load_measured(source)
    if source == backbone_cards.SOURCE:  # the shipped backbones' cards (memzoo/backbones/index.json)
        return backbone_cards.card_rows()
    path = references_dir() / f"{source}.csv"
    return pd.read_csv(path) if path.is_file() else pd.DataFrame()


def with_ceiling(rows: pd.DataFrame, source: str = "lm-stream") -> pd.DataFrame:
    """The window suite's rows with `full`'s: its own where it has them, else `source`'s shipped rows at
    the same seeds (full opts out of the window, so its run there is the same computation; marked in
    `ceiling_from`), given the rows' span so that they compare with the window floor."""
    if (rows["method"] == CEILING).any() or rows.empty:
        return rows.assign(ceiling_from="own")
    full = load_references(source)
    full = full[(full["method"] == CEILING) & full["seed"].isin(rows["seed"].unique())]
    span = int(rows["attention_span"].iloc[0])
    return pd.concat([rows.assign(ceiling_from="own"), full.assign(attention_span=span, ceiling_from=source)],
                     ignore_index=True)
