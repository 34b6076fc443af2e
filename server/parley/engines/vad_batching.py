"""One thread runs the VAD of every call, and runs the model over their chunks as one batch.

A thread per call used to wake for each 20 ms frame to run a 0.3 ms model: with ten calls, ten threads
woke 500 times a second and queued for the GIL behind the event loop. Here a call's VAD is a lane: its
transport's frames wait in the lane's queue, which wakes the worker only once a whole chunk (32 ms) is
there, and the worker takes every lane that has one, runs the model once over the lot (one chunk per
lane, in order within each lane) and hands each lane its probability, on the worker's thread, in order
with the lane's other items (keypad digits, backchannel verdicts). Batching changes nothing a lane
hears: the model gives each stream the same probability and state alone or in a batch.

A lane that raises is counted and logged, and the worker goes on with the others; a failed model run
costs only the chunks of that batch. The thread starts with the first lane and ends with the last one
(so a process with no calls has no VAD thread), and `close` ends it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import numpy as np

from parley.engines.vad import VadEngine, VadStream

log = logging.getLogger(__name__)

# With several calls, model runs come at most this often, so that their chunks share a run: ten WebRTC
# calls measured 4.9-5.8 % of a core each against 6.7-6.8 % with a run per chunk as it came (and 6.0-6.6 %
# with a thread per call). A chunk may wait this long for its probability; a lone call never waits.
BATCH_WINDOW_S = 0.016
IDLE_S = 0.1  # a lane without items for this long is told so (a peer that sends nothing in silence)


class LaneEnded(Exception):
    """The lane's call ended: the worker lets it go."""


class VadLane(Protocol):
    """One call's VAD, as the worker runs it (pipeline/vad_stage.py)."""

    name: str
    stream: VadStream

    def next_chunk(self) -> np.ndarray | None:
        """Handle what waits before the next chunk; that chunk, or None when none is complete.
        Raises LaneEnded once the call has ended."""
        ...

    def heard(self, probability: float) -> None:
        """The probability of the chunk `next_chunk` returned last."""
        ...

    def failed(self, error: BaseException) -> None:
        """The model failed on that chunk, or the lane's own code raised: count it, leave it consistent."""
        ...

    def last_item_at(self) -> float:
        """When an item last reached the lane's queue (time.monotonic())."""
        ...

    def idle(self, now: float) -> None:
        """Nothing reached the lane for IDLE_S."""
        ...

    def finished(self) -> None:
        """The worker has let the lane go (its call ended, or the worker closed)."""
        ...


