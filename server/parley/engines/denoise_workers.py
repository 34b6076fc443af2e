"""A few threads clean the caller audio of every call (`--denoise`), each call always on the same one.

Not on the event loop: the transports' media for every call runs there, and cleaning a frame takes longer
than anything else done to it (measured in the README's "Noisy lines"). Not on the VAD worker either:
that one thread runs every call's VAD, and a denoiser costs several times the VAD's share per frame, so
every call would queue behind it and calls could never use more than one core. The native models let go
of the GIL while they compute, so the workers, one per core by default, clean in parallel.

A call's denoise stage is a lane (pipeline/denoise_stage.py): its frames wait in its own queue, which
wakes its worker; the worker cleans what waits, lane after lane, and hands each lane's audio on in order.
A lane stays on the worker it was given (the fewest lanes) for its call's life, so its frames are never
reordered. A worker's thread starts with its first lane and ends with its last, so a process without
calls has none; `close` ends them all.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Protocol

log = logging.getLogger(__name__)


class LaneEnded(Exception):
    """The lane's call ended: its worker lets it go."""


class DenoiseLane(Protocol):
    name: str

    def work(self) -> None:
        """Clean and pass on what waits in the lane. Raises LaneEnded once its call has ended."""
        ...

    def failed(self, error: BaseException) -> None:
        """`work` raised: count it, and leave the lane passing its audio on uncleaned."""
        ...

    def finished(self) -> None:
        """The worker has let the lane go (its call ended, or the workers closed)."""
        ...


class _Worker:
    """One thread and the lanes it serves; its condition shares the workers' lock."""

    def __init__(self, index: int, lock: threading.Lock) -> None:
        self.index = index
        self.wakeup = threading.Condition(lock)
        self.lanes: set[DenoiseLane] = set()
        self.ready: dict[DenoiseLane, None] = {}  # lanes with work waiting, in order
        self.thread: threading.Thread | None = None
        self.retired: threading.Thread | None = None


class DenoiseWorkers:
    """Runs every call's denoise lane on `threads` threads (default: one per core); thread-safe."""

    def __init__(self, threads: int = 0) -> None:
        self._lock = threading.Lock()
        self._workers = [_Worker(i, self._lock) for i in range(max(1, threads or os.cpu_count() or 1))]
        self._by_lane: dict[DenoiseLane, _Worker] = {}
        self._closed = False

    @property
    def threads(self) -> int:
        return len(self._workers)

    def add(self, lane: DenoiseLane) -> None:
        """Serve `lane` from now on, on the worker with the fewest lanes (starting its thread if needed)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the denoise workers are closed")
            worker = min(self._workers, key=lambda w: len(w.lanes))
            worker.lanes.add(lane)
            self._by_lane[lane] = worker
            if worker.thread is None:
                # Named as a call's thread: parley_call_threads counts it, and it ends with its last call.
                worker.thread = threading.Thread(
                    target=self._serve, args=(worker,), name=f"c-denoise-worker-{worker.index}", daemon=True
                )
                worker.thread.start()
            self._wake(lane)

    def ready(self, lane: DenoiseLane) -> None:
        """`lane` has frames waiting, or its call ended. Never blocks for long."""
        with self._lock:
            self._wake(lane)

    def _wake(self, lane: DenoiseLane) -> None:
        worker = self._by_lane.get(lane)
        if worker is not None and lane not in worker.ready:
            worker.ready[lane] = None
            worker.wakeup.notify()

    def thread_of(self, lane: DenoiseLane) -> threading.Thread | None:
        """The thread serving `lane` (None once it was let go)."""
        with self._lock:
            worker = self._by_lane.get(lane)
            return worker.thread if worker is not None else None

    def lanes(self) -> int:
        with self._lock:
            return len(self._by_lane)

    def close(self) -> None:
        """End the threads; lanes still served are let go (idempotent)."""
        with self._lock:
            self._closed = True
            for worker in self._workers:
                worker.wakeup.notify()
            threads = [t for w in self._workers for t in (w.thread or w.retired,) if t is not None]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def settle(self, timeout: float | None = None) -> None:
        """Wait for the threads that have let their last lane go to end too (after a call's join)."""
        with self._lock:
            retired = [w.retired for w in self._workers if w.thread is None and w.retired is not None]
        for thread in retired:
            if thread is not threading.current_thread():
                thread.join(timeout)

    # a worker's thread

    def _serve(self, worker: _Worker) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while worker.thread is me and not worker.ready and worker.lanes and not self._closed:
                    worker.wakeup.wait()
                if worker.thread is not me:
                    return  # its last lane left, and a new lane has a new thread
                if self._closed or not worker.lanes:
                    left = list(worker.lanes)
                    for lane in left:
                        self._by_lane.pop(lane, None)
                    worker.lanes.clear()
                    self._retire(worker)
                    break
                ready = list(worker.ready)
                worker.ready.clear()
            for lane in ready:
                try:
                    lane.work()
                except LaneEnded:
                    self._leave(worker, lane)
                except Exception as exc:
                    lane.failed(exc)
        for lane in left:
            lane.finished()

    def _retire(self, worker: _Worker) -> None:
        # Under the lock: the thread ends, and an `add` to this worker from now on starts another.
        worker.retired = worker.thread
        worker.thread = None
        worker.ready.clear()

    def _leave(self, worker: _Worker, lane: DenoiseLane) -> None:
        with self._lock:
            worker.lanes.discard(lane)
            worker.ready.pop(lane, None)
            self._by_lane.pop(lane, None)
            if not worker.lanes:
                self._retire(worker)
        lane.finished()
