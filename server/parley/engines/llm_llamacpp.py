"""Replies from llama.cpp in this process, every call's conversation kept in the model's memory.

CTranslate2 forgets every prompt but the system message, so each reply reads the whole conversation
again (~4 ms a token on 2 cores: 0.2-0.9 s before the first token once a call has a history). Here each
conversation keeps a sequence of its own in llama.cpp's KV cache, and a new prompt is matched to the free
sequence that holds the most of it: the same start (the last prompt and reply; cut where the two part: a
reply heard only in part, a word tokenised anew), less the oldest turn once the history's window has slid
past it (its cells are dropped, the later ones stay, a gap in their positions). Only the rest is read. A
new conversation whose system prompt (and tools) another sequence holds copies those cells instead of
reading them; the default system prompt and greeting are read at load. What surely comes next is read
ahead: after a reply that ended by itself, the template's opening of the caller's next turn. Measured
here (Qwen2.5-0.5B Q4_K_M, 2 threads): a decoding step 42 ms against CTranslate2 int8's ~90 ms; reading a
prompt 10-17 ms a token against ~4, which keeping the conversations more than makes up.

One thread drives the model. Each step it reads the prompts of new replies (in chunks) and one token of
each reply being decoded, in a single `llama_decode`: replies join and leave the batch between any two
tokens. A step is for the replies due first (engines/urgency.py): a caller still waiting for their first
words goes ahead of a reply that is speaking. A reply whose caller has not taken its last tokens, or who
is deciding whether to stop (the LLM stage waits there for its first audio, so that TTS gets the cores),
sits the step out: a caller that waits pauses its own reply and no other.

Work of no live call (a post-call analysis, due `NEVER`: engines/urgency.py) yields to every call's: it
gets no sequence while a call's reply waits for one, no step while any call's reply is in flight or its
own rule holds it, and reads its prompt a few tokens a step on one thread, so that a caller whose turn
ends meanwhile waits for one short step at most and the other core stays with the calls' Whisper and
Piper. It takes a sequence no call's conversation needs, so that no live call reads its history again
for it. Those rules (who gets a sequence, who takes part in a step) are llamacpp_schedule.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from parley import metrics
from parley.engines.compute_load import COMPUTE
from parley.engines.device import cpu_threads
from parley.engines.llamacpp_model import (
    BATCH_TOKENS,
    CONTEXT_PER_SEQUENCE,
    LlamaCppModel,
    Sequence,
    place,
)
from parley.engines.llamacpp_schedule import (
    BACKGROUND_PREFILL_TOKENS,
    Request,
    may_step,
    most_urgent,
    next_to_admit,
    reading_ahead_of,
    room_for_background,
)
from parley.engines.llm import (
    STEPS_DONE,
    Calls,
    ChatTokenizer,
    LlmError,
    LocalLlm,
    Message,
    Tools,
    deltas_from_steps,
    offered,
)
from parley.engines.token_choice import TokenChooser, end_call
from parley.engines.tool_grammar import grammar_for, json_grammar_for
from parley.log import event

log = logging.getLogger(__name__)

# While other replies are speaking, a new prompt is read this many tokens a step at most: a step of
# prompt costs ~10 ms a token, and every reply in the batch waits for it.
SHARED_PREFILL_TOKENS = 96
MAX_POSITION = 16384  # half of Qwen2.5's trained context: positions beyond stay untested
READ_AHEAD_DUE_S = 1.0  # the opening of a caller's next turn is read before replies due later than this
JSON_REPLY_TOKENS = 256  # a JSON reply's tokens at most (a post-call extraction or verdict)


class LlamaCppLlm(LocalLlm):
    """LlmEngine over llama.cpp: one decoding thread, a KV-cache sequence per conversation."""

    # The history's window may slide a turn at a time: a dropped turn costs nothing (see _reusable).
    reuses_prefixes = False

    def __init__(
        self,
        gguf: Path,
        tokenizer_dir: Path,
        *,
        threads: int = 0,
        sequences: int = 8,
        max_tokens: int = 80,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.device = "cpu"
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._chat = ChatTokenizer(tokenizer_dir)
        self._next_turn_opening = self._chat.next_turn_opening()
        # 0: every core, or one while Whisper or Piper computes (see _threads)
        self._fixed_threads = threads
        self._threads_now = threads or cpu_threads()
        self._model = LlamaCppModel(gguf, sequences=max(1, sequences), threads=self._threads_now)
        self._sequences = [Sequence(i) for i in range(max(1, sequences))]
        self._chooser = TokenChooser(
            self._model.lc,
            self._model.vocab,
            end_ids=self._chat.end_ids,
            sentence_end_ids=self._chat.sentence_end_ids,
            tag_ids=self._chat.tag_ids,
            token_texts=self._chat.tokenizer.get_vocab(),
            temperature=temperature,
            seed=seed,
        )
        self._condition = threading.Condition()
        self._warm_start: list[int] = []  # what every conversation begins with (`warm`)
        self._background_seqs: set[int] = set()  # sequences last used by work of no live call
        self._waiting: list[Request] = []
        self._active: list[Request] = []
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="llm-llamacpp", daemon=True)
        self._thread.start()

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
        prompt = self._chat.prompt_ids(messages, tools)
        if len(prompt) + self.max_tokens > CONTEXT_PER_SEQUENCE:
            raise LlmError(f"a prompt of {len(prompt)} tokens does not fit {CONTEXT_PER_SEQUENCE}")
        earlier = [
            self._chat.encode(m["content"])
            for m in messages
            if m.get("role") == "assistant" and isinstance(m.get("content"), str)
        ]
        if not tools or calls is False:
            request = self._ask(prompt, self.max_tokens, earlier, words_only=bool(tools))
        elif calls is True:
            request = self._ask(prompt, self.max_tokens, earlier, grammar_for(tools))
        else:  # it must call one of the tools named: held to their grammar from its first token
            grammar = grammar_for(offered(tools, calls))
            request = self._ask(prompt, self.max_tokens, earlier, grammar, json_reply=grammar is not None)
        yield from self._deltas(request, should_stop)

    def json_reply(
        self,
        messages: list[Message],
        schema: dict[str, Any],
        should_stop: Callable[[], bool],
        *,
        max_tokens: int = JSON_REPLY_TOKENS,
    ) -> str:
        """The reply to `messages` as JSON of `schema`: held to the schema's grammar from its first token
        (engines/tool_grammar.py), so that a reply that ends by itself is that JSON. A schema the grammar
        cannot take leaves the reply free (its asker checks it)."""
        if should_stop():
            return ""
        prompt = self._chat.prompt_ids(messages)
        if len(prompt) + max_tokens > CONTEXT_PER_SEQUENCE:
            raise LlmError(f"a prompt of {len(prompt)} tokens does not fit {CONTEXT_PER_SEQUENCE}")
        grammar = json_grammar_for(schema)
        request = self._ask(prompt, max_tokens, tool_grammar=grammar, json_reply=grammar is not None)
        return "".join(self._deltas(request, should_stop))

    def _deltas(self, request: Request, should_stop: Callable[[], bool]) -> Iterator[str]:
        """`request`'s text as it is decoded, until it ends or `should_stop`."""

        def asking_to_stop() -> bool:
            # While its caller waits in there (the LLM stage waits for its first audio), the reply sits
            # the steps out: no token ahead of it is decoded on the cores the audio is being made on.
            request.waiting = True
            try:
                return should_stop()
            finally:
                request.waiting = False
                with self._condition:
                    self._condition.notify()

        try:
            yield from deltas_from_steps(request.steps, asking_to_stop, self._chat)
        finally:
            request.stopped = True
            with self._condition:
                self._condition.notify()

    def _ask(
        self,
        prompt: list[int],
        limit: int,
        earlier: list[list[int]] | None = None,
        tool_grammar: str | None = None,
        *,
        words_only: bool = False,
        json_reply: bool = False,
    ) -> Request:
        request = Request(
            prompt,
            limit,
            earlier=earlier or [],
            tool_grammar=tool_grammar,
            words_only=words_only,
            json_reply=json_reply,
        )
        with self._condition:
            if self._closed:
                raise LlmError("the LLM engine is closed")
            self._waiting.append(request)
            self._condition.notify()
        return request

    def warm(self, messages: list[Message], tools: Tools | None = None) -> None:
        """Read now, before any call, what every conversation begins with (the system prompt and the
        tools offered, the greeting, the opening of the caller's first turn): each call then copies those
        cells (measured: its first reply waited 0.4-1.4 s more without; an order desk's tools, ~2 s more
        on Qwen2.5-Coder-1.5B)."""
        ids = self._chat.prompt_ids(messages, tools, reply=False)
        self._warm_start = ids
        opening = self._next_turn_opening
        # ... and the opening of the caller's first turn, where the template's end of a message begins it
        overlap = next((n for n in range(len(opening), 0, -1) if ids[-n:] == opening[:n]), 0)
        request = self._ask(ids + opening[overlap:] if overlap else ids, limit=0)
        outcome = request.steps.get()
        if isinstance(outcome, BaseException):
            raise LlmError(f"could not read the conversation's start: {outcome}") from outcome

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        self._thread.join()
        self._model.close()

    # the decoding thread

    def _serve(self) -> None:
        try:
            while self._next_step():
                pass
        finally:
            with self._condition:
                left = self._waiting + self._active
                self._waiting, self._active = [], []
            for request in left:
                end_call(request)
                request.steps.put(LlmError("the LLM engine is closed"))

    def _next_step(self) -> bool:
        with self._condition:
            while True:
                if self._closed:
                    return False
                self._retire_stopped()
                self._admit()
                live = any(not r.background for r in (*self._waiting, *self._active))
                ready = [r for r in self._active if may_step(r, live)]
                if ready:
                    ready = most_urgent(ready)
                    break
                # Nothing to read and every reply waits for its caller: sleep until one moves.
                self._condition.wait(0.05 if self._active else None)
        try:
            self._step(ready)
        except Exception as exc:  # one failed step costs its replies, never the engine
            log.exception("llm_step_failed")
            self._fail(ready, LlmError(f"llama.cpp failed: {exc}"))
        return True

    def _retire_stopped(self) -> None:
        for request in [r for r in self._active if r.stopped]:
            self._release(request)

    def _release(self, request: Request) -> None:
        """The reply is over: its sequence keeps what it read (the next turn starts with it)."""
        if request in self._active:
            self._active.remove(request)
        end_call(request)
        sequence = request.sequence
        if sequence is not None:
            sequence.request = None
            sequence.used_at = time.monotonic()

    def _admit(self) -> None:
        """Give waiting replies a free sequence (llamacpp_model.place), and what of their prompt is left:
        live calls' first, in order; work of no live call once no call's is in flight."""
        while self._waiting:
            request = next_to_admit(self._waiting)
            if request.stopped:
                self._waiting.remove(request)
                request.steps.put(STEPS_DONE)
                continue
            if request.background and any(not r.background for r in self._active):
                return
            free = [s for s in self._sequences if s.request is None]
            if not free or reading_ahead_of(self._sequences, request.prompt):
                return
            self._waiting.remove(request)
            if request.background:
                free = self._room_for_background(free, request.prompt)
            best, keep = place(self._model, self._sequences, free, request.prompt)
            if request.background:
                self._background_seqs.add(best.seq_id)
            else:
                self._background_seqs.discard(best.seq_id)
            # At least the prompt's last token is read again: its logits give the first token.
            keep = min(keep, len(request.prompt) - 1)
            if best.next_position() + len(request.prompt) + self.max_tokens > MAX_POSITION:
                keep = 0  # gaps have added up (a long call): read it afresh from position 0
            best.cut(self._model, keep)
            best.request = request
            request.sequence = best
            request.reused = keep
            request.unread = request.prompt[keep:]
            metrics.LLM_PROMPT_TOKENS_TOTAL.labels(outcome="kept").inc(keep)
            metrics.LLM_PROMPT_TOKENS_TOTAL.labels(outcome="read").inc(len(request.unread))
            request.started_at = time.monotonic()
            self._active.append(request)

    def _room_for_background(self, free: list[Sequence], prompt: list[int]) -> list[Sequence]:
        return room_for_background(free, prompt, self._sequences, self._warm_start, self._background_seqs)

    def _step(self, ready: list[Request]) -> None:
        """One llama_decode: a chunk of each unread prompt and the next token of each reply."""
        decoding = [r for r in ready if not r.unread]
        budget = BATCH_TOKENS - len(decoding)
        per_prompt = SHARED_PREFILL_TOKENS if decoding else budget
        entries: list[tuple[int, int, int, bool]] = []
        fed: list[tuple[Request, list[int], int | None]] = []  # and the entry whose logits it gets
        for request in ready:
            sequence = request.sequence
            assert sequence is not None
            if request.unread:
                most = min(per_prompt, BACKGROUND_PREFILL_TOKENS) if request.background else per_prompt
                take = min(len(request.unread), most, budget)
                if take <= 0:
                    continue
                chunk = request.unread[:take]
                budget -= take
            else:
                assert request.next_token is not None
                chunk = [request.next_token]
            last = len(chunk) == len(request.unread) or not request.unread
            start = sequence.next_position()
            for i, token in enumerate(chunk):
                entries.append((token, start + i, sequence.seq_id, last and i == len(chunk) - 1))
            fed.append((request, chunk, len(entries) - 1 if last else None))
        if not entries:
            return
        self._threads(background=all(r.background for r in ready))
        rc = self._model.decode(entries)
        if rc != 0:
            self._fail(ready, LlmError(f"llama.cpp could not decode (code {rc})"))
            return
        for request, chunk, _ in fed:
            assert request.sequence is not None
            start = request.sequence.next_position()
            request.sequence.tokens += chunk
            request.sequence.positions += range(start, start + len(chunk))
            del request.unread[: len(chunk)]
        for request, _, output in fed:
            if output is not None:
                self._emit(request, self._model.logits(output))

    def _threads(self, *, background: bool = False) -> None:
        """Every core, unless another engine is computing or the step is work of no live call: then one
        thread.

        llama.cpp's threads meet at a spinning barrier after every operation: when Whisper or Piper takes
        a core from one of them (engines/compute_load.py), the other spins out its time slice. Otherwise
        two threads finish a step in about half the time (a token alone: 35 against 65 ms; six replies'
        tokens: 82 against 147 ms), even while several calls' media run beside them. Until the rows of a
        step went in sequence order (llamacpp_model.py), a step of several replies was often several
        passes over the weights, all barriers, and one thread did better while several conversations
        were in flight; measured again after that change (2-core Xeon, alternating runs): six SIP callers
        asking at once p50 3.15, 2.62, 2.78, 2.95 s against 3.91, 3.17, 3.53, 3.10 s on one thread, three
        callers asking every 8-12 s p50 1.18 / p95 2.26 and 1.18 / 2.08 s against 1.37 / 2.46 and
        1.28 / 2.51 s.
        """
        if self._fixed_threads:
            return
        # Work of no live call takes one: a call's Whisper or Piper that starts during its step gets a
        # core at once, with no LLM thread spinning at a barrier for it.
        threads = 1 if COMPUTE.busy() or background else cpu_threads()
        if threads != self._threads_now:
            self._model.set_threads(threads)
            self._threads_now = threads

    def _emit(self, request: Request, logits: np.ndarray) -> None:
        if request.limit <= 0:  # a prompt read ahead (warm)
            request.steps.put(STEPS_DONE)
            with self._condition:
                self._release(request)
            return
        token = self._chooser.next_token(request, logits)
        if not request.said:
            event(
                log,
                "llm_first_token",
                logging.DEBUG,
                prompt_tokens=len(request.prompt),
                reused_tokens=request.reused,
                waited_s=round(request.started_at - request.asked_at, 3),
                seconds=round(time.monotonic() - request.started_at, 3),
                batch=len(self._active),
            )
        request.said.append(token)
        request.steps.put(token)
        if token in self._chat.end_ids or len(request.said) >= request.limit:
            request.next_token = None
            with self._condition:
                self._release(request)
                self._read_next_opening(request)
            request.steps.put(STEPS_DONE)
            return
        request.next_token = token

    def _read_next_opening(self, request: Request) -> None:
        """A reply that ended by itself is followed, in its conversation's next prompt, by the template's
        opening of the caller's next turn: read that now, while the caller listens, and the next turn's
        first token waits for that many tokens fewer (five, ~10 ms each here). A reply cut short, or one
        that called a tool, is followed by something else: nothing is read for it."""
        sequence, opening = request.sequence, self._next_turn_opening
        if sequence is None or not opening or request.said[-1:] != opening[:1] or request.background:
            return
        if request.called or any(token in self._chat.tag_ids for token in request.said):
            return
        due = time.monotonic() + READ_AHEAD_DUE_S
        self._waiting.append(Request(sequence.tokens + opening, limit=0, due=lambda: due))

    def _fail(self, requests: list[Request], error: LlmError) -> None:
        event(log, "llm_decode_failed", logging.ERROR, error=str(error), replies=len(requests))
        with self._condition:
            for request in requests:
                request.steps.put(error)
                sequence = request.sequence
                self._release(request)
                if sequence is not None:
                    sequence.cut(self._model, 0)
