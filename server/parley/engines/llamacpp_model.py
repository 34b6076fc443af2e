"""llama.cpp's model, context and batch through the C API that llama-cpp-python binds, and its sequences.

The engine (`llm_llamacpp.py`) decides what to read and when; this module loads the model, holds one
context with a KV-cache sequence per conversation, runs `llama_decode` over a batch of entries, keeps,
for each sequence, the tokens its cells hold, and finds the sequence a new prompt takes up (`place`).
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parley.engines.llm import LlmError

log = logging.getLogger(__name__)

CONTEXT_PER_SEQUENCE = 4096  # tokens of conversation each sequence can hold (the prompt window fits)
BATCH_TOKENS = 512  # tokens read in one llama_decode at most
COPY_MIN_TOKENS = 32  # a shared start worth copying from another sequence rather than reading again
SHIFT_PROBE_TOKENS = 8  # how much of the rest of a prompt is looked for further on in a sequence
FILLER_TOKEN = 0  # what a gap in a batch's sequences is filled with (read, then dropped: see decode)
_LOG_LEVEL_ERROR = 4  # ggml_log_level: GGML_LOG_LEVEL_ERROR


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


def _has_amx_kernels(lc: Any) -> bool:
    """Whether this llama.cpp build carries ggml's AMX kernels (built with -march=native on an Intel CPU
    that has AMX). Those kernels crash in the first llama_decode of Qwen2.5-0.5B's mixed Q4_K_M weights
    (llama-cpp-python 0.3.36 on a Xeon with AMX-INT8: SIGSEGV), so the model is loaded without them."""
    return b"AMX_INT8 = 1" in bytes(lc.llama_print_system_info() or b"")


def requantize_to_q4_0(source: Path, dest: Path) -> None:
    """Write `source` to `dest` with its layers' weights and its output matrix as Q4_0, its token
    embeddings as they are.

    llama.cpp repacks Q4_0 rows at load into the interleaved layout its AVX2, AVX-512 and Arm kernels read
    several rows at a time; the Q5_0 and K-quants that Qwen2.5-0.5B's Q4_K_M file holds (its rows of 896
    do not fit the K-quants' 256) stay plain. Measured on this 2-core AMD EPYC, the layers: a decoding
    step 22 -> 15 ms on two threads and 35 -> 23 ms on one, a 300-token prompt 0.53 -> 0.39 s; the answers
    as right as before (`bench answers --repeat 2`: 34 of 42 against 30). The output matrix (Q8_0 in the
    package, 136 M weights that every token's logits read) then: a step of one reply's token 14.5 -> 11.3
    ms on two threads, six replies' 61 -> 47 ms; on one thread 20 -> 17 and 112 -> 87 ms; the same 34 of
    42 answers right and 5 of 7 tool calls, mean NLL over 2,448 tokens of prose +0.4 %. The token
    embeddings are only looked up, a row a token: they stay as packaged.
    """
    import llama_cpp as lc
    from gguf import GGUFReader

    _route_logs(lc)
    kept = {t.name: int(t.tensor_type) for t in GGUFReader(source).tensors}
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 0  # every core
    params.output_tensor_type = lc.GGML_TYPE_Q4_0
    if "token_embd.weight" in kept:
        params.token_embedding_type = kept["token_embd.weight"]
    if lc.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params)) != 0:
        raise LlmError(f"llama.cpp could not requantize {source}")


class LlamaCppModel:
    """The llama.cpp model, context and batch, through the C API that llama-cpp-python binds."""

    def __init__(self, gguf: Path, *, sequences: int, threads: int) -> None:
        import llama_cpp as lc

        self.lc = lc
        _route_logs(lc)
        params = lc.llama_model_default_params()
        if _has_amx_kernels(lc):
            # Extra buffer types are AMX and the CPU's repacked layouts: without them every weight stays
            # in the plain CPU buffer (measured on that Xeon: no slower for this model). The Makefile builds
            # llama.cpp without AMX, so that the repacked layouts stay; this guards older builds.
            log.warning("llama.cpp was built with AMX kernels, which crash: loading without extra buffers")
            params.use_extra_bufts = False
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
        if not lc.llama_supports_gpu_offload():
            # On the CPU, llama.cpp's fused attention is slower than its plain one (a step of six
            # replies with 400 tokens of conversation each on one thread of a Xeon: 214 against 159 ms;
            # one reply 73 against 65 ms), yet `auto` picks it. Same logits up to rounding. A build that
            # offloads to a GPU keeps `auto`, where the fused kernel is the fast one.
            cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise LlmError("llama.cpp could not create a context")
        self.memory = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(BATCH_TOKENS, 0, 1)
        self._rows: list[int] = []  # the batch row of each entry of the last decode

    def set_threads(self, threads: int) -> None:
        self.lc.llama_set_n_threads(self.ctx, threads, threads)

    def drop(self, seq_id: int, start: int, end: int = -1) -> None:
        """Drop the sequence's cells at positions [start, end) (end -1: all from `start` on)."""
        self.lc.llama_memory_seq_rm(self.memory, seq_id, start, end)

    def copy(self, source: int, dest: int) -> None:
        """Make sequence `dest` a copy of `source` (llama.cpp copies the cells at the next decode)."""
        self.lc.llama_memory_seq_cp(self.memory, source, dest, -1, -1)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> int:
        """One llama_decode over (token, position, sequence, wants logits); llama.cpp's return code.

        With a KV stream per sequence, llama.cpp cuts a batch into micro-batches, each a run of sequence
        ids that rise by one in batch order, and every micro-batch is another pass over all the weights:
        six replies' tokens in the order their calls asked took 267 ms a step on one thread of a Xeon,
        against 148 ms in sequence order. So the rows go in sequence order, and a sequence missing
        between two in the batch (a call that is listening, or a reply held back) gets a throwaway token
        at its next position, dropped after the step: a row costs far less than a pass (replies on
        sequences 0, 2, 4 and 6: 244 ms split, 148 ms filled). `logits(i)` still answers for entries[i].
        """
        present = {seq_id for _, _, seq_id, _ in entries}
        fillers = [
            (FILLER_TOKEN, int(self.lc.llama_memory_seq_pos_max(self.memory, seq_id)) + 1, seq_id, False)
            for seq_id in range(min(present, default=0), max(present, default=0))
            if seq_id not in present
        ]
        if len(entries) + len(fillers) > BATCH_TOKENS:
            fillers = []
        # (entry index or -1 for a filler, entry), in sequence order; a sequence's own rows keep theirs
        rows = sorted([*enumerate(entries), *((-1, f) for f in fillers)], key=lambda row: row[1][2])
        batch = self.batch
        batch.n_tokens = len(rows)
        self._rows = [0] * len(entries)
        for index, (entry, (token, pos, seq_id, wants)) in enumerate(rows):
            batch.token[index] = token
            batch.pos[index] = pos
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = seq_id
            batch.logits[index] = wants
            if entry >= 0:
                self._rows[entry] = index
        rc = int(self.lc.llama_decode(self.ctx, batch))
        for _, position, seq_id, _ in fillers:
            self.drop(seq_id, position)
        return rc

    def logits(self, index: int) -> np.ndarray:
        """The logits of entries[index] of the last decode: a view of llama.cpp's buffer, valid until the
        next decode."""
        pointer = self.lc.llama_get_logits_ith(self.ctx, self._rows[index])
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


@dataclass
class Sequence:
    """One KV-cache sequence: a conversation's cells, and the reply using them now (None: free)."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what its KV cache holds, in order
    # Each token's position. They rise by one, but for a gap where a dropped turn was: RoPE sees only
    # distances, so the later turns look a little further back, and keep the cells they were computed in.
    positions: list[int] = field(default_factory=list)
    used_at: float = 0.0
    request: object | None = None

    def next_position(self) -> int:
        return self.positions[-1] + 1 if self.positions else 0

    def cut(self, model: LlamaCppModel, start: int, end: int | None = None) -> None:
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


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def dropped_span(tokens: list[int], prompt: list[int], start: int) -> tuple[int, int]:
    """(end, length): the prompt goes on from `start` with `tokens[end:end + length]`, as when the history's
    window dropped its oldest turn (tokens[start:end]); (start, 0) when it does not."""
    probe = prompt[start : start + SHIFT_PROBE_TOKENS]
    if len(probe) < SHIFT_PROBE_TOKENS or len(tokens) <= start + SHIFT_PROBE_TOKENS:
        return start, 0
    held = np.asarray(tokens, dtype=np.int64)
    best = (start, 0)
    for end in np.flatnonzero(held[start + 1 :] == probe[0]) + start + 1:
        if tokens[end : end + len(probe)] == probe:
            length = common_prefix(tokens[end:], prompt[start:])
            if length > best[1]:
                best = (int(end), length)
    return best


def place(
    model: LlamaCppModel, sequences: list[Sequence], free: list[Sequence], prompt: list[int]
) -> tuple[Sequence, int]:
    """The sequence of `free` for `prompt`, made to hold as much of its start as can be had, and how much.

    A conversation's sequence holds its last prompt and reply. Its next prompt begins with them, or,
    once the history's window has let the oldest turn go, with the system prompt and then the rest:
    that turn's cells are dropped and the rest kept where they are, rather than read again (the kept
    tokens were computed beside the dropped turn, which the model's reply hardly notices). What a
    sequence holds beyond what the prompt can use is another conversation's, lost if the prompt takes
    it: a prompt that shares only the system prompt with it copies that start from any sequence into
    an empty one (or the one used longest ago) instead.
    """
    options = []
    for sequence in free:
        common = common_prefix(sequence.tokens, prompt)
        end, length = dropped_span(sequence.tokens, prompt, common)
        if length < COPY_MIN_TOKENS:
            end, length = common, 0
        lost = len(sequence.tokens) - (end - common) - (common + length)
        options.append((common + length - lost, -sequence.used_at, sequence.seq_id, end, common, length))
    value, _, seq_id, end, common, length = max(options)
    donor = max(sequences, key=lambda s: common_prefix(s.tokens, prompt))
    shared = common_prefix(donor.tokens, prompt)
    target = min(free, key=lambda s: (len(s.tokens), s.used_at))
    if donor is not target and shared - len(target.tokens) >= value + COPY_MIN_TOKENS:
        model.copy(donor.seq_id, target.seq_id)
        target.tokens, target.positions = donor.tokens[:], donor.positions[:]
        target.cut(model, shared)
        return target, shared
    sequence = sequences[seq_id]
    sequence.cut(model, common, end)
    return sequence, common + length
