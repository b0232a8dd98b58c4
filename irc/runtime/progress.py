"""A progress bar with an estimate, on stderr, for kernels on Triton's interpreter.

The interpreter runs a grid's programs one after another, each in Python: a
large kernel can take minutes with nothing shown. While irc runs kernels there
(`irc.runtime.interpreter.run_interpreted`), each launch's programs are counted
and, once a launch has run for `SHOW_AFTER_S` and is estimated to take more
than `SHOW_IF_TOTAL_S` in all, a bar shows how far it is and how long is left
(the time a program so far, times the programs left).

Shown only where someone can see it: stderr is a terminal, or `IRC_PROGRESS=1`
(`irc-run --progress`) asks for it; `IRC_PROGRESS=0` turns it off. Captured
stderr (pytest) is not a terminal, so tests stay quiet.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

PROGRESS_ENV = "IRC_PROGRESS"
SHOW_AFTER_S = 1.0
SHOW_IF_TOTAL_S = 3.0
WIDTH = 30


def wanted(stream: TextIO) -> bool:
    """Whether to show progress on `stream`: asked for, or a terminal not told off."""
    asked = os.environ.get(PROGRESS_ENV, "")
    if asked in ("0", "1"):
        return asked == "1"
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressBar:
    """One launch's programs: `step()` after each, `close()` at the end."""

    def __init__(
        self,
        total: int,
        label: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool | None = None,
    ):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.clock = clock
        self.enabled = wanted(self.stream) if enabled is None else enabled
        self.start = clock()
        self.done = 0
        self.shown = False
        self.last = ""

    def estimate_left_s(self) -> float | None:
        """Seconds left: the time a program so far times the programs left."""
        if self.done == 0:
            return None
        return (self.clock() - self.start) / self.done * (self.total - self.done)

    def line(self) -> str:
        filled = WIDTH * self.done // self.total
        left = self.estimate_left_s()
        eta = "" if left is None else f", {left:.0f} s left"
        bar = "#" * filled + "." * (WIDTH - filled)
        return f"\r{self.label[:40]} [{bar}] {self.done}/{self.total} programs{eta}"

    def step(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        elapsed = self.clock() - self.start
        left = self.estimate_left_s()
        if not self.shown:
            if elapsed < SHOW_AFTER_S or left is None or elapsed + left < SHOW_IF_TOTAL_S:
                return
            self.shown = True
        text = self.line()
        if text != self.last:
            self.stream.write(text)
            self.stream.flush()
            self.last = text

    def close(self) -> None:
        """Ends the bar's line, if one was shown (nothing otherwise)."""
        if self.shown:
            took = self.clock() - self.start
            self.stream.write(f"\r{self.label[:40]}: {self.total} programs in {took:.1f} s\n")
            self.stream.flush()
            self.shown = False
