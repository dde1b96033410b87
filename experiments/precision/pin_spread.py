"""How far the float64 pinned logits (memzoo.conformance.pinned; tests/test_hook_pin.py) move on this CPU against the fixture,
at 1 and at all threads: the measurement the pin's tolerance is set from.

    python experiments/precision/pin_spread.py            # also under ATEN_CPU_CAPABILITY=avx2|default
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

ALL_THREADS = torch.get_num_threads()  # before the tests' conftest sets one thread
from memzoo.conformance.pinned import PINNED, pinned_logits

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "golden_logits.json"  # the pin's golden logits


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    golden = json.loads(FIXTURE.read_text())
    print(f"{cpu_name()}; torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()} "
          f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})")
    worst = 0.0
    for threads in sorted({1, ALL_THREADS}):
        torch.set_num_threads(threads)
        diffs = {m: float((pinned_logits(m) - torch.tensor(golden[m], dtype=torch.float64)).abs().max()) for m in PINNED}
        worst = max(worst, *diffs.values())
        print(f"{threads:2d} thread(s): " + ", ".join(f"{m} {d:.1e}" for m, d in diffs.items()))
    print(f"largest move from the fixture: {worst:.2e}")


if __name__ == "__main__":
    main()
