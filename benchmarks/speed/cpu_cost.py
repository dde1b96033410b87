"""CPU cost, measured side by side: one training window (forward and backward, as training calls it) of
every variant of a suite, in one process on one thread, in interleaved rounds, the median per variant and
its speed against `local` timed in the same rounds (memzoo.suites.cpu_cost), at each number of bytes
carried before the window. The rows are shipped as memzoo/references/cpu-cost.csv, which `memzoo figures`
draws into docs/cpu-cost.md and docs/cpu-cost/speed.png.

    python benchmarks/speed/cpu_cost.py [--suite lm-window] [--rounds 5] [--carried 0,1024,3072]
                                        [--methods local,full,...] [--threads 1] [--note TEXT] [--out FILE]
    python benchmarks/speed/cpu_cost.py --profile titans-mag [--carried 0]

The rows of the variants measured (and `local`'s) replace those of the same suite, variant and carried bytes
already in --out (default the shipped file); the others are kept. The file is written atomically after
every round (with the rounds so far), so a run cut off keeps what it measured.
--profile prints torch.profiler's table of one window of `local` and of the variant (a method or a label,
"xl mem_len=33"), with the matrix products' FLOPs of each, instead of timing the suite.
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from memzoo.evaluations.harness import atomic_csv
from memzoo.publishing.references import rows_path
from memzoo.suites.cpu_cost import CARRIED, COLUMNS, measure, profile_window


def existing(path: Path) -> list[dict]:
    """The rows already in `path` (none when it does not exist), in the columns of COLUMNS."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [{k: r.get(k, "") for k in COLUMNS} for r in csv.DictReader(f)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="lm-window")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--carried", default=",".join(map(str, CARRIED)), help="bytes streamed before the window, comma-separated")
    ap.add_argument("--methods", default=None, help="comma-separated; default the suite's (local is always timed)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--note", default="", help="said in every row (what else ran on the machine)")
    ap.add_argument("--out", default=str(rows_path("cpu-cost")))
    ap.add_argument("--profile", default=None, metavar="VARIANT", help="profile one window of VARIANT and local instead")
    args = ap.parse_args()
    carried = [int(c) for c in args.carried.split(",")]
    if args.profile:
        for res in profile_window(args.suite, args.profile, carried[0], threads=args.threads):
            print(f"== {res['variant']}: {res['cpu_s']:.2f} CPU s ({res['wall_s']:.2f} s wall) under the profiler, "
                  f"{res['matmul_gflop']:.1f} GFLOP in matrix products, {res['aten_calls']:,} aten calls")
            print(res["table"])
        return
    methods = args.methods.split(",") if args.methods else None
    out = Path(args.out)
    before = existing(out)  # the file as it was: each round's rows replace their own only

    def save(rows: list[dict]) -> None:  # after every round, so a run cut off keeps the rounds it finished
        new = {(r["suite"], r["variant"], str(r["carried_bytes"])) for r in rows}
        atomic_csv(out, [r for r in before if (r["suite"], r["variant"], str(r["carried_bytes"])) not in new] + rows)

    rows = measure(args.suite, args.rounds, carried, methods, threads=args.threads, note=args.note,
                   log=lambda line: print(line, flush=True), save=save)
    for r in rows:
        print(f"{r['variant']:28s} {r['carried_bytes']:>5} bytes  {r['median_s']:6.2f} CPU s  "
              f"(wall {r['wall_median_s']:6.2f} s)  speed vs local {r['speed_vs_local']:.2f}", flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
