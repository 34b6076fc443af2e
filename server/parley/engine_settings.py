"""The engine settings: the models behind the stages (VAD, STT, LLM or an endpoint, TTS), where they run
and are cached. A group of `Settings` (config.py), which inherits it; engines/ reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from parley.settings_option import opt as _opt

DENOISERS = ("rnnoise", "deepfilternet", "off")  # engines/denoise.py
# `--llm-model auto`: the packaged model that starts replies soonest, unless an agent offers tools. The
# small one answers them badly (no call, or an order's status made up: `parley bench tools`, `parley test
# examples/scenarios/`), so an agent with tools gets the larger one, whose replies start later.
AUTO_LLM = "auto"
WORDS_LLM = "qwen2.5-0.5b"
TOOLS_LLM = "qwen2.5-coder-1.5b"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "parley"


@dataclass(frozen=True)
class EngineSettings:
    """The models behind the stages, and where they run."""

    device: str = field(default="auto", metadata=_opt("where models run", "engines", ("auto", "cpu", "cuda")))
    cache_dir: str = field(
        default="", metadata=_opt("model cache folder (default ~/.cache/parley)", "engines")
    )
    vad_model: str = field(
        default="silero", metadata=_opt("'silero' or a path to a silero ONNX file", "engines")
    )
    stt_model: str = field(
        default="base",
        metadata=_opt(
            "'base' or 'tiny.en' (packaged), a faster-whisper size/hub name, or a CTranslate2 folder",
            "engines",
        ),
    )
    stt_language: str = field(default="en", metadata=_opt("spoken language ('' detects)", "engines"))
    # Two workers of one core each on 2 cores: Whisper's decoding waits on its threads more than it
    # computes, so a transcription on one thread took less than on two (0.18 against 0.20 s), and a
    # second caller's turn is not held up behind the first's batch.
    stt_workers: int = field(
        default=2, metadata=_opt("parallel STT batches (the cores are shared among them)", "engines")
    )
    stt_max_batch: int = field(default=8, metadata=_opt("utterances transcribed together at most", "engines"))
    llm_model: str = field(
        default=AUTO_LLM,
        metadata=_opt(
            "'auto' (qwen2.5-0.5b; qwen2.5-coder-1.5b when an agent offers tools), 'qwen2.5-0.5b', "
            "'qwen2.5-coder-1.5b' or 'smollm2-135m' (packaged), a causal-LM hub name, or a local folder",
            "engines",
        ),
    )
    llm_runtime: str = field(
        default="auto",
        metadata=_opt(
            "how a local LLM runs (auto: llama.cpp on a CPU for a packaged model or .gguf, else CTranslate2)",
            "engines",
            ("auto", "ctranslate2", "llamacpp", "transformers"),
        ),
    )
    llm_url: str = field(
        default="", metadata=_opt("OpenAI-compatible endpoint (…/v1) instead of a local LLM", "engines")
    )
    llm_api_key: str = field(default="", metadata=_opt("API key for --llm-url", "engines"))
    llm_endpoint_model: str = field(default="", metadata=_opt("model name sent to --llm-url", "engines"))
    llm_workers: int = field(
        default=1,
        metadata=_opt(
            "LLM replicas, sharing the cores (1: every core for one batch, which later replies join)",
            "engines",
        ),
    )
    llm_threads: int = field(
        default=0,
        metadata=_opt(
            "threads of the llama.cpp LLM (0: every core, one while Whisper or Piper computes)",
            "engines",
        ),
    )
    llm_max_batch: int = field(
        default=8,
        metadata=_opt(
            "replies of different calls decoded together (1: one at a time); llama.cpp keeps as many "
            "conversations (~50 MB of KV cache each for Qwen2.5-0.5B)",
            "engines",
        ),
    )
    llm_max_tokens: int = field(default=80, metadata=_opt("longest reply, in tokens", "engines"))
    llm_temperature: float = field(default=0.0, metadata=_opt("0 = greedy", "engines"))
    tts_voice: str = field(
        default="joe",
        metadata=_opt("'joe' (packaged Piper voice) or a path to a Piper .onnx voice", "engines"),
    )
    # Noise suppression of the caller's audio before the VAD and Whisper (engines/denoise.py).
    denoise: str = field(
        default="off",
        metadata=_opt(
            "clean the caller's audio before the VAD and Whisper hear it (README: Noisy lines)",
            "engines",
            DENOISERS,
        ),
    )

    def local_llm(self, *, tools: bool = False) -> str:
        """The model `llm_model` names, `auto` chosen for replies that are offered tools or not."""
        if self.llm_model != AUTO_LLM:
            return self.llm_model
        return TOOLS_LLM if tools else WORDS_LLM

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()
