"""One call's recording: the taps on its audio, and what its record says about it.

The call holds a `Recording`. Its taps run on the transport's thread, on the media path: each copies
the piece it is given, stamps it with the time, and offers it to the writer's bounded queue, never
waiting. When the queue is full the recording is given up (`dropped`) rather than kept with a hole in
it, and the call goes on. The writer (writer.py) and the store (saver.py) move it on from `saving`.

States: `recording` -> `saving` (the call ended) -> `saved`; or `failed` (the file or the store failed),
`dropped` (the writer could not keep up), `empty` (the call ended before any audio).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from parley import metrics
from parley.audio import PIPELINE_RATE
from parley.recording.formats import CHANNELS, RATE, RecordingFormat
from parley.recording.timeline import AGENT, CALLER

State = Literal["recording", "saving", "saved", "failed", "dropped", "empty"]
SETTLED: frozenset[State] = frozenset({"saved", "failed", "dropped", "empty"})
OUTCOMES = {"saved": "ok", "failed": "failed", "dropped": "dropped"}  # parley_recordings_total{outcome}


@dataclass(frozen=True, slots=True)
class Piece:
    """Audio of one side, as a tap copied it: its first sample passed the service at `start`."""

    recording: CallRecording
    side: int
    start: float
    pcm: np.ndarray
    rate: int


class FrameSink(Protocol):
    """The writer, as a recording's taps see it: both never block; False when its queue is full."""

    def offer(self, piece: Piece) -> bool: ...

    def finish(self, recording: CallRecording) -> bool: ...


class Recording(Protocol):
    """What a call holds of its recording."""

    def caller(self, pcm: np.ndarray) -> None:
        """The caller's audio as received (16 kHz int16)."""

    def opening(self, greeting: str) -> str:
        """What the agent says first: the recording notice, when there is one, then `greeting`."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """What the call's record says of its recording (None: not recorded)."""
        ...

    def close(self) -> None:
        """The call ended: write what was recorded (never blocks)."""


class NoRecording:
    """The recording of a call that is not recorded: it keeps nothing."""

    def caller(self, pcm: np.ndarray) -> None:
        pass

    def opening(self, greeting: str) -> str:
        return greeting

    def describe(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        pass


NOT_RECORDED = NoRecording()

Report = Callable[["CallRecording"], None]


class CallRecording:
    def __init__(
        self,
        call_id: str,
        key: str,
        location: str,
        fmt: RecordingFormat,
        notice: str,
        agent_rate: int,
        sink: FrameSink,
        report: Report,
    ) -> None:
        self.call_id = call_id
        self.key = key  # where the store keeps it, decided now so that the record can say so at the end
        self.location = location
        self.format = fmt
        self.notice = notice
        self.agent_rate = agent_rate
        self._sink = sink
        self._report = report  # told of every settled state and of the call's end (metrics, the record)
        self._lock = threading.Lock()
        self._state: State = "recording"
        self._heard = False  # any audio tapped
        self._first: float | None = None
        self._last = 0.0
        self.duration_s: float | None = None
        self.file_written = False  # the writer is done with it: what is tapped after is not kept

    # the taps (the transport's thread)

    def caller(self, pcm: np.ndarray) -> None:
        now = time.monotonic()
        self._tap(CALLER, now - pcm.size / PIPELINE_RATE, now, pcm, PIPELINE_RATE)

    def agent(self, frame: np.ndarray) -> None:
        """A frame the transport pulled from the Outbound: it starts playing now."""
        now = time.monotonic()
        self._tap(AGENT, now, now + frame.size / self.agent_rate, frame, self.agent_rate)

    def _tap(self, side: int, start: float, end: float, pcm: np.ndarray, rate: int) -> None:
        if self._state != "recording" or not pcm.size:
            return
        if self._first is None:
            self._first = start
        self._last = max(self._last, end)
        self._heard = True
        if not self._sink.offer(Piece(self, side, start, pcm.copy(), rate)):
            self.settle("dropped")

    # the call's side

    def opening(self, greeting: str) -> str:
        return " ".join(part for part in (self.notice.strip(), greeting.strip()) if part)

    def close(self) -> None:
        with self._lock:
            if self._state != "recording":
                return
            self._state = "saving" if self._heard else "empty"
            if self._first is not None:
                self.duration_s = round(self._last - self._first, 2)
        self._report(self)
        if self._state == "saving" and not self._sink.finish(self):
            self.settle("dropped")

    @property
    def state(self) -> State:
        return self._state

    def written(self, duration_s: float) -> None:
        """The writer finished the file: the recording lasts `duration_s`."""
        self.duration_s = round(duration_s, 2)
        self.file_written = True

    def settle(self, state: State) -> bool:
        """Move to a final state (from any thread), counted; False if it had one already."""
        with self._lock:
            if self._state in SETTLED:
                return False
            self._state = state
        if state in OUTCOMES:
            metrics.RECORDINGS_TOTAL.labels(outcome=OUTCOMES[state]).inc()
        self._report(self)
        return True

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "location": self.location,
                "format": self.format.name,
                "codec": self.format.codec,
                "sample_rate": RATE,
                "channels": list(CHANNELS),
                "duration_s": self.duration_s,
                "state": self._state,
            }
