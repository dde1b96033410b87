"""`memzoo scorecard PLUGIN`: a new memory through the reference suites, beside the shipped rows.

Only the plugin's own methods are trained, with each suite's exact config and seeds (the first
`seeds` of them); the built-in methods come from the shipped references (memzoo.publishing.references).
Differences are paired by seed where both sides drew their backbone with `init_streams: split`
(the backbone then depends on the seed alone, so the same seed is the same backbone) and Welch
otherwise. Each suite gets a folder with the combined table and the usual report, and
`scorecard.md` ranks the plugin's methods with intervals. Resumable: finished runs are skipped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd
from omegaconf import OmegaConf

from memzoo.analysis.results import variant_labels
from memzoo.analysis.stats import compare_groups
from memzoo.core.config import ConfigError
from memzoo.evaluations.registry import Score, end_of_training, get_evaluation
from memzoo.runs.configure import load_config
from memzoo.suites.compare import load_suite, run_suite
from memzoo.publishing.references import SHIPPED_SUITES, hours_label, load_index, load_references, memzoo_version, training_hours
from memzoo.analysis.cells import table_md
from memzoo.publishing.report import write_report

def suite_score(suite_name: str, overrides: Optional[list[str]] = None) -> Score:
    """The metric a suite is ranked by, declared by its evaluation kinds (memzoo.evaluations.registry):
    the suite's `scorecard` names it, else it is the first score of its last long-range kind that has
    one, else of the kind that ends its runs' training. A name no kind declares is an error listing those that do."""
    suite = load_suite(suite_name, overrides)
    first = OmegaConf.merge(load_config(suite.base.format(method="local")), suite.run or {})  # enough for the task
    kinds = [get_evaluation(str(entry.task)) for entry in reversed(list(suite.longrange or []))] + [end_of_training(first)]
    scores = [score for kind in kinds for score in kind.scores]
    if suite.scorecard is None:
        if not scores:
            raise ConfigError(f"suite {suite_name}: none of its evaluations {[k.name for k in kinds]} declares a score")
        return scores[0]
    named = [score for score in scores if score.name == suite.scorecard]
    if not named:
        raise ConfigError(f"suite {suite_name}: scorecard={suite.scorecard!r} is no score of its evaluations; "
                          f"expected one of {[score.name for score in scores]}")
    return named[0]


@dataclass
class SuiteScore:
    suite: str
    table: pd.DataFrame  # compare_groups over the plugin's and the shipped methods
    folder: Path
    note: str = ""


def _train_hours(rows: pd.DataFrame) -> float:
    """The plugin's runs' training hours, every curriculum stage included (0 when unknown)."""
    if rows.empty or "run_dir" not in rows.columns:
        return 0.0
    return training_hours([Path(str(d)) for d in rows["run_dir"]]) or 0.0


def score_suite(suite_name: str, methods: list[str], imports: list[str], out_dir: Path, seeds: Optional[int],
                jobs: Optional[int], launcher: Optional[str], progress: bool = True,
                overrides: Optional[list[str]] = None, figures: bool = True) -> SuiteScore:
    """Train the plugin's methods through one suite and compare them with the shipped rows.
    `overrides` change the plugin's runs only (tests, smoke runs): the scorecard then says its rows
    are not comparable with the references."""
    base = load_suite(suite_name)
    chosen = list(base.seeds)[:seeds] if seeds else list(base.seeds)
    own = [f"methods=[{','.join(methods)}]", f"seeds=[{','.join(map(str, chosen))}]", f"out_dir={out_dir}"]
    if imports:
        own.append(f"imports=[{','.join(imports)}]")
    suite = load_suite(suite_name, own + list(overrides or []))
    ours = run_suite(suite, jobs=jobs, launcher=launcher, progress=progress)
    refs = load_references(suite_name)
    folder = Path(out_dir) / f"{suite_name}-scorecard"
    folder.mkdir(parents=True, exist_ok=True)
    if refs.empty:
        note = f"no shipped references for {suite_name}: the plugin's rows alone"
        refs = pd.DataFrame(columns=ours.columns)
    else:
        refs = refs[refs["seed"].isin(chosen) & ~refs["method"].isin(methods)]
        note = f"suite overrides {list(overrides)}: the plugin's rows are NOT comparable with the references" if overrides else ""
    combined = pd.concat([refs.assign(source="shipped"), ours.assign(source="plugin")], ignore_index=True)
    combined.to_parquet(folder / "results.parquet", index=False)
    write_report(folder, figures=figures)
    table, paired = score_table(suite_name, combined)
    if not paired:
        inits = sorted(set(combined.get("backbone_init", pd.Series(["shared"])).fillna("shared")))
        note = (note + "; " if note else "") + f"unpaired (Welch): backbone inits {inits}"
    return SuiteScore(suite_name, table, folder, note)


