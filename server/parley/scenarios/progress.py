"""What `parley test` prints while its scenarios run: a progress bar redrawn in place on a terminal, and
one line per finished scenario (PASS, or FAIL with its first failure) on any stream, so a CI log holds
the results and nothing else.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import TextIO

from parley.scenarios.results import ScenarioResult

_BAR_WIDTH = 20
_GREEN = "\x1b[32m"
_RED = "\x1b[31m"
_DIM = "\x1b[2m"
_RESET = "\x1b[0m"
_CLEAR_LINE = "\r\x1b[K"


class Progress:
    """The run's terminal output. The bar (`started`, `turn`) is drawn only on a TTY, where a carriage
    return rewrites it; a log file or a CI's pipe gets only `finished`'s result lines."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        # Resolved on use, not as a default argument, so a redirected sys.stderr (tests, a wrapper) counts.
        self._stream = stream if stream is not None else sys.stderr
        self._total = total
        self._live = _is_tty(self._stream)
        self._colour = self._live and not os.environ.get("NO_COLOR")  # no-color.org: any non-empty value
        self._began = time.monotonic()
        self._passed = 0
        self._failed = 0
        self._name = ""
        self._turn = 0
        self._drawn = False

    def started(self, name: str) -> None:
        """A scenario's call is being placed."""
        self._name = name
        self._turn = 0
        self._draw()

    def turn(self, index: int) -> None:
        """The running scenario's caller is on its turn `index` (from 1)."""
        self._turn = index
        self._draw()

    def finished(self, result: ScenarioResult) -> None:
        """A scenario is over: one line saying how it went, in place of the bar."""
        if result.passed:
            self._passed += 1
        else:
            self._failed += 1
        self._clear()
        self._stream.write(self.result_line(result) + "\n")
        self._stream.flush()

    def summary(self) -> str:
        """The run in one line, "5 passed, 1 failed in 93 s", for the caller to print last."""
        parts = [f"{self._passed} passed"]
        if self._failed:
            parts.append(f"{self._failed} failed")
        not_run = self._total - self._passed - self._failed
        if not_run > 0:
            parts.append(f"{not_run} not run")
        return f"{', '.join(parts)} in {_elapsed(time.monotonic() - self._began)}"

    def result_line(self, result: ScenarioResult) -> str:
        """'PASS  order lookup (sip, 14.2 s, p50 0.71 s)', or 'FAIL  ...: ' and the first failure."""
        facts = [result.transport or "?", f"{result.duration_s:.1f} s"]
        if result.passed:
            if result.response_p50_s is not None:
                facts.append(f"p50 {result.response_p50_s:.2f} s")
            return f"{self._paint('PASS', _GREEN)}  {result.name} ({', '.join(facts)})"
        found = result.all_failures()
        first = found[0] if found else "failed"
        more = f" {self._paint(f'(and {len(found) - 1} more)', _DIM)}" if len(found) > 1 else ""
        return f"{self._paint('FAIL', _RED)}  {result.name} ({', '.join(facts)}): {first}{more}"

    def _draw(self) -> None:
        if not self._live:
            return
        done = self._passed + self._failed
        filled = round(_BAR_WIDTH * done / self._total) if self._total else _BAR_WIDTH
        line = f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {done}/{self._total} scenarios · {self._name}"
        if self._turn:
            line += f" · turn {self._turn}"
        # A line longer than the terminal wraps, and a carriage return then rewrites only its last row.
        width = shutil.get_terminal_size().columns - 1
        self._stream.write(_CLEAR_LINE + line[:width])
        self._stream.flush()
        self._drawn = True

    def _clear(self) -> None:
        if self._drawn:
            self._stream.write(_CLEAR_LINE)
            self._drawn = False

    def _paint(self, text: str, colour: str) -> str:
        return f"{colour}{text}{_RESET}" if self._colour else text


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed stream, or a stand-in without isatty
        return False


def _elapsed(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
