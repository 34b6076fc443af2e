"""Typed queues between a call's stages: closeable, observable, with a priority lane for cancels.

A `Cancel` (a barge-in, a reopen, a dropped speculative reply) and the end of the call jump the queue, as
an interruption must: the stage reading it takes the cancel before any item, and drops what of its inbox
went stale (`drop_stale`), so no controller reaches into a stage's inbox.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from parley import metrics
from parley.pipeline.messages import Cancel

T = TypeVar("T")


class QueueClosed(Exception):
    """The call ended: the stage reading this queue should return."""


def flush_keeping(items: deque[T], keep: Callable[[T], bool]) -> list[T]:
    """Empty `items` except those `keep` accepts, which stay in their original order; return the dropped ones.

    Callers hold their own lock, so anything a producer adds later lands behind the kept items.
    """
    kept = [item for item in items if keep(item)]
    dropped = [item for item in items if not keep(item)]
    items.clear()
    items.extend(kept)
    return dropped


_LIVE: dict[str, weakref.WeakSet[StageQueue[object]]] = {}
_LIVE_LOCK = threading.Lock()


def _depth_of(stage: str) -> float:
    """`parley_queue_depth{stage}`: items waiting in every live queue of a stage, counted when scraped.
    Counting at each put and get instead took two locked gauge updates per audio frame per call."""
    with _LIVE_LOCK:
        queues = list(_LIVE.get(stage, ()))
    return float(sum(len(q._items) for q in queues))


class StageQueue(Generic[T]):
    """A thread-safe FIFO feeding one stage thread.

    `maxsize` > 0 bounds it; when full, `put` drops the oldest item (a live stream prefers fresh
    audio to a growing delay) and counts it in frames_dropped_total.
    """

    def __init__(self, stage: str, maxsize: int = 0) -> None:
        self.stage = stage
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._cancels: deque[Cancel] = deque()  # the priority lane
        self._cond = threading.Condition()
        self._closed = False
        with _LIVE_LOCK:
            if stage not in _LIVE:
                _LIVE[stage] = weakref.WeakSet()
                metrics.QUEUE_DEPTH.labels(stage=stage).set_function(lambda: _depth_of(stage))
            _LIVE[stage].add(self)  # type: ignore[arg-type]

    def put(self, item: T) -> bool:
        """Add an item; False (and nothing added) once the queue is closed. Never blocks."""
        with self._cond:
            if self._closed:
                return False
            dropped = None
            if self.maxsize > 0 and len(self._items) >= self.maxsize:
                dropped = self._items.popleft()
                metrics.FRAMES_DROPPED_TOTAL.labels(reason=f"{self.stage}_queue_full").inc()
            self._items.append(item)
            self._added(item, dropped)
            return True

    def _added(self, item: T, dropped: T | None) -> None:
        """`item` went in (and `dropped` out, the queue being full), under the lock: wake the reader."""
        self._cond.notify()

    def cancel(self, generation: int) -> None:
        """Post `Cancel(generation)` ahead of every item; the reader drops the stale ones. Never blocks."""
        with self._cond:
            if not self._closed:
                self._cancels.append(Cancel(generation))
                self._cond.notify()

    def get(self, timeout: float | None = None) -> T | Cancel | None:
        """Block until a cancel or an item arrives (None on timeout), a cancel first; raise QueueClosed once
        closed: the end of the call jumps the queue too."""
        with self._cond:
            if not self._items and not self._cancels and not self._closed:
                self._cond.wait(timeout)
            if self._closed:
                raise QueueClosed(self.stage)
            if self._cancels:
                return self._cancels.popleft()
            if self._items:
                return self._items.popleft()
            return None

    def drop_stale(self, cancel: Cancel) -> int:
        """Drop the items `cancel` made stale; the rest stay in order. Returns how many went."""
        return self.flush(keep=lambda item: not cancel.drops(item))

    def flush(self, keep: Callable[[T], bool] = lambda _: False) -> int:
        """Drop everything `keep` rejects; kept items stay in front, in order. Returns how many went."""
        with self._cond:
            return len(flush_keeping(self._items, keep))

    def close(self) -> None:
        """Wake the reader; it gets QueueClosed. Items left are dropped with the call."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._items.clear()
            self._cancels.clear()
            self._cond.notify_all()

    def pending(self) -> int:
        """How many items wait (a snapshot)."""
        with self._cond:
            return len(self._items)

    def any(self, predicate: Callable[[T], bool]) -> bool:
        """Whether an item waiting in the queue matches (a peek; nothing is taken)."""
        with self._cond:
            return any(predicate(item) for item in self._items)


class WorkerInbox(StageQueue[T]):
    """A stage queue read by a shared worker (a lane of the VAD or denoise worker), not by a thread of
    its own: the worker takes everything waiting at once, and `wake` (set by the worker) tells it when
    to look. A subclass decides in `_added` which puts are worth a wake; closing always is."""

    def __init__(self, stage: str, maxsize: int = 0) -> None:
        super().__init__(stage, maxsize=maxsize)
        self.wake: Callable[[], None] = lambda: None

    def take_all(self) -> list[T]:
        """Everything waiting (maybe nothing); raises QueueClosed once closed."""
        with self._cond:
            if self._closed:
                raise QueueClosed(self.stage)
            items = list(self._items)
            self._items.clear()
            return items

    def close(self) -> None:
        super().close()
        self.wake()
