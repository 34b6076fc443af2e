"""The models behind the call stages: loaded once per process, shared by every call.

Nothing here imports torch at module import time: the default configuration (silero ONNX, Whisper and
Qwen2.5-0.5B through CTranslate2, Piper) runs without it; only the transformers runtime and the one-off LLM
conversion load it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

from parley.config import Settings
from parley.engine_settings import EngineSettings
from parley.engines.cache import llm_ct2_dir, llm_gguf, llm_hf_source
from parley.engines.denoise import Denoiser, load_denoiser
from parley.engines.denoise_workers import DenoiseWorkers
from parley.engines.device import resolve_device, single_threaded_blas
from parley.engines.llm import LlmEngine, Opening
from parley.engines.llm_loading import llm_runtime, load_llm
from parley.engines.stt import SttEngine, load_stt
from parley.engines.tts import TtsEngine, load_tts, voice_files
from parley.engines.turn_end import SmartTurn, load_turn_end, turn_model_path
from parley.engines.vad import VadEngine, load_vad, packaged_silero_path
from parley.engines.vad_batching import VadWorker
from parley.engines.whisper_cache import whisper_source
from parley.log import event

log = logging.getLogger(__name__)

__all__ = ["Engines", "LlmEngine", "SttEngine", "TtsEngine", "VadEngine", "load_engines", "prepare_models"]

T = TypeVar("T")


@dataclass
class Engines:
    vad: VadEngine
    stt: SttEngine
    llm: LlmEngine
    tts: TtsEngine
    turn_end: SmartTurn | None = None  # has the caller finished? (None: silence alone decides)
    denoiser: Denoiser | None = None  # cleans the caller's audio before the VAD (None: --denoise off)
    vad_worker: VadWorker = field(init=False)  # runs every call's VAD stage, batching the VAD model
    denoise_workers: DenoiseWorkers | None = field(init=False)  # run every call's denoise stage

    def __post_init__(self) -> None:
        self.vad_worker = VadWorker(self.vad)
        self.denoise_workers = DenoiseWorkers() if self.denoiser is not None else None

    def close(self) -> None:
        """Stop the worker threads of the engines that have them (idempotent)."""
        self.vad_worker.close()
        if self.denoise_workers is not None:
            self.denoise_workers.close()
        for engine in (self.stt, self.llm, self.tts, self.vad):
            close = getattr(engine, "close", None)
            if callable(close):
                close()


def _timed(kind: str, settings: Settings, load: Callable[[Settings], T]) -> T:
    started = time.perf_counter()
    engine = load(settings)
    event(
        log,
        "engine_loaded",
        engine=kind,
        impl=type(engine).__name__,
        device=getattr(engine, "device", "cpu"),
        seconds=round(time.perf_counter() - started, 2),
    )
    return engine


def load_engines(settings: Settings, opening: Opening | None = None) -> Engines:
    """Load all four engines (blocking: seconds when the cache is warm, longer on a first run). The engine
    settings name the models, the turn settings the end-of-turn model; the LLM reads `opening` (what every
    call of the default agent begins with: agent/opening.py) at load."""
    started = time.perf_counter()
    loaded: list[object] = []
    try:
        vad = _timed("vad", settings, load_vad)
        stt = _timed("stt", settings, load_stt)
        loaded.append(stt)
        llm = _timed("llm", settings, partial(load_llm, opening=opening))
        loaded.append(llm)
        tts = _timed("tts", settings, load_tts)
        turn_end = _timed("turn_end", settings, load_turn_end) if turn_model_path(settings) else None
        denoiser = _timed("denoise", settings, _denoiser) if settings.denoise != "off" else None
    except BaseException:
        for engine in loaded:
            close = getattr(engine, "close", None)
            if callable(close):
                close()
        raise
    # After the engines: a BLAS library one of them loaded is kept to one thread too.
    blas_threads = single_threaded_blas()
    event(log, "engines_loaded", seconds=round(time.perf_counter() - started, 2), blas_threads=blas_threads)
    return Engines(vad=vad, stt=stt, llm=llm, tts=tts, turn_end=turn_end, denoiser=denoiser)


def _denoiser(settings: EngineSettings) -> Denoiser | None:
    return load_denoiser(settings.denoise)


def prepare_models(settings: Settings) -> None:
    """Assemble, convert and fully verify every model the settings name, without keeping any loaded."""
    cache_dir = settings.resolved_cache_dir()
    event(log, "prepare_models", cache_dir=str(cache_dir))

    def step(kind: str, action: Callable[[], object]) -> None:
        started = time.perf_counter()
        where = action()
        event(
            log, "model_ready", engine=kind, path=str(where), seconds=round(time.perf_counter() - started, 2)
        )

    vad_path = packaged_silero_path() if settings.vad_model == "silero" else Path(settings.vad_model)
    if not vad_path.is_file():
        raise FileNotFoundError(f"silero VAD model not found: {vad_path}")
    step("vad", lambda: vad_path)
    step("stt", lambda: _prepare_stt(settings, cache_dir))
    if settings.llm_url:
        event(log, "model_ready", engine="llm", path=settings.llm_url, seconds=0.0)
    else:
        # `auto` chooses by the agent files the service is started with: both of its models are made
        # ready (an image is built before anyone knows which agents it will run).
        for model in dict.fromkeys((settings.local_llm(), settings.local_llm(tools=True))):
            _prepare_llm(settings, cache_dir, model, step)
    step("tts", lambda: voice_files(settings.tts_voice)[0])
    if turn_model_path(settings) is not None:
        step("turn_end", lambda: load_turn_end(settings).model_path)
    if settings.denoise != "off":
        step("denoise", lambda: _loads_a_stream(settings.denoise))


def _prepare_llm(
    settings: Settings, cache_dir: Path, model: str, step: Callable[[str, Callable[[], object]], None]
) -> None:
    chosen = replace(settings, llm_model=model)
    runtime = llm_runtime(chosen, resolve_device(settings.device))
    if runtime == "transformers":
        step("llm", lambda: llm_hf_source(cache_dir, model))
    elif runtime == "llamacpp":
        step("llm", lambda: llm_gguf(cache_dir, model, full=True)[0])
    else:
        step("llm", lambda: llm_ct2_dir(cache_dir, model, full=True))


def _loads_a_stream(name: str) -> str:
    """The denoiser, tried: its library loads and makes (and frees) a stream."""
    denoiser = load_denoiser(name)
    if denoiser is not None:
        denoiser.new_stream().close()
    return name


def _prepare_stt(settings: EngineSettings, cache_dir: Path) -> object:
    return whisper_source(settings.stt_model, cache_dir, full=True)
