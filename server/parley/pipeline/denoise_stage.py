"""A call's denoise stage (`--denoise`): cleans the caller's audio before its VAD stage hears it.

Everything after it hears the cleaned audio: the VAD, the turn's audio the turn-taker keeps, and so
Whisper and the backchannel and end-of-turn checks. The audio as received stays where the transport
hands it over (`Call.push_audio`), for what wants the line as it was. Keypad digits do not pass here:
they reach the VAD stage directly, ahead of audio still being cleaned by a frame at most.

It has no thread of its own: the process's denoise workers (engines/denoise_workers.py) run it as a
lane. To its call it looks like a stage thread (`start`, `is_alive`, `join`, `name`). Its model state (a
stream) is made when the call starts, on a short-lived thread of its own: DeepFilterNet loads its model
for each stream, which must hold up neither the event loop nor the other calls of its worker; frames wait
for it. The stream is freed when the call ends. A stream that fails to load or to clean costs the call
its cleaning, never its audio: from then on its frames go on as received.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Protocol

from parley import metrics
from parley.engines.denoise import Denoiser, DenoiseStream
from parley.engines.denoise_workers import DenoiseWorkers, LaneEnded
from parley.log import CALL_ID
from parley.pipeline.messages import InboundFrame
from parley.pipeline.queues import QueueClosed, WorkerInbox

log = logging.getLogger(__name__)


class CallerAudio(Protocol):
    """Where the cleaned audio goes: the call's VAD inbox."""

    def put(self, item: InboundFrame) -> bool: ...


class DenoiseInbox(WorkerInbox[InboundFrame]):
    """The denoise stage's queue: wakes its worker for each frame put, and when it closes."""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__("denoise", maxsize=maxsize)

    def _added(self, item: InboundFrame, dropped: InboundFrame | None) -> None:
        self.wake()


class DenoiseStage:
    """One call's denoise stage, run by a denoise worker (a lane: engines/denoise_workers.py)."""

    stage_name = "denoise"

    def __init__(
        self,
        call_id: str,
        inbox: DenoiseInbox,
        workers: DenoiseWorkers,
        denoiser: Denoiser,
        out: CallerAudio,
    ) -> None:
        self.name = f"{call_id}:{self.stage_name}"
        self.call_id = call_id
        self.inbox = inbox
        self.workers = workers
        self.denoiser = denoiser
        self.out = out
        self._latency = metrics.STAGE_LATENCY.labels(stage="denoise")
        self._waiting: deque[InboundFrame] = deque(maxlen=inbox.maxsize or None)  # until the stream loads
        self._stream: DenoiseStream | None = None
        self._loaded = False  # the stream has loaded, or failed to (then frames go on as received)
        self._lock = threading.Lock()  # the stream, between the loader, the worker and the end of the call
        self._loader: threading.Thread | None = None
        self._started = False
        self._done = threading.Event()
        inbox.wake = lambda: workers.ready(self)

    # what the call sees: a stage, like its threads

    def start(self) -> None:
        self._started = True
        self._loader = threading.Thread(target=self._load, name=f"{self.name}-load", daemon=True)
        self._loader.start()
        self.workers.add(self)

    def is_alive(self) -> bool:
        loading = self._loader is not None and self._loader.is_alive()
        return self._started and (loading or not self._done.is_set())

    def join(self, timeout: float | None = None) -> None:
        if not self._started:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._done.wait(timeout):
            self.workers.settle(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._loader is not None:
            self._loader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    @property
    def ident(self) -> int | None:
        """The thread running this stage (where it is stuck, if it is)."""
        if self._loader is not None and self._loader.is_alive():
            return self._loader.ident
        thread = self.workers.thread_of(self)
        return thread.ident if thread is not None else None

    # the loader's thread

    def _load(self) -> None:
        token = CALL_ID.set(self.call_id)
        try:
            stream: DenoiseStream | None = self.denoiser.new_stream()
        except Exception as exc:
            self._count_failure("denoise_load_failed", exc)
            stream = None
        finally:
            CALL_ID.reset(token)
        with self._lock:
            if self._done.is_set():  # the call ended while the model loaded
                if stream is not None:
                    stream.close()
                return
            self._stream = stream
            self._loaded = True
        self.workers.ready(self)

    # the worker's side

    def work(self) -> None:
        try:
            frames = self.inbox.take_all()
        except QueueClosed:
            raise LaneEnded(self.name) from None
        with self._lock:
            if not self._loaded:
                self._waiting.extend(frames)
                return
            if self._waiting:
                frames = [*self._waiting, *frames]
                self._waiting.clear()
            stream = self._stream
            token = CALL_ID.set(self.call_id)
            try:
                for index, frame in enumerate(frames):
                    if stream is None:
                        self.out.put(frame)
                        continue
                    started = time.perf_counter()
                    try:
                        cleaned = stream.process(frame.pcm)
                    except Exception as exc:
                        self._drop_stream(exc)
                        stream = None
                        for rest in frames[index:]:
                            self.out.put(rest)
                        return
                    self._latency.observe(time.perf_counter() - started)
                    if cleaned.size:
                        self.out.put(InboundFrame(cleaned, frame.arrived_at))
            finally:
                CALL_ID.reset(token)

    def failed(self, error: BaseException) -> None:
        with self._lock:
            self._drop_stream(error)

    def finished(self) -> None:
        with self._lock:
            self._done.set()
            if self._stream is not None:
                self._stream.close()
                self._stream = None
            self._waiting.clear()

    def _drop_stream(self, error: BaseException) -> None:
        # Under the lock. The call goes on, hearing its audio as received.
        self._count_failure("denoise_failed", error)
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._loaded = True

    def _count_failure(self, what: str, error: BaseException) -> None:
        metrics.ENGINE_ERRORS_TOTAL.labels(engine="denoise").inc()
        log.error(
            what,
            exc_info=(type(error), error, error.__traceback__),
            extra={"call_id": self.call_id, "stage": self.stage_name, "denoiser": self.denoiser.name},
        )
