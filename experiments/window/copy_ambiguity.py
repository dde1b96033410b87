"""Why natural text is harder to copy from far back than a random string: how many distractors a lookup
by the last k bytes meets in the copy probe's rows (memzoo.evaluations.copy_distance.probe_rows, the
rows every suite's copy probe reads). For each byte of the second copy, count the earlier places whose
preceding k bytes equal the k bytes before it but whose next byte differs from the right one: a head
that finds the first copy by its last k bytes alone is misled by each of them. Data only, no model.

    python experiments/window/copy_ambiguity.py [--out experiments/window/copy_ambiguity.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from memzoo.analysis.copy_distance import wrong_matches
from memzoo.data.corpus import load_documents, split_documents
from memzoo.evaluations.copy_distance import DISTANCES, KINDS, SKIP, probe_rows
from memzoo.suites.compare import expand, load_suite

KEYS = (1, 2, 4, 8)  # lookup key lengths in bytes
CHUNK = 32  # the probe's chunk_len


def distractors(row: np.ndarray, distance: int, k: int) -> float:
    """Mean over the second copy's predicted bytes (after SKIP) of the earlier positions whose k preceding
    bytes match and whose byte differs from the byte to predict."""
    return float(np.mean(list(wrong_matches(row, distance, k, CHUNK, SKIP).values())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the table as JSON here")
    args = ap.parse_args()
    cfg = expand(load_suite("lm-window-rope3", ["methods=[local]", "seeds=[0]"]))[0].cfg
    texts = [d.data for d in split_documents(load_documents(cfg.data), cfg.data)[cfg.eval.split]]
    table: dict[str, dict[str, dict[str, float]]] = {}
    for kind in KINDS:
        for d in DISTANCES:
            rows = probe_rows(texts, d, CHUNK, kind, rows=16).numpy()  # [16, d + CHUNK + 1]
            table.setdefault(kind, {})[str(d)] = {f"k={k}": round(float(np.mean([distractors(r, d, k) for r in rows])), 2)
                                                  for k in KEYS}
            print(kind, d, table[kind][str(d)])
    if args.out:
        args.out.write_text(json.dumps({"mean_distractors_per_byte": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
