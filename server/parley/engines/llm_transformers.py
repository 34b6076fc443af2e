"""Replies from a transformers causal LM (hub name or local folder): the GPU path of the torch stack."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from parley.engines.llm import (
    REPETITION_PENALTY,
    SAMPLING_TOPK,
    Calls,
    LlmError,
    LocalLlm,
    Message,
    Tools,
    template_messages,
)

log = logging.getLogger(__name__)


class TransformersLlm(LocalLlm):
    """LlmEngine over a transformers causal LM (hub name or local folder); GPU when there is one.

    On a GPU, eager decoding is launch-bound: measured on an H200 (field notes), 35-52 tokens/s per
    stream whatever the model size, where a static KV cache with the decoding step captured in CUDA
    graphs reached 144-262. So on CUDA it decodes with a static cache, which makes transformers compile
    the step ("reduce-overhead", CUDA graphs) on first use; `static_cache` forces the choice either way
    (the CPU takes the same path, without the compilation, in the tests).
    """

    def __init__(
        self,
        source: str,
        *,
        device: str = "cpu",
        max_tokens: int = 80,
        temperature: float = 0.0,
        static_cache: bool | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        # Progress bars would garble the one-line-per-event server log.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        if device == "cuda" and not torch.cuda.is_available():
            log.warning("torch has no CUDA; the transformers LLM runs on CPU")
            device = "cpu"
        self.device = device
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.static_cache = device == "cuda" if static_cache is None else static_cache
        self._tokenizer = AutoTokenizer.from_pretrained(source)
        dtype = torch.float16 if device == "cuda" else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        self._model = model.to(device).eval()
        self._lock = threading.Lock()

    def _text(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: Tools | None,
        calls: Calls = True,
    ) -> Iterator[str]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        if should_stop():
            return
        with self._lock:
            encoded: Any = self._tokenizer.apply_chat_template(
                template_messages(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )
        streamer: Any = TextIteratorStreamer(self._tokenizer, skip_prompt=True, skip_special_tokens=True)
        stopped = threading.Event()
        failure: list[BaseException] = []

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                flag = stopped.is_set() or should_stop()
                return torch.full((input_ids.shape[0],), flag, dtype=torch.bool, device=input_ids.device)

        options: dict[str, Any] = {
            **{k: v.to(self.device) for k, v in encoded.items()},
            "max_new_tokens": self.max_tokens,
            "repetition_penalty": REPETITION_PENALTY,
            "streamer": streamer,
            "stopping_criteria": StoppingCriteriaList([_Stop()]),
            "pad_token_id": self._tokenizer.pad_token_id or self._tokenizer.eos_token_id,
        }
        if self.temperature > 0:
            options.update(do_sample=True, temperature=self.temperature, top_k=SAMPLING_TOPK)
        else:
            options.update(do_sample=False)
        if self.static_cache:
            options["cache_implementation"] = "static"

        def run() -> None:
            try:
                with torch.inference_mode():
                    self._model.generate(**options)
            except BaseException as exc:
                failure.append(exc)
                streamer.end()  # unblocks the reader, which then raises

        worker = threading.Thread(target=run, name="llm-transformers", daemon=True)
        worker.start()
        try:
            for text in streamer:
                if should_stop():
                    break
                if text:
                    yield text
            if failure:
                raise LlmError(f"generation failed: {failure[0]}") from failure[0]
        finally:
            stopped.set()
            worker.join()
