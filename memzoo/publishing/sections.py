"""The report's sections of the evaluation kinds a results table holds: each kind's own (declared when
it registers: memzoo.evaluations.registry), or its rows per run where it declares none, and what
`memzoo compare` prints when a suite ends."""
from __future__ import annotations

import pandas as pd

from memzoo.analysis import longrange_table
from memzoo.analysis.cells import display
from memzoo.evaluations.registry import DEFAULT_KIND, Evaluation, evaluations, reported


def kind_sections(evaluation: Evaluation, df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One kind's sections: its own `section` where it declares one, else its rows per run."""
    if evaluation.section is not None:
        return [(heading, display(table)) for heading, table in evaluation.section(df)]
    table = longrange_table(df, evaluation.name, reset=None)
    return [] if table.empty else [(f"Evaluation {evaluation.name}: its rows per run", display(table))]


def console_table(df: pd.DataFrame) -> pd.DataFrame:
    """What `memzoo compare` prints when a suite ends: the summary of the first kind the table holds
    that declares one (bits per byte, the capacity cells, the distance reach), else the default kind's."""
    for evaluation in reported(df).values():
        if evaluation.summary is not None:
            return evaluation.summary(df)
    return evaluations()[DEFAULT_KIND].summary(df)
