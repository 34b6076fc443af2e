"""Keypad entry: DTMF digits collected into one entry, the way a caller types a number on a phone.

An entry ends at '#' (kept, so the LLM sees it was confirmed) or when no key followed for the timeout.
Runs on the call's VAD thread, which also supplies the clock (frames arrive every 20 ms, and the stage
polls when they do not).
"""

from __future__ import annotations

DIGITS = frozenset("0123456789*#ABCD")
MAX_ENTRY = 32  # longer than any number a caller types: the entry ends there


class KeypadEntry:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._digits: list[str] = []
        self._last_at = 0.0

    def push(self, digit: str, now: float) -> str | None:
        """Add a digit; the finished entry when this digit ends it, else None."""
        if digit not in DIGITS:
            return None
        self._digits.append(digit)
        self._last_at = now
        if digit == "#" or len(self._digits) >= MAX_ENTRY:
            return self._take()
        return None

    def poll(self, now: float) -> str | None:
        """The entry, once its last key is `timeout_s` old."""
        if self._digits and now - self._last_at >= self.timeout_s:
            return self._take()
        return None

    def _take(self) -> str:
        entry = "".join(self._digits)
        self._digits.clear()
        return entry
