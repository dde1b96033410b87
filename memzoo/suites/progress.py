"""A suite's progress on the console: a bar on a terminal, a line per finished run elsewhere."""
from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


class SuiteProgress:
    """A suite's progress: a redrawn bar on a terminal; written to a file or a pipe, one line per
    finished run and a summary every `every` seconds (a redrawn bar there leaves megabytes of
    carriage returns)."""

    def __init__(self, name: str, total_steps: int, done_steps: int, runs: int, runs_done: int, enabled: bool,
                 every: float = 60.0, stream=None):
        self.name, self.total, self.runs, self.runs_done, self.every = name, total_steps, runs, runs_done, every
        self.stream = stream if stream is not None else sys.stderr
        self.enabled, self.start, self.last = enabled, time.monotonic(), time.monotonic()
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = tqdm(total=total_steps, initial=done_steps, desc=f"suite {name}", unit="step", file=self.stream,
                        dynamic_ncols=True) if self.tty else None
        self.steps = done_steps

    def _line(self, text: str) -> None:
        if self.enabled:
            print(f"suite {self.name} [{time.monotonic() - self.start:,.0f} s]: {text}", file=self.stream, flush=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            self._line(text)

    def run_finished(self, name: str, ok: bool) -> None:
        self.runs_done += 1
        if self.bar is None:
            self._line(f"run {name} {'finished' if ok else 'failed'} ({self.runs_done}/{self.runs} runs)")

    def update(self, finished_steps: int, running: dict[str, tuple[int, int]]) -> None:
        """finished_steps: steps of finished runs; running: {run: (step, steps)} of the active ones."""
        self.steps = finished_steps + sum(step for step, _ in running.values())
        if self.bar is not None:
            self.bar.n = self.steps
            self.bar.set_postfix_str(" ".join(f"{n}:{s}/{t}" for n, (s, t) in running.items())[:200])
            self.bar.refresh()
        elif time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            active = ", ".join(f"{n} {s}/{t}" for n, (s, t) in running.items())
            self._line(f"{self.steps:,}/{self.total:,} steps, {self.runs_done}/{self.runs} runs done; running: {active}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
