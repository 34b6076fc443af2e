"""Replies from CTranslate2 (int8 on a CPU, int8_float16 on a GPU): the runtime `auto` picks on a GPU, or
for a hub name or a transformers folder (engines/llm_loading.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from parley.engines.device import cpu_threads, prefer_avx512_for_ctranslate2
from parley.engines.llm import (
    REPETITION_PENALTY,
    SAMPLING_TOPK,
    Calls,
    ChatTokenizer,
    IncrementalDecoder,
    LocalLlm,
    Message,
    Tools,
)
from parley.log import event

log = logging.getLogger(__name__)

# CTranslate2 keeps the state of every static prompt it is given for the generator's life, ~170 KB per
# token here (measured: 150 distinct ~180-token prompts grew the process by 5.4 GB). A system prompt that
# names the call (an agent's {caller}, {call_id}, {now}) is a new one each call: only the first few
# distinct system prompts are cached, the rest are computed with the turn (~30 ms more a reply).
MAX_STATIC_PROMPTS = 4


class Ct2Llm(LocalLlm):
    """LlmEngine over a CTranslate2 Generator; `workers` replies are generated in parallel."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "cpu",
        workers: int = 2,
        max_tokens: int = 80,
        temperature: float = 0.0,
    ) -> None:
        if device == "cpu":
            prefer_avx512_for_ctranslate2()
        import ctranslate2

        workers = max(1, workers)
        self._chat = ChatTokenizer(model_dir)
        self._generator = ctranslate2.Generator(
            str(model_dir),
            device=device,
            compute_type="int8_float16" if device == "cuda" else "int8",
            inter_threads=workers,
            intra_threads=cpu_threads(workers),
        )
        self.device = device
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._static_prompts: set[tuple[int, ...]] = set()

    def _prompt(self, messages: list[Message], tools: Tools | None = None) -> tuple[list[str], list[str]]:
        """(static prompt, the rest): the system message's tokens, when the prompt starts with them.

        CTranslate2 keeps the model state after a static prompt and starts the next generation from it:
        measured here, the first token of a reply came ~30 ms sooner.
        """
        ids = self._chat.prompt_ids(messages, tools)
        static: list[int] = []
        if messages and messages[0]["role"] == "system":
            static = self._chat.prompt_ids(messages[:1], tools, reply=False)
            if ids[: len(static)] != static or len(static) == len(ids) or not self._cacheable(static):
                static = []
        tokens = self._chat.pieces(ids)
        return tokens[: len(static)], tokens[len(static) :]

    def _cacheable(self, static: list[int]) -> bool:
        """Whether CTranslate2 may keep this static prompt's state (bounded: it never forgets one)."""
        key = tuple(static)
        if key in self._static_prompts:
            return True
        if len(self._static_prompts) >= MAX_STATIC_PROMPTS:
            return False
        self._static_prompts.add(key)
        if len(self._static_prompts) == MAX_STATIC_PROMPTS:
            event(log, "static_prompts_full", logging.INFO, cached=MAX_STATIC_PROMPTS)
        return True

    def _sampling(self) -> dict[str, Any]:
        if self.temperature <= 0:
            return {"sampling_topk": 1}
        return {"sampling_topk": SAMPLING_TOPK, "sampling_temperature": self.temperature}

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
        steps = self._generator.generate_tokens(
            prompt,
            static_prompt=static or None,
            max_length=self.max_tokens,
            repetition_penalty=REPETITION_PENALTY,
            end_token=self._chat.end_tokens or None,
            # Runs in CTranslate2's worker before each next token: stops the model even while the
            # consumer is blocked elsewhere.
            callback=lambda _step: should_stop(),
            **self._sampling(),
        )
        decoder = IncrementalDecoder(self._chat.decode)
        try:
            for step in steps:
                if step.token_id in self._chat.end_ids or should_stop():
                    break
                tag = self._chat.tag_ids.get(step.token_id)
                if tag is not None:
                    yield tag
                    continue
                delta = decoder.push(step.token_id)
                if delta:
                    yield delta
        finally:
            steps.close()  # waits for the model to stop (at most one more token)
