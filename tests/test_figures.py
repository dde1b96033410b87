"""Results that cannot go stale: every generated table in README.md and docs/ equals the table of the
shipped rows, every results figure records the hash of the rows it was drawn from, and every method
keeps one colour and marker of its own. Fast: no training, no drawing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from memzoo.analysis.palette import SPARE_MARKERS, STYLES, legend_order, spread, style, variant_lines
from memzoo.core.config import ConfigError
from memzoo.core.plugins import registered
from memzoo.publishing.figures import (ARCHIVED, FIGURES, ROWS_KEY, all_tables, pages, png_text, render, rows_stamp,
                                   stale_figures, stale_pages)
from memzoo.publishing.facts import all_facts, bpb_facts, render_facts
from memzoo.publishing.overview import LM_SUITE
from memzoo.publishing.references import MEASURED, load_references
from memzoo.publishing.backbone_cards import SOURCE as CARDS
from memzoo.publishing.tables import TABLES, markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def shipped() -> dict[str, str]:
    """Every generated table of the shipped rows (computed once: the statistics take seconds)."""
    return all_tables()


@pytest.fixture(scope="module")
def facts() -> dict[str, str]:
    """Every fact quoted in prose, from the shipped rows."""
    return all_facts()


def test_every_generated_block_equals_the_table_of_the_shipped_rows(shipped: dict[str, str], facts: dict[str, str]) -> None:
    stale = stale_pages(ROOT, tables=shipped, facts=facts)
    assert not stale, f"stale generated tables in {[str(p.relative_to(ROOT)) for p in stale]}: run `memzoo figures`"
    used = {name for page in pages(ROOT) for name in TABLES if f"<!-- generated:{name} -->" in page.read_text()}
    assert used == set(TABLES), f"tables generated but shown nowhere: {sorted(set(TABLES) - used)}"


def test_a_changed_shipped_row_makes_its_block_stale(shipped: dict[str, str], facts: dict[str, str]) -> None:
    rows = load_references("quick").copy()
    local = rows["method"] == "local"
    rows.loc[local, "valid_bpb"] = rows.loc[local, "valid_bpb"] + 0.5  # local worse: every difference moves
    changed = {**shipped, "quick-table": TABLES["quick-table"][1](rows)}
    assert "4.537 ± 0.134" in changed["quick-table"]  # local's mean, moved by 0.5
    stale = stale_pages(ROOT, tables=changed, facts=facts)
    assert DOCS / "results.md" in stale  # the page that shows the quick table
    assert ROOT / "README.md" not in stale  # the README shows the quick figure, not its table


def test_the_numbers_in_prose_equal_those_of_the_shipped_rows(shipped: dict[str, str], facts: dict[str, str]) -> None:
    """Every `<!-- fact:... -->` value in the pages is the shipped rows' (the README quotes at least the
    headline's: `full` against the window floor from the backbone that copies)."""
    assert not stale_pages(ROOT, tables=shipped, facts=facts)
    readme = (ROOT / "README.md").read_text()
    assert f"<!-- fact:{LM_SUITE}.full.after -->{facts[f'{LM_SUITE}.full.after']}<!-- /fact -->" in readme


def test_a_changed_shipped_row_makes_its_fact_stale(shipped: dict[str, str], facts: dict[str, str]) -> None:
    """XL 0.1 worse after segment 0 at every seed: its quoted difference moves by 0.1 and every page that
    quotes it is stale."""
    rows = load_references("lm-stream").copy()
    xl = rows["method"] == "xl"
    rows.loc[xl, "bpb_by_segment"] = pd.Series([[v[0], *(x + 0.1 for x in v[1:])] for v in rows.loc[xl, "bpb_by_segment"]],
                                               index=rows.index[xl])
    moved = bpb_facts(rows)
    assert float(moved["xl.after_mean"].replace("−", "-")) == pytest.approx(
        float(facts["lm-stream.xl.after_mean"].replace("−", "-")) + 0.1, abs=1.5e-3)
    changed = {**facts, **{f"lm-stream.{k}": v for k, v in moved.items()}}
    quoting = [p for p in pages(ROOT) if "<!-- fact:lm-stream.xl.after -->" in p.read_text()]
    stale = stale_pages(ROOT, tables=shipped, facts=changed)
    assert quoting and all(p in stale for p in quoting)


def test_an_unknown_fact_is_an_error_naming_it_and_a_known_one_is_rewritten() -> None:
    with pytest.raises(ConfigError, match="lm-stream.nobody.after"):
        render_facts("x <!-- fact:lm-stream.nobody.after -->1<!-- /fact -->", {"lm-stream.xl.after": "2"})
    assert render_facts("x <!-- fact:a.b.c -->old<!-- /fact --> y", {"a.b.c": "new"}) == "x <!-- fact:a.b.c -->new<!-- /fact --> y"


