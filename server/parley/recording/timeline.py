"""Two mono streams, the caller's and the agent's, laid on one clock as a stereo recording.

Each side hands over its audio in pieces stamped with the time (monotonic) their first sample passed the
service. A piece that starts later than the side's audio so far ends leaves silence before it: the side
sent nothing meanwhile (a caller's phone that sends no packets in silence, a transport that stopped
pulling while it played keypad tones). A piece that arrives early (a burst after network jitter) is
appended where the side's audio ends, never overlapping what is there, so nothing is lost and the side
catches up by itself. A side that sends nothing at all is filled with silence `LAG_S` behind the clock,
so the other side's audio never piles up waiting for it.
"""

from __future__ import annotations

import numpy as np

CALLER = 0  # the left channel
AGENT = 1  # the right channel
# Gaps shorter than this are jitter, not silence: pieces close up instead (a 20 ms frame stamped a few
# milliseconds late would otherwise leave a click of silence before it).
SLACK_S = 0.06
# How far behind the clock a silent side is filled in: a piece arriving later than this is shifted late.
LAG_S = 0.5


class StereoTimeline:
    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._origin: float | None = None  # the time of sample 0
        self._placed = [0, 0]  # samples laid on each side, silence included
        self._taken = 0  # samples handed out as stereo
        self._pending: list[list[np.ndarray]] = [[], []]

    @property
    def duration_s(self) -> float:
        """The length of what was laid so far: the longer side."""
        return max(self._placed) / self.rate

    def add(self, side: int, start: float, pcm: np.ndarray) -> None:
        """Lay `pcm` (int16 at `rate`) on `side`, its first sample at `start` (time.monotonic())."""
        if self._origin is None:
            self._origin = start
        gap = round((start - self._origin) * self.rate) - self._placed[side]
        if gap > SLACK_S * self.rate:
            self._lay(side, np.zeros(gap, dtype=np.int16))
        self._lay(side, pcm)

    def append(self, side: int, pcm: np.ndarray) -> None:
        """Lay `pcm` right after the side's audio so far (the last of a resampler's output)."""
        self._lay(side, pcm)

    def take(self, now: float | None) -> np.ndarray:
        """The stereo audio (n x 2 int16) laid on both sides since the last take. `now`: the clock, to
        fill in a side that sent nothing for longer than LAG_S; None: the end, the shorter side padded."""
        if now is None:
            end = max(self._placed)
        elif self._origin is None:
            return np.zeros((0, 2), dtype=np.int16)
        else:
            end = max(round((now - self._origin - LAG_S) * self.rate), min(self._placed))
        for side in (CALLER, AGENT):
            if self._placed[side] < end:
                self._lay(side, np.zeros(end - self._placed[side], dtype=np.int16))
        count = end - self._taken
        if count <= 0:
            return np.zeros((0, 2), dtype=np.int16)
        self._taken = end
        return np.stack([self._take_side(CALLER, count), self._take_side(AGENT, count)], axis=1)

    def _lay(self, side: int, pcm: np.ndarray) -> None:
        if pcm.size:
            self._pending[side].append(pcm)
            self._placed[side] += pcm.size

    def _take_side(self, side: int, count: int) -> np.ndarray:
        audio = np.concatenate(self._pending[side]) if self._pending[side] else np.zeros(0, np.int16)
        rest = audio[count:]
        self._pending[side] = [rest] if rest.size else []
        return audio[:count]
