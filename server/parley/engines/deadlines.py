"""Deadlines on the shared engines: a model that hangs costs the caller one turn, never the call.

A stage thread that called a model which never returns would be lost with it: its call could take no
other turn, and ending the call would leave the thread behind. Here each engine call runs on a worker
thread of its own while the stage waits at most `timeout_s` for it (for a stream: for each next piece).
Past that the stage gets an EngineTimeout, which it handles like any engine failure (counted in
`parley_engine_errors_total{engine}`, logged with the call's id, and the caller hears an apology); the
stream is asked to stop, and the worker is left to finish, or to hang, on its own.

A worker costs a thread start (~0.1 ms) per transcription, reply and sentence: nothing next to the work.
The VAD is not wrapped: it runs every 32 ms per call on ~0.2 ms of work, where a thread hop would cost
more than the model; a VAD that hangs leaves its call deaf (its audio queue drops the oldest frames,
counted) until the caller hangs up, and the registry then reports the stuck thread.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from parley.engines import Engines
from parley.engines.llm import Calls, LlmEngine, Message, Tools
from parley.engines.stt import SttEngine, Transcription
from parley.engines.toolcalls import ToolCall
from parley.engines.tts import TtsEngine
from parley.log import event

log = logging.getLogger(__name__)

T = TypeVar("T")


class EngineTimeout(RuntimeError):
    """The engine gave nothing within its deadline."""


def _worker_name(engine: str) -> str:
    # Named after the caller's stage thread ("<call_id>:<stage>"), so that its log lines carry the call id.
    call_id = threading.current_thread().name.partition(":")[0]
    return f"{call_id}:{engine}-worker"


def _timed_out(engine: str, timeout_s: float) -> EngineTimeout:
    event(log, "engine_timeout", logging.WARNING, engine=engine, timeout_s=timeout_s)
    return EngineTimeout(f"the {engine} engine gave nothing within {timeout_s:g} s")


def _start_worker(engine: str, run: Callable[[], None]) -> None:
    """`run` on a thread of its own, in the asking thread's context: the work keeps the deadline of the
    reply it is for (engines/urgency.py)."""
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(run,), name=_worker_name(engine), daemon=True).start()


def call_with_deadline(engine: str, timeout_s: float, work: Callable[[], T]) -> T:
    """`work()` on a worker thread; its result or its exception, or EngineTimeout after `timeout_s`."""
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as exc:
            outcome.append((False, exc))
        done.set()

    _start_worker(engine, run)
    if not done.wait(timeout_s):
        raise _timed_out(engine, timeout_s)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


_END = object()


def stream_with_deadline(
    engine: str, timeout_s: float, produce: Callable[[Callable[[], bool]], Iterator[T]]
) -> Iterator[T]:
    """The items of `produce(abandoned)`, made on a worker thread; EngineTimeout when the next item takes
    longer than `timeout_s`. `abandoned()` turns true once the reader stops reading (a barge-in, a
    timeout), so that the producer can stop too."""
    items: queue.Queue[tuple[bool, Any]] = queue.Queue()
    abandoned = threading.Event()

    def run() -> None:
        try:
            for item in produce(abandoned.is_set):
                items.put((True, item))
                if abandoned.is_set():
                    break
            items.put((True, _END))
        except BaseException as exc:
            items.put((False, exc))

    _start_worker(engine, run)
    try:
        while True:
            try:
                ok, value = items.get(timeout=timeout_s)
            except queue.Empty:
                raise _timed_out(engine, timeout_s) from None
            if not ok:
                raise value
            if value is _END:
                return
            yield value
    finally:
        abandoned.set()


class _Wrapped:
    """Anything else the engine offers (its settings, its own methods) reads through to it."""

    def __init__(self, inner: Any, timeout_s: float) -> None:
        self.inner = inner
        self.timeout_s = timeout_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class DeadlineStt(_Wrapped):
    def transcribe(self, audio: np.ndarray, **options: Any) -> Transcription:
        stt: SttEngine = self.inner
        return call_with_deadline("stt", self.timeout_s, lambda: stt.transcribe(audio, **options))


class DeadlineLlm(_Wrapped):
    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: Tools | None = None,
        *,
        calls: Calls = True,
    ) -> Iterator[str | ToolCall]:
        llm: LlmEngine = self.inner

        def produce(abandoned: Callable[[], bool]) -> Iterator[str | ToolCall]:
            return llm.stream(messages, lambda: abandoned() or should_stop(), tools, calls=calls)

        return stream_with_deadline("llm", self.timeout_s, produce)


class DeadlineTts(_Wrapped):
    def __init__(self, inner: TtsEngine, timeout_s: float) -> None:
        super().__init__(inner, timeout_s)
        self.sample_rate = inner.sample_rate

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        tts: TtsEngine = self.inner
        return stream_with_deadline("tts", self.timeout_s, lambda abandoned: tts.synthesize(text))


def with_deadlines(engines: Engines, timeout_s: float) -> Engines:
    """The same engines, with STT, LLM and TTS under `timeout_s` deadlines (0: as they are)."""
    if timeout_s <= 0:
        return engines
    return dataclasses.replace(
        engines,
        stt=DeadlineStt(engines.stt, timeout_s),
        llm=DeadlineLlm(engines.llm, timeout_s),
        tts=DeadlineTts(engines.tts, timeout_s),
    )
