"""memzoo.analysis.beyond_window on hand-made rows: the ceiling check, headroom beside its segment-0
correction, and the per-class differences from the floor by seed and by document, each against numbers
worked by hand."""
from __future__ import annotations

import pandas as pd
import pytest

from memzoo.analysis.beyond_window import (band_table, ceiling_check, class_differences, floor_name, headroom_table,
                                           one_span)

T975_2 = 4.302652729911275  # Student's t, 97.5%, 2 degrees of freedom

LOCAL_FIRST, LOCAL_AFTER = [2.0, 2.1, 2.2], [1.8, 1.9, 2.0]
OFFSETS = {  # method: (segment 0 minus local's, segments >= 1 minus local's), per seed
    "local": ([0, 0, 0], [0, 0, 0]),
    "full": ([0.05, 0.04, 0.06], [-0.3, -0.3, -0.3]),
    "m": ([0.02, 0.02, 0.02], [-0.12, -0.15, -0.18]),
}


def rows(span: int = 128, **changed: tuple[list[float], list[float]]) -> pd.DataFrame:
    out = []
    for method, (first, after) in {**OFFSETS, **changed}.items():
        for seed in range(3):
            beyond = [1.0 + 0.1 * seed, 2.0] if method != "m" else [0.8 + 0.1 * seed, 1.9]  # bits of two documents
            out.append({"method": method, "seed": seed, "attention_span": span,
                        "bpb_by_segment": [LOCAL_FIRST[seed] + first[seed], LOCAL_AFTER[seed] + after[seed]],
                        "tokens_by_segment": [1, 1], "bits_by_doc_copy_beyond": beyond, "tokens_by_doc_copy_beyond": [1, 1],
                        "bits_by_doc_band_0-7": [1.0, 1.0], "tokens_by_doc_band_0-7": [1, 1]})
    return pd.DataFrame(out)


def test_headroom_and_its_segment_0_correction_by_hand() -> None:
    """gap = local - full on segments >= 1 = 0.3 every seed; m's gain 0.12, 0.15, 0.18: headroom 0.5.
    Corrected: gap - (local - full at segment 0) = 0.35, 0.34, 0.36; gain + 0.02: 0.14, 0.17, 0.20:
    0.17 / 0.35."""
    table = headroom_table(rows()).set_index("variant")
    assert table.loc["m", "headroom"] == pytest.approx(0.5)
    assert table.loc["m", "headroom_corrected"] == pytest.approx(0.17 / 0.35)
    assert table.loc["full", "headroom"] == pytest.approx(1.0) and table.loc["local", "headroom"] == pytest.approx(0.0)
    assert table.loc["m", "headroom_status"] == "bounded"


def test_the_ceiling_check_by_hand() -> None:
    """full - floor at segment 0: 0.05, 0.04, 0.06, mean 0.05 ± t(2) 0.01 / sqrt 3: not within ±0.01,
    so the ceiling fails there; m is not better than full on segments >= 1 (0.18, 0.15, 0.12 worse)."""
    check = ceiling_check(rows())
    assert check["full_seg0_vs_floor"] == pytest.approx(0.05)
    assert check["full_seg0_ci"] == pytest.approx(T975_2 * 0.01 / 3 ** 0.5)
    assert not check["seg0_holds"] and check["better_than_full"] == [] and not check["holds"]
    assert ceiling_check(rows(full=([0.004, -0.006, 0.002], [-0.3] * 3)))["holds"]  # mean 0 ± 0.013
    wide = ceiling_check(rows(full=([0.05, -0.01, 0.02], [-0.3] * 3)))  # mean 0.02 ± 0.075: covers 0, beyond ±0.01
    assert wide["full_seg0_ci"] > wide["full_seg0_vs_floor"] > 0.01 and not wide["seg0_holds"]
    assert ceiling_check(rows(m=([0, 0, 0], [-0.4, -0.41, -0.42])))["better_than_full"] == ["m"]


def test_class_differences_by_seed_and_by_document() -> None:
    """m on the beyond-window class: per seed (0.8 + 0.1 s + 1.9) / 2 against (1.0 + 0.1 s + 2.0) / 2,
    -0.15 every seed (no spread: half-width 0); per document -0.2 and -0.1, mean -0.15 ± t(1) 0.05 / sqrt 2."""
    table = class_differences(rows(), "copy_beyond").set_index("variant")
    assert table.loc["m", "diff_vs_floor"] == pytest.approx(-0.15) and table.loc["m", "ci"] == pytest.approx(0.0, abs=1e-12)
    assert table.loc["m", "doc_diff"] == pytest.approx(-0.15) and table.loc["m", "docs"] == 2
    assert table.loc["m", "doc_ci"] == pytest.approx(12.706204736174696 * (0.1 / 2 ** 0.5) / 2 ** 0.5)
    assert table.loc["full", "diff_vs_floor"] == pytest.approx(0.0) and table.loc["local", "diff_vs_floor"] == 0.0
    assert set(band_table(rows())["class"]) == {"copy_beyond", "band_0-7"}


