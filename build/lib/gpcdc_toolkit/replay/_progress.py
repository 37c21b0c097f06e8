"""Showing a replay's progress: a status line in a terminal, a bar in a notebook."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ._replayer import Progress


class StatusLine:
    """Rewrites one line on a terminal; elsewhere (a log, CI) prints a line every
    ``every`` seconds, the first after ``every`` seconds (the caller prints the final
    figures)."""

    def __init__(self, stream: TextIO | None = None, every: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every = every
        self._printed = time.monotonic()

    def __call__(self, progress: Progress) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + progress.line())
            self.stream.flush()
        elif time.monotonic() - self._printed >= self.every:
            self.stream.write(progress.line() + "\n")
            self.stream.flush()
            self._printed = time.monotonic()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


class ProgressBar:
    """A notebook progress bar (tqdm's widget): transactions applied, with rows,
    rate, pending and lag alongside."""

    def __init__(self, description: str = "replay") -> None:
        from tqdm.auto import tqdm

        self.bar: Any = tqdm(desc=description, unit="tx")

    def __call__(self, progress: Progress) -> None:
        self.bar.update(progress.transactions - self.bar.n)
        self.bar.set_postfix(rows=progress.rows, pending=progress.pending, lag=f"{progress.lag_ms / 1000:.1f}s",
                             refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
