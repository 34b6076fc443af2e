"""Outbound: a call's outgoing audio, pulled by the transport one 20 ms frame at a time.

Items are reply audio chunks tagged with (turn, revision, generation) and control markers (end of a
response, end of the call). The transport pulls at its own pace and always gets a full frame: silence
when nothing may play. What may play is decided at the head of the queue by the call's gate (a stale
generation is dropped; a revision still in its reopen grace, or with a reopen candidate pending, is
held back). A barge-in pauses the audio at once (nothing is lost, it can resume where it stopped) and,
once confirmed, flushes it: audio goes, control markers stay in order ahead of anything added later.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from parley.audio import samples_per_frame
from parley.pipeline.messages import (
    AudioChunk,
    EndOfCall,
    EndOfResponse,
    OutboundItem,
    Response,
    Tag,
    is_control,
)
from parley.pipeline.queues import flush_keeping

Gate = Callable[[Tag], "bool | None"]


class OutboundListener(Protocol):
    """What the call hears from its Outbound; called on the puller's thread, outside the Outbound's lock."""

    def on_segment_started(self, response: Response, text: str, first: bool) -> None: ...

    def on_response_ended(self, response: Response, latest: bool) -> None: ...

    def on_end_of_call(self, reason: str) -> None: ...

    def on_flushed(self) -> None: ...


def _words_heard(text: str, played: int, total: int) -> str:
    """The share of a segment's words the caller heard, by the share of its samples played."""
    words = text.split()
    if total <= 0 or not words:
        return ""
    return " ".join(words[: round(len(words) * played / total)])


class Outbound:
    def __init__(self, rate: int, gate: Gate, listener: OutboundListener) -> None:
        self.rate = rate
        self.frame_samples = samples_per_frame(rate)
        self._gate = gate
        self._listener = listener
        self._lock = threading.Lock()
        self._items: deque[OutboundItem] = deque()
        self._current: AudioChunk | None = None
        self._offset = 0
        self._paused_at: float | None = None
        self._silence = np.zeros(self.frame_samples, dtype=np.int16)

    # producers (stage threads)

    def push(self, item: OutboundItem) -> None:
        with self._lock:
            self._items.append(item)

    # control side (the call's VAD thread)

    def pause(self) -> float:
        """Stop playing at the next frame, keeping everything; returns when (monotonic) it took effect."""
        with self._lock:
            if self._paused_at is None:
                self._paused_at = time.monotonic()
            return self._paused_at

    def resume(self) -> None:
        with self._lock:
            self._paused_at = None

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def flush(self) -> list[Response]:
        """Drop all reply audio at once (the next frame is silence) and unpause; markers survive in order.

        Returns the responses cut: the one playing (its heard share of words recorded) and those waiting.
        The listener hears of it (after the lock is released): a carrier must clear what it buffered.
        """
        cut = self._flush()
        self._listener.on_flushed()
        return cut

    def _flush(self) -> list[Response]:
        with self._lock:
            cut: list[Response] = []
            if self._current is not None:
                chunk = self._current
                chunk.response.partial_segment = _words_heard(chunk.text, self._offset, chunk.pcm.size)
                cut.append(chunk.response)
                self._current = None
                self._offset = 0
            for item in flush_keeping(self._items, is_control):
                assert isinstance(item, AudioChunk)
                if item.response not in cut:
                    cut.append(item.response)
            self._paused_at = None
            return cut

    def has_audio(self) -> bool:
        """True while reply audio is playing or waiting to play (held back or paused included)."""
        with self._lock:
            return self._current is not None or any(isinstance(i, AudioChunk) for i in self._items)

    # the transport

    def pull_frame(self) -> np.ndarray:
        """The next 20 ms of audio at `rate` (int16); silence when nothing may play. Never blocks."""
        notices: list[Callable[[], None]] = []
        with self._lock:
            if self._paused_at is not None:
                return self._silence
            frame = self._fill_frame_locked(notices)
        for notify in notices:
            notify()
        return frame

    def _fill_frame_locked(self, notices: list[Callable[[], None]]) -> np.ndarray:
        frame: np.ndarray | None = None
        filled = 0
        while filled < self.frame_samples:
            if self._current is None and not self._next_chunk_locked(notices):
                break
            chunk = self._current
            assert chunk is not None
            take = min(self.frame_samples - filled, chunk.pcm.size - self._offset)
            if frame is None:
                frame = np.zeros(self.frame_samples, dtype=np.int16)
            frame[filled : filled + take] = chunk.pcm[self._offset : self._offset + take]
            filled += take
            self._offset += take
            if self._offset >= chunk.pcm.size:
                chunk.response.played_segments.append(chunk.text)
                self._current = None
                self._offset = 0
        return self._silence if frame is None else frame

    def _next_chunk_locked(self, notices: list[Callable[[], None]]) -> bool:
        """Move the next playable chunk into `_current`, handling markers on the way; False to stop."""
        while self._items:
            head = self._items[0]
            if isinstance(head, EndOfCall):
                self._items.popleft()
                notices.append(functools.partial(self._listener.on_end_of_call, head.reason))
                continue
            verdict = self._gate(head.response.tag)
            if verdict is None:
                return False  # held back: its revision may still be reopened
            self._items.popleft()
            if isinstance(head, EndOfResponse):
                head.response.ended = True
                notices.append(functools.partial(self._listener.on_response_ended, head.response, verdict))
                continue
            if not verdict or head.pcm.size == 0:
                continue
            first = head.response.first_audio_at is None
            if first:
                head.response.first_audio_at = time.monotonic()
            self._current = head
            self._offset = 0
            notices.append(
                functools.partial(self._listener.on_segment_started, head.response, head.text, first)
            )
            return True
        return False
