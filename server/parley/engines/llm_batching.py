"""Replies of many calls decoded together: one CTranslate2 `generate_batch` for the replies waiting.

On a CPU a 0.5B model decodes one token for several sequences in barely more time than for one (the
weights are read once per step for the whole batch): measured here with Qwen2.5-0.5B int8, 10-15 tokens/s
for one reply, 40-50 tokens/s in all for six at once. `Ct2Llm` runs one reply per generator replica, so
the third caller of three asking at once waits for a whole reply. Here each replica (`workers`) takes
every reply waiting when it is free (up to `max_batch`, sharing the same system prompt) and decodes them
as one batch, streaming each one's tokens to its caller through the step callback.

CTranslate2 cannot add a sequence to a batch already running, so a reply asked for meanwhile waits for
a free replica; replies are short (a sentence or two, stopped by the LLM stage), which bounds that wait.

A reply's `should_stop` may block (the LLM stage waits there for its first audio, so that TTS gets the
CPU): with other replies in the batch it is called on the caller's thread, never in the step callback,
so that one caller's wait never stalls the others.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.engines.llm import (
    REPETITION_PENALTY,
    Ct2Llm,
    LlmError,
    Message,
    Tools,
    _IncrementalDecoder,
)
from parley.log import event

log = logging.getLogger(__name__)

GATHER_S = 0.01  # a free replica waits this long for more replies asked at the same moment
POLL_S = 0.05  # how often a caller waiting for its next token checks whether it should stop

_DONE = object()


@dataclass
class _Request:
    prompt: list[str]
    static: tuple[str, ...]
    should_stop: Callable[[], bool]
    steps: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    stopped: bool = False  # read by the step callback: the caller is gone or told to stop
    asked_at: float = field(default_factory=time.monotonic)


class BatchedCt2Llm(Ct2Llm):
    """LlmEngine over a CTranslate2 Generator whose replicas decode the waiting replies in batches."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "cpu",
        workers: int = 2,
        max_tokens: int = 80,
        temperature: float = 0.0,
        max_batch: int = 8,
    ) -> None:
        super().__init__(
            model_dir, device=device, workers=workers, max_tokens=max_tokens, temperature=temperature
        )
        self.max_batch = max(1, max_batch)
        self._condition = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"llm-batch-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for thread in self._threads:
            thread.start()

    # caller side

    def _text(
        self, messages: list[Message], should_stop: Callable[[], bool], tools: Tools | None
    ) -> Iterator[str]:
        if should_stop():
            return
        static, prompt = self._prompt(messages, tools)
        request = _Request(prompt, tuple(static), should_stop)
        with self._condition:
            if self._closed:
                raise LlmError("the LLM engine is closed")
            self._waiting.append(request)
            self._condition.notify()
        decoder = _IncrementalDecoder(self._decode)
        try:
            while True:
                try:
                    step = request.steps.get(timeout=POLL_S)
                except queue.Empty:
                    if should_stop():
                        return
                    continue
                if step is _DONE:
                    return
                if isinstance(step, BaseException):
                    raise LlmError(f"generation failed: {step}") from step
                if step in self._end_ids or should_stop():
                    return
                tag = self._tag_ids.get(step)
                delta = tag if tag is not None else decoder.push(step)
                if delta:
                    yield delta
        finally:
            request.stopped = True  # the replica drops it at its next step

    def close(self) -> None:
        with self._condition:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            self._condition.notify_all()
        for request in waiting:
            request.steps.put(LlmError("the LLM engine is closed"))
        for thread in self._threads:
            thread.join()

    # replica side

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _next_batch(self) -> list[_Request] | None:
        """The replies to decode together: the oldest waiting and those sharing its system prompt."""
        with self._condition:
            while True:
                while not self._waiting and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return None
                deadline = time.monotonic() + GATHER_S
                while len(self._waiting) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                    self._condition.wait(left)
                if self._closed:
                    return None
                if self._waiting:  # another replica may have taken them while this one gathered
                    break
            static = self._waiting[0].static
            batch = [r for r in self._waiting if r.static == static][: self.max_batch]
            for request in batch:
                self._waiting.remove(request)
            if self._waiting:
                self._condition.notify()  # the rest are another replica's
        return [r for r in batch if not r.stopped]

    def _run(self, batch: list[_Request]) -> None:
        if not batch:
            return
        alone = len(batch) == 1

        def on_step(step: Any) -> bool:
            request = batch[step.batch_id]
            if request.stopped:
                return True
            request.steps.put(step.token_id)
            # Alone in its batch, a reply may hold its replica (to leave the CPU to its first audio), as
            # Ct2Llm does; in company, that wait happens on its caller's thread instead.
            return alone and request.should_stop()

        started = time.monotonic()
        try:
            self._generator.generate_batch(
                [r.prompt for r in batch],
                static_prompt=list(batch[0].static) or None,
                max_length=self.max_tokens,
                repetition_penalty=REPETITION_PENALTY,
                end_token=self._end_tokens or None,
                include_prompt_in_result=False,
                callback=on_step,
                **self._sampling(),
            )
        except Exception as exc:
            log.exception("llm_batch_failed")
            for request in batch:
                request.steps.put(exc)
            return
        for request in batch:
            request.steps.put(_DONE)
        event(
            log,
            "llm_batch",
            logging.DEBUG,
            size=len(batch),
            waited_s=round(max(started - r.asked_at for r in batch), 3),
            seconds=round(time.monotonic() - started, 3),
        )