def test_the_tables_state_their_seeds_and_fit_the_page(shipped: dict[str, str]) -> None:
    rows = load_references("distance")
    one_seed = rows[(rows["method"] == "rmt")]["seed"].unique()
    table = shipped["distance-table"]
    line = next(l for l in table.splitlines() if l.startswith("| `rmt`"))
    assert line.split(" | ")[1] == ", ".join(str(s) for s in sorted(one_seed))  # one seed, said in the row
    for name, text in shipped.items():
        lines = text.splitlines()  # every table of the block (a block may hold several, each under a caption)
        headers = [line for line, below in zip(lines, lines[1:]) if line.startswith("|") and below.startswith("| ---")]
        assert headers, name
        # a table of measurements (cpu-cost) is over timed rounds, not training seeds, and says how many; a
        # backbone's card is one training run, and says its seed
        over = "rounds" if TABLES[name][0] in MEASURED else "training seed" if TABLES[name][0] == CARDS else "seeds"
        for header in headers:
            assert over in header and header.count("|") - 1 <= 8, header
    with pytest.raises(ValueError, match="9 columns"):
        markdown([str(i) for i in range(9)], [])


def test_a_suite_with_no_rows_shipped_says_so_in_its_block(shipped: dict[str, str]) -> None:
    """A shipped suite declared before its rows exist renders a line saying so; the others are unchanged."""
    tables = all_tables({"lm-stream-sotu": pd.DataFrame()}, names=["lm-stream-sotu-table", "lm-stream-table"])
    assert tables["lm-stream-sotu-table"] == "No rows of `lm-stream-sotu` are shipped yet.\n"
    assert tables["lm-stream-table"] == shipped["lm-stream-table"]


def test_a_block_left_open_or_unknown_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="quick-table"):
        render("<!-- generated:quick-table -->\nold\n", {"quick-table": "new\n"})
    with pytest.raises(ConfigError, match="no-such-table"):
        render("<!-- generated:no-such-table -->\nold\n<!-- /generated -->", {"quick-table": "new\n"})
    assert render("a\n<!-- generated:t -->\nold\n<!-- /generated -->\nb", {"t": "new\n"}) == \
        "a\n<!-- generated:t -->\nnew\n<!-- /generated -->\nb"


def test_every_figure_records_the_hash_of_the_shipped_rows() -> None:
    assert not stale_figures(DOCS), f"stale figures (run `memzoo figures`): {stale_figures(DOCS)}"
    for rel, suite in FIGURES.items():
        assert png_text(DOCS / rel)[ROWS_KEY] == rows_stamp(suite)


