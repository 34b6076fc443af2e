"""Which LLM engine a service runs, and loading it: an endpoint (`--llm-url`), or a local model in the
runtime that suits the device and the weights (`--llm-runtime auto`)."""

from __future__ import annotations

from parley.engine_settings import EngineSettings
from parley.engines.cache import PACKAGED_LLMS, llm_ct2_dir, llm_gguf, llm_hf_source
from parley.engines.device import resolve_device
from parley.engines.llm import LlmEngine, Opening
from parley.engines.llm_ct2 import Ct2Llm


def llm_runtime(settings: EngineSettings, device: str) -> str:
    """The runtime `--llm-runtime auto` means: llama.cpp on a CPU (it keeps each conversation, so a
    turn reads only what is new), for the weights it takes (a packaged model or a .gguf file);
    CTranslate2 on a GPU, or for a hub name or a transformers folder."""
    if settings.llm_runtime != "auto":
        return settings.llm_runtime
    model = settings.local_llm()
    gguf = model in PACKAGED_LLMS or model.endswith(".gguf")
    return "llamacpp" if device == "cpu" and gguf else "ctranslate2"


def load_llm(settings: EngineSettings, *, opening: Opening | None = None) -> LlmEngine:
    """The LLM the engine settings name. `opening`: what every call of the service's default agent
    begins with (agent/opening.py), which a llama.cpp model reads at load, so that no call reads it again."""
    if settings.llm_url:
        from parley.engines.endpoint import OpenAiLlm

        return OpenAiLlm(
            settings.llm_url,
            model=settings.llm_endpoint_model,
            api_key=settings.llm_api_key,
            max_tokens=settings.llm_max_tokens,
            temperature=settings.llm_temperature,
        )
    device = resolve_device(settings.device)
    cache_dir = settings.resolved_cache_dir()
    runtime = llm_runtime(settings, device)
    if runtime == "transformers":
        from parley.engines.llm_transformers import TransformersLlm

        return TransformersLlm(
            llm_hf_source(cache_dir, settings.local_llm()),
            device=device,
            max_tokens=settings.llm_max_tokens,
            temperature=settings.llm_temperature,
        )
    if runtime == "llamacpp":
        from parley.engines.llm_llamacpp import LlamaCppLlm

        gguf, tokenizer_dir = llm_gguf(cache_dir, settings.local_llm())
        engine = LlamaCppLlm(
            gguf,
            tokenizer_dir,
            threads=settings.llm_threads,
            sequences=settings.llm_max_batch,
            max_tokens=settings.llm_max_tokens,
            temperature=settings.llm_temperature,
        )
        if opening is not None and any(m.get("content") for m in opening.messages):
            engine.warm(opening.messages, opening.tools)
        return engine
    if settings.llm_max_batch > 1:
        from parley.engines.llm_batching import BatchedCt2Llm

        return BatchedCt2Llm(
            llm_ct2_dir(cache_dir, settings.local_llm()),
            device=device,
            workers=settings.llm_workers,
            max_tokens=settings.llm_max_tokens,
            temperature=settings.llm_temperature,
            max_batch=settings.llm_max_batch,
        )
    return Ct2Llm(
        llm_ct2_dir(cache_dir, settings.local_llm()),
        device=device,
        workers=settings.llm_workers,
        max_tokens=settings.llm_max_tokens,
        temperature=settings.llm_temperature,
    )
