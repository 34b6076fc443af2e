"""Replies from llama.cpp in this process, every call's conversation kept in the model's memory.

CTranslate2 forgets every prompt but the system message, so each reply reads the whole conversation
again (~4 ms a token on 2 cores: 0.2-0.9 s before the first token once a call has a history). Here each
conversation keeps a sequence of its own in llama.cpp's KV cache, and a new prompt is matched to the free
sequence that holds the most of it: the same start (the last prompt and reply; cut where the two part: a
reply heard only in part, a word tokenised anew), with the oldest turn dropped and the rest moved up when
the history's window has slid past it (the later cells stay where they are, a gap in their
positions). Only the rest is read. A new conversation whose system prompt (and
tools) another sequence holds copies those cells instead of reading them. Measured here (Qwen2.5-0.5B
Q4_K_M, 2 threads): a decoding step 42 ms against CTranslate2 int8's ~90 ms; reading a prompt 10-17 ms a
token against ~4, which keeping the conversations more than makes up.

One thread drives the model. Each step it reads the prompts of new replies (in chunks, so that replies
already speaking keep going) and one token of every reply being decoded, in a single `llama_decode`:
replies join and leave the batch between any two tokens. A reply whose caller has not taken its last
tokens sits the step out, so a caller that waits (the LLM stage waits for its first audio, so that TTS
gets the cores) pauses its own reply and no other.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parley import metrics
from parley.engines.llm import (
    REPETITION_PENALTY,
    SAMPLING_TOPK,
    STEPS_DONE,
    ChatTokenizer,
    LlmError,
    LocalLlm,
    Message,
    Tools,
    deltas_from_steps,
)
from parley.log import event

log = logging.getLogger(__name__)

CONTEXT_PER_SEQUENCE = 4096  # tokens of conversation each sequence can hold (the prompt window fits)
BATCH_TOKENS = 512  # tokens read in one llama_decode at most
# While other replies are speaking, a new prompt is read this many tokens a step at most: a step of
# prompt costs ~10 ms a token, and every reply in the batch waits for it.
SHARED_PREFILL_TOKENS = 96
MAX_POSITION = 16384  # half of Qwen2.5's trained context: positions beyond stay untested
SHIFT_PROBE_TOKENS = 8  # how much of the rest of a prompt is looked for further on in a sequence
COPY_MIN_TOKENS = 32  # a shared start worth copying from another sequence rather than reading again
# A reply whose caller has not taken this many of its tokens sits the next step out: a caller who reads
# on keeps far ahead of it (a step is ~40 ms), one who waits pauses its reply within a token or two.
HOLD_AHEAD = 2
PENALTY_WINDOW = 64  # the reply's last tokens that the repetition penalty looks at

_LOG_LEVEL_ERROR = 4  # ggml_log_level: GGML_LOG_LEVEL_ERROR


@dataclass
class _Request:
    prompt: list[int]
    should_stop: Callable[[], bool]
    steps: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    stopped: bool = False  # its caller is gone or told to stop: dropped at the next step
    said: list[int] = field(default_factory=list)
    asked_at: float = field(default_factory=time.monotonic)
    started_at: float = 0.0
    sequence: _Sequence | None = None
    unread: list[int] = field(default_factory=list)  # prompt tokens not yet in the KV cache
    next_token: int | None = None  # sampled, to be fed at the next step
    limit: int = 0  # tokens to say at most (0: only read the prompt)
    reused: int = 0  # prompt tokens found already in the KV cache


@dataclass
class _Sequence:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what its KV cache holds, in order
    # Each token's position. They rise by one, but for a gap where a dropped turn was: RoPE sees only
    # distances, so the later turns look a little further back, and keep the cells they were computed in.
    positions: list[int] = field(default_factory=list)
    used_at: float = 0.0
    request: _Request | None = None

    def next_position(self) -> int:
        return self.positions[-1] + 1 if self.positions else 0

    def cut(self, model: _Model, start: int, end: int | None = None) -> None:
        """Forget tokens[start:end] (to the end when None), in the KV cache and here."""
        if start >= len(self.tokens) or (end is not None and end <= start):
            return
        if end is None or end >= len(self.tokens):
            model.drop(self.seq_id, self.positions[start])
            end = len(self.tokens)
        else:
            model.drop(self.seq_id, self.positions[start], self.positions[end])
        del self.tokens[start:end]
        del self.positions[start:end]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _dropped_span(tokens: list[int], prompt: list[int], start: int) -> tuple[int, int]:
    """(end, length): the prompt goes on from `start` with `tokens[end:end + length]`, as when the history's
    window dropped its oldest turn (tokens[start:end]); (start, 0) when it does not."""
    probe = prompt[start : start + SHIFT_PROBE_TOKENS]
    if len(probe) < SHIFT_PROBE_TOKENS or len(tokens) <= start + SHIFT_PROBE_TOKENS:
        return start, 0
    held = np.asarray(tokens, dtype=np.int64)
    best = (start, 0)
    for end in np.flatnonzero(held[start + 1 :] == probe[0]) + start + 1:
        if tokens[end : end + len(probe)] == probe:
            length = _common_prefix(tokens[end:], prompt[start:])
            if length > best[1]:
                best = (int(end), length)
    return best


def _on_log(level: int, text: bytes, _data: Any) -> None:
    if level == _LOG_LEVEL_ERROR and text:
        log.warning("llama.cpp: %s", text.decode(errors="replace").rstrip())


_log_callback: Any = None  # llama.cpp keeps one process-wide pointer to it: it must live as long


def _route_logs(lc: Any) -> None:
    """llama.cpp's errors to this log, the rest of its chatter dropped; once per process."""
    global _log_callback
    if _log_callback is None:
        lc.llama_backend_init()
        _log_callback = lc.llama_log_callback(_on_log)
        lc.llama_log_set(_log_callback, ctypes.c_void_p(0))