def score_table(suite_name: str, rows: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """Per method and variant (a grid within a method, as infini-delta's normalisers): the suite's
    metric with its interval and the tests against `local`; paired by seed only when every row drew
    its backbone with the split init. Returns the table and whether it is paired."""
    score = suite_score(suite_name)
    metric, higher = score.name, score.higher_is_better
    rows = rows.copy()
    if score.of_row is not None:
        rows[metric] = [score.of_row(r) for _, r in rows.iterrows()]
    rows["variant"] = variant_labels(rows)
    paired = set(rows.get("backbone_init", pd.Series(["shared"])).fillna("shared")) == {"split"}
    return compare_groups(rows, ["method", "variant"], metric, higher_is_better=higher, paired=paired), paired


def rank_table(score: SuiteScore, methods: list[str]) -> pd.DataFrame:
    """Every method ranked by its mean (1 = best), the plugin's marked, with the interval and the
    difference from `local`."""
    higher = suite_score(score.suite).higher_is_better
    t = score.table.sort_values("mean", ascending=not higher).reset_index(drop=True)
    t.insert(0, "rank", range(1, len(t) + 1))
    t["yours"] = t["method"].isin(methods)
    cols = ["rank", "method", "variant", "yours", "n", "mean", "ci", "diff_vs_local", "ci_vs_local", "p_vs_local", "sig_vs_local"]
    return t[[c for c in cols if c in t.columns]]


def _shown(t: pd.DataFrame) -> pd.DataFrame:
    """The rank table as text: mean ± interval, the difference from local ± its interval and p
    (an interval and a p-value only where there are seeds for them)."""
    def pm(v: float, half: float, sign: str = "") -> str:
        return "" if pd.isna(v) else f"{v:{sign}.4f}" + ("" if pd.isna(half) else f" ± {half:.4f}")

    names = t["variant"] if "variant" in t.columns else t["method"]
    out = pd.DataFrame({"rank": t["rank"], "method": [f"**{m}**" if y else m for m, y in zip(names, t["yours"])],
                        "seeds": t["n"], "mean ± 95%": [pm(m, c) for m, c in zip(t["mean"], t["ci"])]})
    if "diff_vs_local" in t.columns:
        out["vs local ± 95% (p)"] = [
            pm(d, c, "+") + ("" if pd.isna(p) else f" (p {p:.3g}){' *' if s else ''}")
            for d, c, p, s in zip(t["diff_vs_local"], t["ci_vs_local"], t["p_vs_local"], t["sig_vs_local"])]
    return out


def write_scorecard(scores: list[SuiteScore], methods: list[str], out_dir: Path, wall_s: float,
                    plugin_hours: float) -> Path:
    """scorecard.md: per suite the ranking with intervals and a link to the report, then the footer."""
    index = load_index()
    lines = [f"# Scorecard: {', '.join(methods)}", ""]
    for s in scores:
        metric = suite_score(s.suite)
        lines += [f"## {s.suite} ({metric.name}, {'higher' if metric.higher_is_better else 'lower'} is better)", ""]
        if s.note:
            lines += [f"_{s.note}_", ""]
        lines += [table_md(_shown(rank_table(s, methods))), "",
                  f"Figures and tables beside the shipped methods: `{s.folder / 'report.md'}`", ""]
    refs = "; ".join(f"{k} frozen {v['frozen']} with memzoo {v['memzoo_version']} ({hours_label(v)})"
                     for k, v in index.items() if k in {s.suite for s in scores})
    lines += ["---", f"memzoo {memzoo_version()}. This scorecard: {wall_s / 60:.1f} min wall, "
              f"{plugin_hours:.2f} training hours for the plugin's runs. References: {refs or 'none'}.", ""]
    path = Path(out_dir) / "scorecard.md"
    path.write_text("\n".join(lines))
    return path


def scorecard(methods: list[str], imports: list[str], suites: list[str], out_dir: Path, seeds: Optional[int] = None,
              jobs: Optional[int] = None, launcher: Optional[str] = None, progress: bool = True,
              overrides: Optional[list[str]] = None, figures: bool = True) -> tuple[Path, list[SuiteScore]]:
    """Run the plugin's `methods` through `suites` and write scorecard.md in `out_dir`."""
    bad = [s for s in suites if s not in SHIPPED_SUITES]
    if bad:
        raise ConfigError(f"scorecard suites {bad}: expected some of {list(SHIPPED_SUITES)}")
    if not methods:
        raise ConfigError("the plugin registers no memory to score")
    start = time.monotonic()
    scores = [score_suite(s, methods, imports, out_dir, seeds, jobs, launcher, progress, overrides, figures) for s in suites]
    hours = sum(_train_hours(pd.read_parquet(s.folder / "results.parquet").query("source == 'plugin'")) for s in scores)
    return write_scorecard(scores, methods, out_dir, time.monotonic() - start, hours), scores