def test_spans_are_never_mixed_and_the_floor_is_named() -> None:
    assert floor_name(rows()) == "window floor (local, W = 128)" and floor_name(rows(0)) == "local"
    with pytest.raises(ValueError, match=r"attention_span \[0, 128\] mixed"):
        one_span(pd.concat([rows(0), rows(128)]))


def test_a_ceiling_above_the_floor_leaves_no_headroom() -> None:
    """full worse than the floor on segments >= 1 at every seed: no headroom to recover, raw or corrected."""
    table = headroom_table(rows(full=([0.05, 0.04, 0.06], [0.05, 0.06, 0.07]))).set_index("variant")
    assert table.loc["m", "headroom_status"] == "no headroom (full above local)" and table.loc["m", "headroom"] is None
    assert table.loc["m", "headroom_corrected_status"] == "no headroom (full above local)"


def test_the_bands_table_reads_each_band_against_the_floor() -> None:
    """m's bytes 0-7 read 0.9 bits against the floor's 1.0 at every seed: -0.100 ± 0, significant; a band
    no row measured is a dash, and the floor has no row of its own."""
    from memzoo.publishing.tables import lm_window_bands

    data = rows()
    data["bits_by_doc_band_0-7"] = [[0.9, 0.9] if m == "m" else [1.0, 1.0] for m in data["method"]]
    lines = lm_window_bands(data).splitlines()
    assert lines[0].startswith("| method | seeds | bytes 0–7 | bytes 8–15 |")
    (m_row,) = [line for line in lines if line.startswith("| `m` |")]
    assert m_row.split(" | ")[1:4] == ["0, 1, 2", "−0.100 ± 0.000 *", "–"]
    assert not any(line.startswith("| `local` |") for line in lines)


def test_variant_labels_read_whole_grid_values_without_a_decimal_point() -> None:
    """A grid column that holds NaN for another method's rows is float: 33 must still read `mem_len=33`."""
    from memzoo.analysis.results import variant_labels

    df = pd.DataFrame({"method": ["xl", "xl", "local", "m", "m"], "grid_mem_len": [128.0, 33.0, None, None, None],
                       "grid_decay": [None, None, None, 0.5, 0.25]})
    assert variant_labels(df).tolist() == ["xl mem_len=128", "xl mem_len=33", "local", "m decay=0.5", "m decay=0.25"]


def test_headroom_on_beyond_window_copyable_bytes_by_hand() -> None:
    """full's beyond-window bytes per seed (0.5 + 0.1 s + 1.5) / 2 against the floor's (1.0 + 0.1 s + 2.0) / 2:
    a gap of 0.5 every seed; m's (0.8 + 0.1 s + 1.9) / 2 recovers 0.15 of it: 0.3. Where full's rows carry
    no copy classes (borrowed rows), there is no such headroom."""
    data = rows()
    data["bits_by_doc_copy_beyond"] = [[0.5 + 0.1 * s, 1.5] if m == "full" else b
                                       for m, s, b in zip(data["method"], data["seed"], data["bits_by_doc_copy_beyond"])]
    table = headroom_table(data).set_index("variant")
    assert table.loc["m", "headroom_beyond"] == pytest.approx(0.3) and table.loc["m", "headroom_beyond_status"] == "bounded"
    assert table.loc["full", "headroom_beyond"] == pytest.approx(1.0)
    assert table.loc["m", "headroom"] == pytest.approx(0.5)  # segments >= 1 unchanged
    data.loc[data["method"] == "full", "bits_by_doc_copy_beyond"] = None
    assert "headroom_beyond" not in headroom_table(data).columns


def test_the_headline_table_gives_headroom_on_both_byte_classes() -> None:
    """The headline rows for the hand-made suite: m recovers 0.5 on segments >= 1 and 0.3 on beyond-window
    copyable bytes (no spread over seeds there: the interval is the point); the floor is named."""
    from memzoo.publishing.tables import headroom_md

    data = rows()
    data["bits_by_doc_copy_beyond"] = [[0.5 + 0.1 * s, 1.5] if m == "full" else b
                                       for m, s, b in zip(data["method"], data["seed"], data["bits_by_doc_copy_beyond"])]
    data["footprint_measured"] = [{"local": 0, "full": 99, "m": 10}[m] for m in data["method"]]
    lines = {line.split(" | ")[0]: line.split(" | ") for line in headroom_md(data).splitlines()[2:]}
    assert lines["| `m`"][5].startswith("0.50 [") and lines["| `m`"][6] == "0.30 [0.30, 0.30] |"
    assert lines["| `local`"][5:] == ["0 (the floor)", "0 (the floor) |"]
    assert lines["| `full`"][3] == "−0.300 ± 0.000 *"