class VadWorker:
    """Runs every call's VAD lane on one thread, batching the model; thread-safe."""

    def __init__(self, engine: VadEngine) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._lanes: dict[VadLane, float] = {}  # lane -> when it was last told it is idle
        self._ready: dict[VadLane, None] = {}  # lanes with a chunk or an item waiting, in order
        self._thread: threading.Thread | None = None
        self._retired: threading.Thread | None = None  # the last thread, ending or ended
        self._waiting = False
        self._last_run = 0.0
        self._closed = False
        self.batches = 0  # model runs, and the chunks they held: what batching saved
        self.chunks = 0

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def add(self, lane: VadLane) -> None:
        """Serve `lane` from now on (starts the thread if no lane had it running)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the VAD worker is closed")
            self._lanes[lane] = time.monotonic()
            if self._thread is None:
                # Named as a call's thread: parley_call_threads counts it, and it ends with the last call.
                self._thread = threading.Thread(target=self._serve, name="c-vad-worker", daemon=True)
                self._thread.start()
            self._wake(lane)

    def ready(self, lane: VadLane) -> None:
        """`lane` has a chunk or an item waiting (its call ended, too). Never blocks for long."""
        with self._cond:
            self._wake(lane)

    def _wake(self, lane: VadLane) -> None:
        if lane in self._lanes and lane not in self._ready:
            self._ready[lane] = None
            if self._waiting:
                self._cond.notify()

    def lanes(self) -> int:
        with self._cond:
            return len(self._lanes)

    def close(self) -> None:
        """End the thread; lanes still served are let go (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread or self._retired
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # the worker's thread

    def _serve(self) -> None:
        me = threading.current_thread()
        next_idle_check = time.monotonic() + IDLE_S
        while True:
            with self._cond:
                while self._thread is me and not self._ready and self._lanes and not self._closed:
                    now = time.monotonic()
                    if now >= next_idle_check:
                        break
                    self._waiting = True
                    self._cond.wait(next_idle_check - now)
                    self._waiting = False
                if self._thread is not me:
                    return  # its last lane left, and a new lane has a new thread
                if self._closed or not self._lanes:
                    self._retire()
                    for lane in list(self._lanes):
                        lane.finished()
                    self._lanes.clear()
                    return
                if self._ready and len(self._lanes) > 1:
                    # Chunks of other calls that arrive within the window share the run.
                    gather_until = self._last_run + BATCH_WINDOW_S
                    while (now := time.monotonic()) < gather_until and len(self._ready) < len(self._lanes):
                        self._cond.wait(gather_until - now)
                ready = list(self._ready)
                self._ready.clear()
                self._last_run = time.monotonic()
            if ready:
                self._run(ready)
            now = time.monotonic()
            if now >= next_idle_check and self._thread is me:
                next_idle_check = self._idle_lanes(now)

    def _retire(self) -> None:
        # Under the lock: the thread ends, and an `add` from now on starts another.
        self._retired = self._thread
        self._thread = None
        self._ready.clear()

    def settle(self, timeout: float | None = None) -> None:
        """Wait for a thread that has ended its last lane to end too (after a call's join)."""
        with self._cond:
            retired = self._retired if self._thread is None else None
        if retired is not None and retired is not threading.current_thread():
            retired.join(timeout)

    def _run(self, lanes: list[VadLane]) -> None:
        """Rounds of one chunk per lane, until no lane has a whole chunk left; a lane that becomes ready
        meanwhile joins the next round."""
        while lanes:
            batch: list[tuple[VadLane, np.ndarray]] = []
            for lane in lanes:
                try:
                    chunk = lane.next_chunk()
                except LaneEnded:
                    self._leave(lane)
                    continue
                except Exception as exc:
                    lane.failed(exc)
                    continue
                if chunk is not None:
                    batch.append((lane, chunk))
            if not batch:
                return
            try:
                probabilities = self.engine.probabilities([(lane.stream, chunk) for lane, chunk in batch])
            except Exception as exc:
                log.exception("vad_batch_failed")
                for lane, _ in batch:
                    lane.failed(exc)
                probabilities = []
            self.batches += 1
            self.chunks += len(batch)
            for (lane, _), probability in zip(batch, probabilities, strict=False):
                try:
                    lane.heard(probability)
                except Exception as exc:
                    lane.failed(exc)
            lanes = [lane for lane, _ in batch]
            with self._cond:  # lanes that became ready meanwhile join the next round
                lanes += [lane for lane in self._ready if lane not in lanes]
                self._ready.clear()

    def _leave(self, lane: VadLane) -> None:
        with self._cond:
            self._lanes.pop(lane, None)
            self._ready.pop(lane, None)
            if not self._lanes:
                self._retire()
        lane.finished()

    def _idle_lanes(self, now: float) -> float:
        """Tell each lane without items for IDLE_S so (after what still waits in it); when to look again."""
        with self._cond:
            lanes = list(self._lanes.items())
        next_check = now + IDLE_S
        for lane, told_at in lanes:
            due = max(lane.last_item_at(), told_at) + IDLE_S
            if due <= now:
                self._run([lane])
                with self._cond:
                    if lane not in self._lanes:
                        continue
                    self._lanes[lane] = now
                try:
                    lane.idle(now)
                except Exception as exc:
                    lane.failed(exc)
                due = now + IDLE_S
            next_check = min(next_check, due)
        return next_check
