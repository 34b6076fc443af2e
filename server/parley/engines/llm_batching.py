"""Replies of many calls decoded together: one CTranslate2 `generate_batch` for the replies waiting.

On a CPU a 0.5B model decodes one token for several sequences in barely more time than for one (the
weights are read once per step for the whole batch): measured here with Qwen2.5-0.5B int8, 10-15 tokens/s
for one reply, 40-50 tokens/s in all for six at once. `Ct2Llm` runs one reply per generator replica, so
the third caller of three asking at once waits for a whole reply. Here each replica (`workers`) takes
every reply waiting when it is free (up to `max_batch`, sharing the same system prompt) and decodes them
as one batch, streaming each one's tokens to its caller through the step callback.

CTranslate2 cannot add a sequence to a batch already running. A reply asked for while every replica is
busy does not wait for a whole batch: the running replies stop at their next token and go on together
with it, each from its prompt plus what it has said so far. So one replica with every core serves both
the lone caller (measured here: first token 0.27 s with two threads against 0.46 s with two one-thread
replicas, a whole reply 2.0 s against 3.2 s) and the caller who asks while another is being answered.

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
    STEPS_DONE,
    Calls,
    LlmError,
    Message,
    Tools,
    deltas_from_steps,
)
from parley.engines.llm_ct2 import Ct2Llm
from parley.log import event

log = logging.getLogger(__name__)

GATHER_S = 0.01  # a free replica waits this long for more replies asked at the same moment
# A newcomer joins a running batch only while the running replies' prompts (read again when they go on)
# are short: reading a prompt costs ~5 ms a token on 2 cores, a decoding step ~80 ms, so re-reading up to
# this many tokens stalls the batch for less than the newcomer would wait for it to end (a reply: 2-3 s).
REJOIN_MAX_TOKENS = 384


@dataclass
class _Request:
    prompt: list[str]
    static: tuple[str, ...]
    should_stop: Callable[[], bool]
    steps: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    stopped: bool = False  # read by the step callback: the caller is gone or told to stop
    said: list[int] = field(default_factory=list)  # token ids decoded so far
    finished: bool = False  # it said its end token, or max_tokens of them
    asked_at: float = field(default_factory=time.monotonic)


class BatchedCt2Llm(Ct2Llm):
    """LlmEngine over a CTranslate2 Generator whose replicas decode the waiting replies in batches."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "cpu",
        workers: int = 1,
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
        self._busy = 0  # replicas decoding a batch
        self._threads = [
            threading.Thread(target=self._serve, name=f"llm-batch-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for thread in self._threads:
            thread.start()

    # caller side

    def _text(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: Tools | None,
        calls: Calls = True,
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
        try:
            yield from deltas_from_steps(request.steps, should_stop, self._chat)
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
            batch = self._next_batch()  # counts this replica busy
            if batch is None:
                return
            try:
                while batch:
                    batch = self._run(batch)
            finally:
                with self._condition:
                    self._busy -= 1

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
            self._busy += 1
            batch = self._take(self._waiting[0].static, self.max_batch)
            if self._waiting:
                self._condition.notify()  # the rest are another replica's
        return [r for r in batch if not r.stopped]

    def _take(self, static: tuple[str, ...], room: int) -> list[_Request]:
        """Up to `room` waiting replies that share `static`, oldest first; the condition's lock is held."""
        taken = [r for r in self._waiting if r.static == static][:room]
        for request in taken:
            self._waiting.remove(request)
        return taken

    def _worth_joining(self, batch: list[_Request]) -> bool:
        """A reply waits that could join this batch, no other replica is free to take it, and the
        running replies are cheap to go on with."""
        if sum(len(r.prompt) + len(r.said) for r in batch) > REJOIN_MAX_TOKENS:
            return False
        static = batch[0].static
        with self._condition:
            if self._busy < len(self._threads):
                return False
            return any(r.static == static and not r.stopped for r in self._waiting)

    def _run(self, batch: list[_Request]) -> list[_Request]:
        """Decode `batch`; returns the batch to go on with (newcomers joined) or [] when it is done.

        CTranslate2 cannot add a sequence to a running batch, so when a reply is asked for meanwhile, the
        running replies stop at their next token and go on, with the newcomer, as a new batch whose
        prompts end with what each has said so far: the newcomer waits one token, not a whole reply.
        """
        batch = [r for r in batch if not r.stopped and not r.finished]
        if not batch:
            return []
        alone = len(batch) == 1
        static = batch[0].static
        rejoin = False
        room = len(batch) < self.max_batch

        first_at = 0.0

        def on_step(step: Any) -> bool:
            nonlocal rejoin, first_at
            first_at = first_at or time.monotonic()
            request = batch[step.batch_id]
            if request.stopped:
                return True
            request.said.append(step.token_id)
            request.steps.put(step.token_id)
            if step.token_id in self._chat.end_ids or len(request.said) >= self.max_tokens:
                request.finished = True
                return True
            if rejoin or (room and self._waiting and self._worth_joining(batch)):
                rejoin = True
                return True
            # Alone in its batch, a reply may hold its replica (to leave the CPU to its first audio), as
            # Ct2Llm does; in company, that wait happens on its caller's thread instead.
            return alone and request.should_stop()

        started = time.monotonic()
        try:
            self._generator.generate_batch(
                [r.prompt + self._chat.pieces(r.said) for r in batch],
                static_prompt=list(static) or None,
                max_length=max(self.max_tokens - len(r.said) for r in batch),
                repetition_penalty=REPETITION_PENALTY,
                end_token=self._chat.end_tokens or None,
                include_prompt_in_result=False,
                callback=on_step,
                **self._sampling(),
            )
        except Exception as exc:
            log.exception("llm_batch_failed")
            for request in batch:
                request.steps.put(exc)
            return []
        event(
            log,
            "llm_batch",
            logging.DEBUG,
            size=len(batch),
            static_tokens=len(static),
            prompt_tokens=max(len(r.prompt) + len(r.said) for r in batch),
            first_token_s=round(first_at - started, 3) if first_at else None,
            waited_s=round(max(started - r.asked_at for r in batch), 3),
            seconds=round(time.monotonic() - started, 3),
            rejoined=rejoin,
        )
        going_on = [r for r in batch if not r.stopped and not r.finished] if rejoin else []
        for request in batch:
            if request not in going_on:
                request.steps.put(STEPS_DONE)
        if rejoin:
            with self._condition:
                going_on += self._take(static, self.max_batch - len(going_on))
        return going_on
