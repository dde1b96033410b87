"""Named intermediate tensors a memory shows to a listener: a plugin calls `probe(name, **values)` at
the points its docstring names, and a measure that needs a memory's inside listens with `recording`.
With no listener a probe does nothing; a listener only reads, so the outputs stay bit-identical."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

Listener = Callable[[str, dict[str, Any]], None]

_listeners: list[Listener] = []


def probe(name: str, **values: Any) -> None:
    """Show `values` (tensors and numbers, as the plugin computed them) under `name` to every listener."""
    for listener in _listeners:
        listener(name, values)


def listening() -> bool:
    """Whether any listener is recording (a compiled path, which cannot call out, then runs eagerly)."""
    return bool(_listeners)


@contextmanager
def recording(listener: Optional[Listener] = None,
              names: Optional[set[str]] = None) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Listen while inside: `listener(name, values)` per probe, or (none given) every probe kept in
    call order in the yielded list. `names`: only these probes (an unknown name is kept out, not refused)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def listen(name: str, values: dict[str, Any]) -> None:
        if names is not None and name not in names:
            return
        if listener is None:
            seen.append((name, values))
        else:
            listener(name, values)

    _listeners.append(listen)
    try:
        yield seen
    finally:
        _listeners.remove(listen)
