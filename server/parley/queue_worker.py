"""One daemon thread that works through a bounded queue in order, and stops after what was queued before
its stop: the thread behind the recordings' writer and store and the call records' writer.

The callers' side never blocks (`offer` says whether the item fit: each caller decides what a full queue
costs it). The thread does each item, then its periodic work (a purge, a sweep: each checks whether it
is due), which it also does when nothing has come for `wake_s`, so that the work stays on time on a quiet
service. At the stop it runs `at_end` (finishing what is still open) and ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar, cast

T = TypeVar("T")

_END = object()  # queued by stop/close: the thread ends when it comes to it


def _nothing() -> None:
    pass


class QueueWorker(Generic[T]):
    def __init__(
        self,
        name: str,
        handle: Callable[[T], None],
        *,
        maxsize: int,
        wake_s: float,
        periodic: Callable[[], None] = _nothing,
        at_end: Callable[[], None] = _nothing,
    ) -> None:
        self._handle = handle
        self._periodic = periodic
        self._at_end = at_end
        self._wake_s = wake_s
        self._queue: queue.Queue[object] = queue.Queue(maxsize=maxsize)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = threading.Lock()
        self._end_queued = False

    def start(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        with self._started:
            if self._thread.ident is None:
                self._thread.start()

    def pending(self) -> int:
        return self._queue.qsize()

    def offer(self, item: T) -> bool:
        """Queue `item` (never blocks); False when the queue is full."""
        return self._put(item)

    def stop(self) -> None:
        """Queue the end after what is queued (never blocks; `close` waits for it)."""
        if self._thread.is_alive() and not self._end_queued:
            self._end_queued = self._put(_END)

    def _put(self, item: object) -> bool:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        return True

    def close(self, timeout: float) -> bool:
        """Queue the end, waiting up to `timeout` for room, and wait up to `timeout` for the thread to do
        what was queued before it and end. Whether it ended."""
        if not self._thread.is_alive():
            return True
        if not self._end_queued:
            try:
                self._queue.put(_END, timeout=timeout)
            except queue.Full:
                return False
            self._end_queued = True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        self._periodic()
        while True:
            try:
                item = self._queue.get(timeout=self._wake_s)
            except queue.Empty:
                self._periodic()
                continue
            if item is _END:
                self._at_end()
                return
            self._handle(cast(T, item))
            self._periodic()