class _Model:
    """The llama.cpp model, context and batch, through the C API that llama-cpp-python binds."""

    def __init__(self, gguf: Path, *, sequences: int, threads: int) -> None:
        import llama_cpp as lc

        self.lc = lc
        _route_logs(lc)
        params = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(str(gguf).encode(), params)
        if not self.model:
            raise LlmError(f"llama.cpp could not load {gguf}")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = CONTEXT_PER_SEQUENCE * sequences
        cparams.n_batch = cparams.n_ubatch = BATCH_TOKENS
        cparams.n_seq_max = sequences
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.kv_unified = False  # each sequence attends over its own cells only
        cparams.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise LlmError("llama.cpp could not create a context")
        self.memory = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(BATCH_TOKENS, 0, 1)

    def drop(self, seq_id: int, start: int, end: int = -1) -> None:
        """Drop the sequence's cells at positions [start, end) (end -1: all from `start` on)."""
        self.lc.llama_memory_seq_rm(self.memory, seq_id, start, end)

    def copy(self, source: int, dest: int) -> None:
        """Make sequence `dest` a copy of `source` (llama.cpp copies the cells at the next decode)."""
        self.lc.llama_memory_seq_cp(self.memory, source, dest, -1, -1)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> int:
        """One llama_decode over (token, position, sequence, wants logits); llama.cpp's return code."""
        batch = self.batch
        batch.n_tokens = len(entries)
        for i, (token, pos, seq_id, wants) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq_id
            batch.logits[i] = wants
        return int(self.lc.llama_decode(self.ctx, batch))

    def logits(self, index: int) -> np.ndarray:
        """The logits of batch entry `index`: a view of llama.cpp's buffer, valid until the next decode."""
        pointer = self.lc.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


