"""`memzoo check PLUGIN`: find the memories a plugin registers and run every invariant on each, so
a researcher learns in one command whether a new memory is correct (the tests run the same checks)."""
from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from memzoo.core.config import ConfigError
from memzoo.core.plugins import get_memory
from memzoo.conformance.invariants import INVARIANTS
from memzoo.conformance.tiny import TINY_OPTIONS, NotApplicable


@dataclass
class CheckResult:
    memory: str
    invariant: str
    status: str  # PASS, FAIL or SKIP
    message: str = ""  # what failed and where (FAIL), why it was not checked (SKIP)


def plugin_memories(plugin: str) -> list[str]:
    """The names a plugin registers: a `.py` file, a module path, or an installed entry point's name
    (memzoo.suites.compare.plugin_methods, which `memzoo scorecard` uses too)."""
    from memzoo.suites.compare import plugin_methods  # here: compare imports pandas, which checking does not need

    return plugin_methods(plugin)[0]


def memory_options(method: str, options: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The options a memory is checked with: its tiny in-tree defaults, then the user's; a wrong key is an error."""
    merged = {**TINY_OPTIONS.get(method, {}), **(options or {})}
    fields = {f.name for f in dataclasses.fields(get_memory(method).config_cls)}
    unknown = sorted(set(merged) - fields)
    if unknown:
        raise ConfigError(f"{method}: unknown option(s) {unknown}; its config has {sorted(fields)}")
    return merged


def run_checks(names: list[str], options: Optional[dict[str, Any]] = None,
               only: Optional[list[str]] = None) -> Iterator[CheckResult]:
    """Every invariant (or those in `only`) on every memory, one result each, as they finish."""
    chosen = {k: f for k, f in INVARIANTS.items() if only is None or k in only}
    for name in names:
        opts = memory_options(name, options)
        for invariant, check in chosen.items():
            yield run_one(name, invariant, check, opts)


def device_checks(names: list[str], device: str, options: Optional[dict[str, Any]] = None) -> Iterator[CheckResult]:
    """Each memory on `device` against the float64 CPU oracle (memzoo.conformance.device), one result per
    precision (device-fp32, device-tf32, device-bf16); SKIP when `device` is CUDA and none is here."""
    import torch

    from memzoo.conformance.device import check, first_line

    for name in names:
        if device.startswith("cuda") and not torch.cuda.is_available():
            yield CheckResult(name, "device", "SKIP", f"--device {device}: no CUDA device here")
            continue
        try:
            rows = check(name, name, memory_options(name, options), torch.device(device))
        except Exception as err:  # the plugin failed on the device: a finding, named
            yield CheckResult(name, "device", "FAIL", f"raised {first_line(err)}")
            continue
        for r in rows:
            errors = f"logits {r['logits_rel']:.1e}, state {r['state_rel']:.1e}, grads {r['grad_rel']:.1e} (tol {r['tol']:.0e})"
            detail = errors if r["ok"] else f"{errors}; worst gradient {r['worst_grad']}; oracle {r['oracle']}"
            yield CheckResult(name, f"device-{r['precision']}", "PASS" if r["ok"] else "FAIL", detail)


def run_one(name: str, invariant: str, check: Callable[[str, dict[str, Any]], None], options: dict[str, Any]) -> CheckResult:
    """One invariant on one memory: an AssertionError is a FAIL, any other error a FAIL with its traceback's last line."""
    try:
        check(name, options)
    except NotApplicable as why:
        return CheckResult(name, invariant, "SKIP", str(why))
    except AssertionError as err:
        return CheckResult(name, invariant, "FAIL", str(err) or "assertion failed")
    except Exception as err:  # the plugin raised: that is a failure of the check, where it happened
        where = traceback.extract_tb(err.__traceback__)[-1]
        return CheckResult(name, invariant, "FAIL",
                           f"raised {type(err).__name__}: {err} ({Path(where.filename).name}:{where.lineno})")
    return CheckResult(name, invariant, "PASS")