def test_a_figure_of_other_rows_is_stale(tmp_path: Path) -> None:
    """A PNG whose text chunk names other rows (or none) is reported, with the shipped rows' stamp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for rel in FIGURES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        fig = plt.figure(figsize=(1, 1))
        fig.savefig(tmp_path / rel, metadata={ROWS_KEY: "quick sha256:0"})
        plt.close(fig)
    stale = stale_figures(tmp_path)
    assert set(stale) == set(FIGURES)
    assert rows_stamp("distance") in stale["distance/distance.png"]


def test_every_figure_in_docs_is_generated_or_says_where_it_comes_from() -> None:
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.png")}
    unexplained = on_disk - set(FIGURES) - set(ARCHIVED)
    assert not unexplained, f"figures neither generated nor archived with their source: {sorted(unexplained)}"
    assert not (set(FIGURES) | set(ARCHIVED)) - on_disk, "a listed figure is missing"


def test_every_method_has_a_colour_and_marker_of_its_own() -> None:
    methods = [m for m in registered() if m in STYLES or not m.startswith("test")]
    missing = [m for m in methods if m not in STYLES and registered()[m].cls.__module__.startswith("memzoo.")]
    assert not missing, f"in-tree methods without a style in memzoo.analysis.palette: {missing}"
    colours = [c for c, _ in STYLES.values()]
    assert len(set(colours)) == len(colours), "two methods share a colour"
    assert len(set(STYLES.values())) == len(STYLES)
    assert style("titans-mag") != style("deltanet") and style("titans-mac") != style("infini-linear")
    assert style("infini-delta normalizer=gamma") == style("infini-delta")  # a variant keeps its method's
    assert style("my-plugin") == style("my-plugin") and style("my-plugin")[0] not in colours
    markers = [m for _, m in STYLES.values()] + list(SPARE_MARKERS)
    assert not [m for m in markers if m in "x+|_.,1234"], "seaborn cannot mix filled and line-art markers"
    assert variant_lines(["a x=1", "a x=2", "b"]) == {"a x=1": "-", "a x=2": "--", "b": "-"}
    in_tree = [m for _, m in STYLES.values()]
    assert len(set(in_tree)) == len(in_tree), "two methods share a marker"


def test_legends_follow_one_order_and_equal_states_are_spread() -> None:
    """Legend entries sort by the zoo's order (variants after their method, plugins and notes last);
    two methods at one state move apart symmetrically on a log axis, a method alone stays put."""
    handles = ["h_xl", "h_note", "h_local", "h_mine", "h_xl33"]
    labels = ["xl", "chance", "local", "my-plugin", "xl mem_len=33"]
    assert legend_order(handles, labels) == (["h_local", "h_xl", "h_xl33", "h_note", "h_mine"],
                                             ["local", "xl", "xl mem_len=33", "chance", "my-plugin"])
    moved = spread({"gated-deltanet": [100.0, 500.0], "deltanet": [100.0], "xl": [64.0]}, factor=1.1)
    assert moved["deltanet"] == [pytest.approx(100 / 1.1 ** 0.5)] and moved["xl"] == [64.0]
    assert moved["gated-deltanet"] == [pytest.approx(100 * 1.1 ** 0.5), 500.0]
    near = spread({"deltanet": [100.0], "gated-deltanet": [110.0]}, factor=1.1)  # within 15%: side by side
    centre = (100.0 * 110.0) ** 0.5
    assert near == {"deltanet": [pytest.approx(centre / 1.1 ** 0.5)], "gated-deltanet": [pytest.approx(centre * 1.1 ** 0.5)]}


def test_the_command_reports_then_rewrites_a_stale_block(tmp_path: Path, capsys) -> None:
    from memzoo.cli import main

    (tmp_path / "docs").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- generated:capacity-table -->\n| old |\n<!-- /generated -->\n")
    assert main(["figures", "--root", str(tmp_path), "--check", "--no-figures"]) == 1
    assert "stale tables: README.md" in capsys.readouterr().out and "| old |" in readme.read_text()
    assert main(["figures", "--root", str(tmp_path), "--no-figures"]) == 0
    assert "| `titans-mac` (depth 2) | 0, 1, 2 | 8,192 |" in readme.read_text()
    assert main(["figures", "--root", str(tmp_path / "nowhere")]) == 2
    assert "expected a memzoo checkout" in capsys.readouterr().err


def test_gpu_speed_facts_are_the_shipped_measured_rows_and_a_duplicate_is_refused(facts: dict[str, str]) -> None:
    """gpu-speed.ROW.ratio is the row's tokens/s over local's in the same call (docs/results.md quotes them), a
    changed row moves its fact, and two rows of one method and options are an error, not a silent pick."""
    from memzoo.publishing.facts import speed_facts
    from memzoo.publishing.references import load_measured

    rows = load_measured("gpu-speed")
    row = rows[(rows["method"] == "rmt")].iloc[0]
    assert facts["gpu-speed.rmt.ratio"] == f"{row['tokens_per_s'] / row['local_tokens_per_s']:.2f}"
    assert "gpu-speed.local.ratio" not in facts  # the reference of every call has none
    assert "<!-- fact:gpu-speed.gated-deltanet_compile-default.ratio -->" in (DOCS / "results.md").read_text()
    moved = rows.astype({"tokens_per_s": float})
    moved.loc[moved["method"] == "rmt", "tokens_per_s"] = 0.123 * row["local_tokens_per_s"]
    assert speed_facts(moved)["rmt.ratio"] == "0.12"
    with pytest.raises(ConfigError, match="two rows of 'rmt'"):
        speed_facts(pd.concat([rows, rows[rows["method"] == "rmt"]]))


def test_recall_facts_are_the_capacity_rows_and_a_changed_row_moves_them(facts: dict[str, str]) -> None:
    """capacity-top's facts in prose: chance, the reset range over methods, a method's mean and its lowest
    seed, from the shipped rows (docs/results.md quotes them); a changed row moves its fact."""
    from memzoo.publishing.facts import recall_facts

    rows = load_references("capacity-top")
    armt = rows[rows["method"] == "armt"]["recall_accuracy"]
    assert facts["capacity-top.armt.min_seed"] == f"{armt.min():.2f}" and facts["capacity-top.armt.mean"] == f"{armt.mean():.2f}"
    lo, hi = facts["capacity-top.reset_range"].split("–")
    assert float(lo) <= float(hi) and facts["capacity-top.chance"] == f"{rows['recall_chance'].mean():.2f}"
    moved = rows.copy()
    moved.loc[moved["method"] == "armt", "recall_accuracy"] = 0.2
    assert recall_facts(moved)["armt.min_seed"] == "0.20"
    assert "<!-- fact:capacity-top.reset_range -->" in (DOCS / "results.md").read_text()


def test_the_window_p_fact_is_the_paired_t_test_of_the_shipped_rows_by_hand(facts: dict[str, str]) -> None:
    """`lm-window.VARIANT.p_after`: the two-sided paired t-test over seeds of the bits per byte on
    segments >= 1 (weighted by bytes), the variant against the window floor, before Holm (prose quotes
    it beside the verdict)."""
    from scipy.stats import ttest_rel

    rows = load_references("lm-window")

    def after(method: str) -> dict[int, float]:
        got = rows[rows["method"] == method]
        return {int(r["seed"]): float(np.dot(r["bpb_by_segment"][1:], r["tokens_by_segment"][1:])
                                      / np.sum(r["tokens_by_segment"][1:])) for _, r in got.iterrows()}

    floor, gdn = after("local"), after("gated-deltanet")
    seeds = sorted(gdn)
    p = ttest_rel([gdn[s] for s in seeds], [floor[s] for s in seeds]).pvalue
    assert facts["lm-window.gated-deltanet.p_after"] == f"{p:.3f}"


def test_the_window_holm_facts_count_the_family_and_the_memories_better_after_holm(facts: dict[str, str]) -> None:
    """`lm-window.holm.*`: the comparisons in the Holm family (every variant but the floor, `full`'s
    borrowed rows included), the memory variants among them, and those better than the floor after Holm,
    in words. Of RMT and ARMT none is better (ARMT is worse after Holm: a significant loss is not counted);
    RMT moved 0.05 below the floor on every seed becomes one better."""
    from memzoo.publishing.facts import window_facts

    rows = load_references("lm-window")
    grid = rows[["method", "grid_gate_init", "grid_mem_len"]].fillna(0)  # NaN: no grid (NaN != NaN in a set)
    variants = {tuple(r) for r in grid.itertuples(index=False) if r[0] != "local"}
    words = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
             "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"]
    assert facts["lm-window.holm.memories"] == words[len(variants)]
    assert facts["lm-window.holm.comparisons"] == words[len(variants) + 1]
    few = rows[rows["method"].isin(["local", "armt", "rmt"])].copy()
    assert {k: v for k, v in window_facts(few).items() if k.startswith("holm.")} == {
        "holm.comparisons": "three", "holm.memories": "two", "holm.better": "none"}
    lowered = few["method"] == "rmt"
    few.loc[lowered, "bpb_by_segment"] = few.loc[lowered, "bpb_by_segment"].map(lambda b: [x - 0.05 for x in b])
    assert window_facts(few)["holm.better"] == "one"


def test_the_seed0_window_facts_are_one_seeds_differences_by_hand(facts: dict[str, str]) -> None:
    """`SUITE.VARIANT.seed0_*` (what one seed of the README's command prints): XL at 128 positions minus
    the floor at seed 0, on segments >= 1 (byte-weighted), over whole documents, and reset minus read."""
    rows = load_references(LM_SUITE)
    one = rows[rows["seed"] == 0]
    kept = one["grid_cache"].fillna("kv") == "kv" if "grid_cache" in one else True  # the README's command: cache=kv
    xl, floor = (one[(one["method"] == m) & (one["grid_mem_len"].fillna(128) == 128) & kept].iloc[0] for m in ("xl", "local"))

    def after(r: pd.Series, key: str = "bpb_by_segment") -> float:
        return float(np.dot(r[key][1:], r["tokens_by_segment"][1:]) / np.sum(r["tokens_by_segment"][1:]))

    sign = lambda x: f"{x:+.3f}".replace("-", "\u2212")  # noqa: E731
    key = f"{LM_SUITE}.xl_mem_len-128_cache-kv"
    assert facts[f"{key}.seed0_after"] == sign(after(xl) - after(floor))
    assert facts[f"{key}.seed0_whole"] == sign(xl["valid_bpb"] - floor["valid_bpb"])
    assert facts[f"{key}.seed0_buys"] == f"{after(xl, 'valid_bpb_by_segment_reset') - after(xl):.3f}"


@pytest.mark.parametrize("suite", ["lm-window", "lm-stream"])
def test_the_training_hours_fact_is_the_shipped_rows_tokens_over_throughput(facts: dict[str, str], suite: str) -> None:
    """`SUITE.train_hours` (the suite's cost in prose): the shipped rows' training tokens over their
    training throughput, summed, in hours (both suites fine-tune from the shipped backbone, whose own
    cost is stated with it, so no earlier stage counts)."""
    rows = load_references(suite)
    hand = float((rows["train_tokens"] / rows["train_tokens_per_s"]).sum()) / 3600
    assert abs(float(facts[f"{suite}.train_hours"]) - hand) < 0.06