class LlamaCppLlm(LocalLlm):
    """LlmEngine over llama.cpp: one decoding thread, a KV-cache sequence per conversation."""

    # The history's window may slide a turn at a time: a dropped turn costs nothing (see _reusable).
    reuses_prefixes = False

    def __init__(
        self,
        gguf: Path,
        tokenizer_dir: Path,
        *,
        threads: int,
        sequences: int = 8,
        max_tokens: int = 80,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.device = "cpu"
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._chat = ChatTokenizer(tokenizer_dir)
        self._model = _Model(gguf, sequences=max(1, sequences), threads=max(1, threads))
        self._sequences = [_Sequence(i) for i in range(max(1, sequences))]
        self._rng = np.random.default_rng(seed)
        self._condition = threading.Condition()
        self._waiting: list[_Request] = []
        self._active: list[_Request] = []
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="llm-llamacpp", daemon=True)
        self._thread.start()

    # caller side

    def _text(
        self, messages: list[Message], should_stop: Callable[[], bool], tools: Tools | None
    ) -> Iterator[str]:
        if should_stop():
            return
        prompt = self._chat.prompt_ids(messages, tools)
        if len(prompt) + self.max_tokens > CONTEXT_PER_SEQUENCE:
            raise LlmError(f"a prompt of {len(prompt)} tokens does not fit {CONTEXT_PER_SEQUENCE}")
        request = self._ask(prompt, should_stop, self.max_tokens)
        try:
            yield from deltas_from_steps(request.steps, should_stop, self._chat)
        finally:
            request.stopped = True
            with self._condition:
                self._condition.notify()

    def _ask(self, prompt: list[int], should_stop: Callable[[], bool], limit: int) -> _Request:
        request = _Request(prompt, should_stop, limit=limit)
        with self._condition:
            if self._closed:
                raise LlmError("the LLM engine is closed")
            self._waiting.append(request)
            self._condition.notify()
        return request

    def warm(self, system_prompt: str) -> None:
        """Read a system prompt now, before any call: every conversation that begins with it then copies
        its cells (measured: the first reply of a call waited 1.1-1.4 s more without)."""
        prompt = self._chat.prompt_ids([{"role": "system", "content": system_prompt}], reply=False)
        request = self._ask(prompt, lambda: False, limit=0)
        outcome = request.steps.get()
        if isinstance(outcome, BaseException):
            raise LlmError(f"could not read the system prompt: {outcome}") from outcome

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
                request.steps.put(LlmError("the LLM engine is closed"))

    def _next_step(self) -> bool:
        with self._condition:
            while True:
                if self._closed:
                    return False
                self._retire_stopped()
                self._admit()
                ready = [r for r in self._active if r.unread or r.steps.qsize() < HOLD_AHEAD]
                if ready:
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

    def _release(self, request: _Request) -> None:
        """The reply is over: its sequence keeps what it read (the next turn starts with it)."""
        if request in self._active:
            self._active.remove(request)
        sequence = request.sequence
        if sequence is not None:
            sequence.request = None
            sequence.used_at = time.monotonic()

    def _admit(self) -> None:
        """Give waiting replies a free sequence: the one that holds the longest start of its prompt."""
        while self._waiting:
            request = self._waiting[0]
            if request.stopped:
                self._waiting.pop(0)
                request.steps.put(STEPS_DONE)
                continue
            free = [s for s in self._sequences if s.request is None]
            if not free:
                return
            self._waiting.pop(0)
            best, keep = self._reusable(free, request.prompt)
            donor = max(self._sequences, key=lambda s: _common_prefix(s.tokens, request.prompt))
            shared = _common_prefix(donor.tokens, request.prompt)
            if shared >= keep + COPY_MIN_TOKENS:
                # Another sequence (another call's, maybe speaking now) starts the same way, with the
                # same system prompt and tools: copy its cells rather than read them again.
                best = min(free, key=lambda s: (len(s.tokens) > 0, s.used_at))
                self._model.copy(donor.seq_id, best.seq_id)
                best.tokens, best.positions = donor.tokens[:], donor.positions[:]
                best.cut(self._model, shared)
                keep = shared
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

    def _reusable(self, free: list[_Sequence], prompt: list[int]) -> tuple[_Sequence, int]:
        """The free sequence that holds the most of `prompt`, made to hold it from its start, and how much.

        A conversation's sequence holds its last prompt and reply. The next prompt begins with them, or,
        once the history's window has let the oldest turn go, with the system prompt and then the rest:
        that turn's cells are dropped and the rest kept where they are, rather than read again (the kept
        tokens were computed beside the dropped turn, which the model's reply hardly notices)."""
        scored = []
        for sequence in free:
            common = _common_prefix(sequence.tokens, prompt)
            end, length = _dropped_span(sequence.tokens, prompt, common)
            if length < COPY_MIN_TOKENS:
                end, length = common, 0
            scored.append((common + length, -sequence.used_at, sequence.seq_id, end, common))
        total, _, seq_id, end, common = max(scored)
        sequence = self._sequences[seq_id]
        sequence.cut(self._model, common, end)
        return sequence, total

    def _step(self, ready: list[_Request]) -> None:
        """One llama_decode: a chunk of each unread prompt and the next token of each reply."""
        decoding = [r for r in ready if not r.unread]
        budget = BATCH_TOKENS - len(decoding)
        per_prompt = SHARED_PREFILL_TOKENS if decoding else budget
        entries: list[tuple[int, int, int, bool]] = []
        outputs: list[_Request] = []
        fed: list[tuple[_Request, list[int]]] = []
        for request in ready:
            sequence = request.sequence
            assert sequence is not None
            if request.unread:
                take = min(len(request.unread), per_prompt, budget)
                if take <= 0:
                    continue
                chunk = request.unread[:take]
                budget -= take
            else:
                assert request.next_token is not None
                chunk = [request.next_token]
            last = len(chunk) == len(request.unread) if request.unread else True
            start = sequence.next_position()
            for i, token in enumerate(chunk):
                entries.append((token, start + i, sequence.seq_id, last and i == len(chunk) - 1))
            fed.append((request, chunk))
            if last:
                outputs.append(request)
        if not entries:
            return
        rc = self._model.decode(entries)
        if rc != 0:
            self._fail(ready, LlmError(f"llama.cpp could not decode (code {rc})"))
            return
        for request, chunk in fed:
            assert request.sequence is not None
            start = request.sequence.next_position()
            request.sequence.tokens += chunk
            request.sequence.positions += range(start, start + len(chunk))
            if request.unread:
                del request.unread[: len(chunk)]
        # Logits are numbered by the batch entries that asked for them, in batch order.
        position = 0
        for i, entry in enumerate(entries):
            if entry[3]:
                self._emit(outputs[position], self._model.logits(i))
                position += 1

    def _emit(self, request: _Request, logits: np.ndarray) -> None:
        if request.limit <= 0:  # a prompt read ahead (warm)
            request.steps.put(STEPS_DONE)
            with self._condition:
                self._release(request)
            return
        token = self._sample(logits, request.said)
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
            request.steps.put(STEPS_DONE)
            with self._condition:
                self._release(request)
            return
        request.next_token = token

    def _sample(self, logits: np.ndarray, said: list[int]) -> int:
        scores = logits.astype(np.float32, copy=True)
        if said and REPETITION_PENALTY != 1.0:
            seen = np.unique(np.asarray(said[-PENALTY_WINDOW:], dtype=np.int64))
            values = scores[seen]
            scores[seen] = np.where(values > 0, values / REPETITION_PENALTY, values * REPETITION_PENALTY)
        if self.temperature <= 0:
            return int(scores.argmax())
        top = np.argpartition(scores, -SAMPLING_TOPK)[-SAMPLING_TOPK:]
        weights = np.exp((scores[top] - scores[top].max()) / self.temperature)
        return int(self._rng.choice(top, p=weights / weights.sum()))

    def _fail(self, requests: list[_Request], error: LlmError) -> None:
        event(log, "llm_decode_failed", logging.ERROR, error=str(error), replies=len(requests))
        with self._condition:
            for request in requests:
                request.steps.put(error)
                sequence = request.sequence
                self._release(request)
                if sequence is not None:
                    sequence.cut(self._model, 0)
