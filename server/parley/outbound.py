"""Outbound: a call's outgoing audio, pulled by the transport one 20 ms frame at a time.

Items are reply audio chunks tagged with (turn, revision, generation) and control markers (end of a
response, end of the call). The transport pulls at its own pace and always gets a full frame: silence
when nothing may play. What may play is decided at the head of the queue by the call's gate (a stale
generation is dropped; a revision still in its reopen grace, or with a reopen candidate pending, is
held back). A barge-in pauses the audio at once (nothing is lost, it can resume where it stopped) and,
once confirmed, flushes it: audio goes, control markers stay in order ahead of anything added later.

What the caller heard is what goes into the history. By default a chunk counts as heard once the
transport has pulled it, since WebRTC and RTP play what they pull at once. A carrier's media stream
plays from the carrier's own buffer instead, so its transport calls `confirm_by_marks()`: each chunk is
then followed by a mark (`take_marks`), it counts as heard only when the carrier echoes that mark
(`mark_played`), and a reply's end is reported once the audio sent before it has played. A flush
estimates how much of the chunk the carrier was playing was heard from the time since it began.

A loop (`loop`: an agent's hold sound while a tool runs) fills what no reply audio fills, for as long as
the gate lets its reply play, until `stop_loop` or a flush. It belongs to no reply's words: nothing of
it counts as heard, and `has_audio` does not count it.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class _Playout:
    """A chunk sent to a carrier that plays it from its own buffer: heard once its mark comes back."""

    response: Response
    text: str
    samples: int
    sent: int = 0
    mark: str | None = None  # named when its last sample is sent
    sent_all_at: float = 0.0


@dataclass
class _Loop:
    """A sound played over and over under a reply (its tag) while nothing of the reply waits."""

    tag: Tag
    pcm: np.ndarray
    offset: int = 0


@dataclass
class _DeferredEnd:
    """A reply's end, reported once the audio sent before it has played."""

    response: Response


