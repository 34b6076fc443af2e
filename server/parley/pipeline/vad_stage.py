"""A call's VAD stage: speech probabilities per 32 ms chunk for its turn-taker, and keypad entries,
backchannel and end-of-turn verdicts in order with them.

It has no thread of its own: the process's VAD worker (engines/vad_batching.py) runs every call's VAD
stage as a lane, batching the model across calls. To its call it still looks like a stage thread
(`start`, `is_alive`, `join`, `name`), so the call starts, joins and reports it as it does the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from parley import metrics
from parley.audio import FrameSplitter
from parley.engines.vad_batching import LaneEnded, VadWorker
from parley.log import CALL_ID
from parley.pipeline.keypad import KeypadEntry
from parley.pipeline.messages import BargeVerdict, InboundFrame, KeypadDigit, TurnEndVerdict
from parley.pipeline.queues import QueueClosed, WorkerInbox
from parley.pipeline.turntaking import TurnTaker

log = logging.getLogger(__name__)

VadItem = InboundFrame | KeypadDigit | BargeVerdict | TurnEndVerdict


class VadInbox(WorkerInbox[VadItem]):
    """The VAD stage's queue: wakes the VAD worker when a whole chunk's audio, or another item, waits.

    Frames of 20 ms make a 32 ms chunk every other frame or so; a frame that completes none is only
    queued. `consumed` (samples cut into chunks) is advanced by the worker; read here a moment stale, it
    can only make the backlog look larger, so a wake is sometimes early and never missed.
    """

    def __init__(self, chunk_samples: int, maxsize: int = 0) -> None:
        super().__init__("vad", maxsize=maxsize)
        self.chunk_samples = chunk_samples
        self.received = 0  # samples of the frames put and not dropped
        self.consumed = 0
        self.last_put_at = time.monotonic()

    def _added(self, item: VadItem, dropped: VadItem | None) -> None:
        # Under the queue's lock; the worker never takes a queue's lock while holding its own.
        if isinstance(dropped, InboundFrame):
            self.received -= dropped.pcm.size
        if isinstance(item, InboundFrame):
            self.received += item.pcm.size
            self.last_put_at = item.arrived_at
            if self.received - self.consumed >= self.chunk_samples:
                self.wake()
        else:
            self.last_put_at = item.arrived_at if isinstance(item, KeypadDigit) else time.monotonic()
            self.wake()


class VadStage:
    """One call's VAD, run by the VAD worker (a lane: engines/vad_batching.py)."""

    stage_name = "vad"

    def __init__(
        self,
        call_id: str,
        inbox: VadInbox,
        worker: VadWorker,
        turns: TurnTaker,
        keypad_timeout_s: float,
        on_keys: Callable[[str], None],
    ) -> None:
        self.name = f"{call_id}:{self.stage_name}"
        self.call_id = call_id
        self.inbox = inbox
        self.worker = worker
        self.stream = worker.engine.new_stream()
        self.splitter = FrameSplitter(worker.engine.chunk_samples)
        self.turns = turns
        self.keypad = KeypadEntry(keypad_timeout_s)
        self._on_keys = on_keys
        self._latency = metrics.STAGE_LATENCY.labels(stage="vad")
        self._items: deque[VadItem] = deque()
        self._chunks: deque[tuple[np.ndarray, float, bool]] = deque()  # chunk, arrived at, its frame's last
        self._current: tuple[np.ndarray, float, bool] | None = None
        self._asked_at = 0.0
        self._started = False
        self._done = threading.Event()
        inbox.wake = lambda: worker.ready(self)

    # what the call sees: a stage, like its threads

    def start(self) -> None:
        self._started = True
        self.worker.add(self)

    def is_alive(self) -> bool:
        return self._started and not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        if self._started and self._done.wait(timeout):
            self.worker.settle(timeout)

    @property
    def ident(self) -> int | None:
        """The thread running this stage (where it is stuck, if it is)."""
        thread = self.worker.thread
        return thread.ident if thread is not None else None

    # the worker's side

    def next_chunk(self) -> np.ndarray | None:
        token = CALL_ID.set(self.call_id)
        try:
            while not self._chunks:
                if not self._items:
                    try:
                        self._items.extend(self.inbox.take_all())
                    except QueueClosed:
                        raise LaneEnded(self.name) from None
                    if not self._items:
                        return None
                self._take(self._items.popleft())
            self._current = self._chunks.popleft()
            self.inbox.consumed += self.splitter.frame_samples
            self._asked_at = time.perf_counter()
            return self._current[0]
        finally:
            CALL_ID.reset(token)

    def _take(self, item: VadItem) -> None:
        if isinstance(item, KeypadDigit):
            self._keys(self.keypad.push(item.digit, item.arrived_at))
        elif isinstance(item, BargeVerdict):
            self.turns.verdict(item)
        elif isinstance(item, TurnEndVerdict):
            self.turns.turn_end_verdict(item)
        else:
            chunks = self.splitter.push(item.pcm)
            if not chunks:
                self._keys(self.keypad.poll(item.arrived_at))
            for i, chunk in enumerate(chunks):
                self._chunks.append((chunk, item.arrived_at, i == len(chunks) - 1))

    def heard(self, probability: float) -> None:
        if self._current is None:
            return
        chunk, arrived_at, last = self._current
        self._current = None
        self._latency.observe(time.perf_counter() - self._asked_at)
        token = CALL_ID.set(self.call_id)
        try:
            self.turns.process(chunk, probability, arrived_at)
            if last:
                self._keys(self.keypad.poll(arrived_at))
        finally:
            CALL_ID.reset(token)

    def failed(self, error: BaseException) -> None:
        self._current = None
        metrics.ENGINE_ERRORS_TOTAL.labels(engine="vad").inc()
        log.error(
            "stage_failed",
            exc_info=(type(error), error, error.__traceback__),
            extra={"call_id": self.call_id, "stage": self.stage_name},
        )

    def last_item_at(self) -> float:
        return self.inbox.last_put_at

    def idle(self, now: float) -> None:
        token = CALL_ID.set(self.call_id)
        try:
            self._keys(self.keypad.poll(now))
            self.turns.poll(now)
        finally:
            CALL_ID.reset(token)

    def finished(self) -> None:
        self._done.set()

    def _keys(self, entry: str | None) -> None:
        if entry:
            self._on_keys(entry)