class Outbound:
    def __init__(
        self,
        rate: int,
        gate: Gate,
        listener: OutboundListener,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.frame_samples = samples_per_frame(rate)
        self._gate = gate
        self._listener = listener
        self._clock = clock  # for the playout estimates (tests give their own)
        self._lock = threading.Lock()
        self._items: deque[OutboundItem] = deque()
        self._current: AudioChunk | None = None
        self._offset = 0
        self._paused_at: float | None = None
        self._silence = np.zeros(self.frame_samples, dtype=np.int16)
        self._by_marks = False
        self._playouts: deque[_Playout | _DeferredEnd] = deque()  # sent, not yet known to be played
        self._playing_since: float | None = None  # when the carrier began playing the first of them
        self._marks_due: list[str] = []
        self._mark_numbers = itertools.count(1)
        self._loop: _Loop | None = None
        self._tap: Callable[[np.ndarray], None] | None = None

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
            ends: list[EndOfResponse] = []
            if self._by_marks:
                ends = self._cut_playouts_locked(cut)
            elif self._current is not None:
                chunk = self._current
                chunk.response.partial_segment = _words_heard(chunk.text, self._offset, chunk.pcm.size)
                cut.append(chunk.response)
            self._current = None
            self._offset = 0
            for item in flush_keeping(self._items, is_control):
                assert isinstance(item, AudioChunk)
                if item.response not in cut:
                    cut.append(item.response)
            # Ends that waited for their audio to play are markers too: they go back in front, in order.
            self._items.extendleft(reversed(ends))
            self._paused_at = None
            self._loop = None
            return cut

    def _cut_playouts_locked(self, cut: list[Response]) -> list[EndOfResponse]:
        """Close the books on audio the carrier was told to drop; returns the reply ends that waited on it.

        Only the first chunk can have been heard, and only since the carrier began playing it (and no
        more of it than was sent): the rest was still in its buffer.
        """
        ends: list[EndOfResponse] = []
        for index, entry in enumerate(self._playouts):
            if isinstance(entry, _DeferredEnd):
                ends.append(EndOfResponse(entry.response))
                continue
            if index == 0 and self._playing_since is not None:
                heard = min(entry.sent, round((self._clock() - self._playing_since) * self.rate))
                entry.response.partial_segment = _words_heard(entry.text, max(0, heard), entry.samples)
            if entry.response not in cut:
                cut.append(entry.response)
        self._playouts.clear()
        self._playing_since = None
        self._marks_due.clear()
        return ends

    def has_audio(self) -> bool:
        """True while reply audio is playing or waiting to play (held back, paused, or still in a
        carrier's buffer included)."""
        with self._lock:
            return (
                self._current is not None
                or any(isinstance(i, AudioChunk) for i in self._items)
                or any(isinstance(p, _Playout) for p in self._playouts)
            )

    # a loop under the reply

    def loop(self, tag: Tag, pcm: np.ndarray) -> None:
        """Play `pcm` (at `rate`) over and over whenever no reply audio waits, while the gate lets `tag`
        play, from the next frame until `stop_loop` or a flush (replacing any loop playing)."""
        with self._lock:
            self._loop = _Loop(tag, pcm) if pcm.size else None

    def stop_loop(self) -> None:
        """The loop stops where it is: the next frame has none of it."""
        with self._lock:
            self._loop = None

    @property
    def looping(self) -> bool:
        return self._loop is not None

    # playout confirmed by marks (a carrier's media stream)

    def confirm_by_marks(self) -> None:
        """Count audio as heard only when the carrier echoes its mark (set before the first pull)."""
        with self._lock:
            self._by_marks = True

    def take_marks(self) -> list[str]:
        """The marks to send after the frames pulled so far, in order (each follows one chunk)."""
        with self._lock:
            marks, self._marks_due = self._marks_due, []
            return marks

    def mark_played(self, name: str) -> bool:
        """The carrier echoed `name`: everything sent before it has played. False for a mark it does not
        know, such as one a carrier echoes after a clear (that audio was dropped, not played)."""
        notices: list[Callable[[], None]] = []
        with self._lock:
            if not any(isinstance(p, _Playout) and p.mark == name for p in self._playouts):
                return False
            while self._playouts:
                entry = self._playouts.popleft()
                if isinstance(entry, _DeferredEnd):
                    notices.append(functools.partial(self._listener.on_response_ended, entry.response, True))
                    continue
                entry.response.played_segments.append(entry.text)
                if entry.mark == name:
                    break
            while self._playouts and isinstance(self._playouts[0], _DeferredEnd):
                end = self._playouts.popleft()
                notices.append(functools.partial(self._listener.on_response_ended, end.response, True))
            self._playing_since = self._clock() if self._playouts else None
        for notify in notices:
            notify()
        return True

    def expire_marks(self, after_s: float) -> list[str]:
        """Count as played the chunks whose marks have not come back `after_s` after their last sample
        was sent, and return those marks: a carrier that drops marks must not hold every reply open."""
        with self._lock:
            now = self._clock()
            overdue = [
                p.mark
                for p in self._playouts
                if isinstance(p, _Playout) and p.mark is not None and now - p.sent_all_at > after_s
            ]
        if overdue:
            self.mark_played(overdue[-1])
        return overdue

    # the transport

    @property
    def silence(self) -> np.ndarray:
        """What `pull_frame` returns when nothing plays: the same object each time (never write to it)."""
        return self._silence

    def pull_frame(self) -> np.ndarray:
        """The next 20 ms of audio at `rate` (int16); silence when nothing may play. Never blocks."""
        notices: list[Callable[[], None]] = []
        with self._lock:
            frame = self._silence if self._paused_at is not None else self._fill_frame_locked(notices)
        for notify in notices:
            notify()
        if self._tap is not None:
            self._tap(frame)
        return frame

    def tap(self, listen: Callable[[np.ndarray], None]) -> None:
        """Also hand `listen` every frame pulled, silence included (a call's recording: it copies the
        frame and returns at once), on the puller's thread. Set before the first pull."""
        self._tap = listen

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
            if self._by_marks:
                playout = self._playouts[-1]  # the current chunk's: nothing is added behind it meanwhile
                assert isinstance(playout, _Playout)
                playout.sent += take
            if self._offset >= chunk.pcm.size:
                self._chunk_sent_locked(chunk)
        if filled < self.frame_samples and self._loop is not None and not self._items:
            frame = self._fill_loop_locked(frame, filled)
        return self._silence if frame is None else frame

    def _fill_loop_locked(self, frame: np.ndarray | None, filled: int) -> np.ndarray | None:
        """The rest of the frame from the loop, when its reply may play (one that went stale ends it)."""
        loop = self._loop
        assert loop is not None
        verdict = self._gate(loop.tag)
        if verdict is False:
            self._loop = None
        if not verdict:
            return frame
        if frame is None:
            frame = np.zeros(self.frame_samples, dtype=np.int16)
        while filled < self.frame_samples:
            take = min(self.frame_samples - filled, loop.pcm.size - loop.offset)
            frame[filled : filled + take] = loop.pcm[loop.offset : loop.offset + take]
            filled += take
            loop.offset = (loop.offset + take) % loop.pcm.size
        return frame

    def _chunk_sent_locked(self, chunk: AudioChunk) -> None:
        if self._by_marks:
            playout = self._playouts[-1]
            assert isinstance(playout, _Playout)
            playout.mark = f"m{next(self._mark_numbers)}"
            playout.sent_all_at = self._clock()
            self._marks_due.append(playout.mark)
        else:
            chunk.response.played_segments.append(chunk.text)
        self._current = None
        self._offset = 0

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
                if self._by_marks and verdict and self._playouts:
                    self._playouts.append(_DeferredEnd(head.response))  # its audio is still playing
                else:
                    notices.append(
                        functools.partial(self._listener.on_response_ended, head.response, verdict)
                    )
                continue
            if not verdict or head.pcm.size == 0:
                continue
            first = head.response.first_audio_at is None
            if first:
                head.response.first_audio_at = time.monotonic()
            self._current = head
            self._offset = 0
            if self._by_marks:
                if not self._playouts:
                    self._playing_since = self._clock()
                self._playouts.append(_Playout(head.response, head.text, head.pcm.size))
            notices.append(
                functools.partial(self._listener.on_segment_started, head.response, head.text, first)
            )
            return True
        return False
