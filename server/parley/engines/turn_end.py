"""Has the caller finished? Smart Turn v3 hears it in the voice: a model of the turn's last 8 seconds.

Silence alone cannot tell a caller who finished a question from one who is looking for the next word,
so a turn ends after `end_of_turn_ms` of silence and its reply is held `reopen_grace_ms` more: 0.55 s
before the reply may play, whatever the machine. Smart Turn (pipecat's, BSD-2-Clause, shipped inside
the `pipecat-ai` wheel) reads the intonation and the words' shape: asked at the turn's first pause, a
verdict of "complete" lets the turn end after `turn_complete_ms` with no grace
(pipeline/turntaking.py). It is worth that where the reply is ready before the grace is over (a GPU).

Input: Whisper's log-mel features (80 x 800) of the last 8 s of 16 kHz audio, zero-padded at the front,
the waveform first scaled to zero mean and unit variance; output: the probability the turn is complete.
~35 ms on one core here; a batch of several pauses is one run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parley.audio import PIPELINE_RATE, to_float32
from parley.engines.cache import CacheError, package_dir, sha256_file
from parley.engines.compute_load import COMPUTE
from parley.engines.device import resolve_device

log = logging.getLogger(__name__)

WINDOW_S = 8
N_FFT = 400
HOP = 160
N_MELS = 80
SMART_TURN_FILE = "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"  # inside the pipecat package
SMART_TURN_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"


def _mel_filters() -> np.ndarray:
    from faster_whisper.feature_extractor import FeatureExtractor

    return np.asarray(FeatureExtractor.get_mel_filters(PIPELINE_RATE, N_FFT, N_MELS), dtype=np.float64)


class LogMel:
    """Whisper's log-mel features of a fixed window, as the model was trained on (Hugging Face's
    WhisperFeatureExtractor with `chunk_length=8` and `do_normalize=True`)."""

    def __init__(self, window_s: int = WINDOW_S) -> None:
        self.samples = window_s * PIPELINE_RATE
        self._window = np.hanning(N_FFT + 1)[:-1]  # periodic Hann
        self._filters = _mel_filters()  # (mels, bins), Slaney-normalised

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        x = to_float32(audio) if audio.dtype != np.float32 else audio
        x = x[-self.samples :]
        x = np.pad(x, (self.samples - x.size, 0))
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
        padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
        power = np.abs(np.fft.rfft(frames * self._window, axis=-1)) ** 2  # (frames, bins)
        mel = np.log10(np.maximum(self._filters @ power.T, 1e-10))[:, :-1]
        mel = np.maximum(mel, mel.max() - 8.0)
        features: np.ndarray = ((mel + 4.0) / 4.0).astype(np.float32)
        return features


def packaged_smart_turn_path() -> Path:
    try:
        return package_dir("pipecat") / SMART_TURN_FILE
    except CacheError as exc:
        raise CacheError(
            "Smart Turn ships in the pipecat-ai wheel: pip install --no-deps pipecat-ai==1.14.0"
        ) from exc


class SmartTurn:
    """The end-of-turn model: `complete(audios)` gives each turn's probability of being over."""

    def __init__(self, model_path: str | Path | None = None, *, check: bool = False) -> None:
        import onnxruntime

        path = Path(model_path) if model_path is not None else packaged_smart_turn_path()
        if not path.is_file():
            raise FileNotFoundError(f"Smart Turn model not found: {path}")
        if check and (digest := sha256_file(path)) != SMART_TURN_SHA256:
            raise CacheError(f"{path} has SHA-256 {digest}, not the pinned {SMART_TURN_SHA256}")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # asked per pause by many calls: one core each
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.model_path = path
        self.device = "cpu"
        self._session: Any = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        inputs = {i.name: i.shape for i in self._session.get_inputs()}
        if list(inputs) != ["input_features"] or inputs["input_features"][1:] != [N_MELS, 100 * WINDOW_S]:
            raise ValueError(f"{path} is not a Smart Turn v3 model (inputs {inputs})")
        self._features = LogMel()

    def complete(self, audios: list[np.ndarray]) -> list[float]:
        """For each turn's audio (16 kHz), the probability that the caller has finished."""
        if not audios:
            return []
        with COMPUTE.running(self.device):
            features = np.stack([self._features(audio) for audio in audios])
            (out,) = self._session.run(None, {"input_features": features})
        return [float(p) for p in np.asarray(out).reshape(-1)]


class TurnModelSettings(Protocol):
    """What choosing the end-of-turn model reads: `--turn-model` (TurnSettings) and `--device`
    (EngineSettings)."""

    @property
    def turn_model(self) -> str: ...
    @property
    def device(self) -> str: ...


def load_turn_end(settings: TurnModelSettings) -> SmartTurn:
    """The end-of-turn model the settings ask for (`turn_model_path` says whether they ask for one)."""
    path = turn_model_path(settings)
    if path is None:
        raise ValueError("no end-of-turn model is configured (--turn-model none)")
    # The packaged file is checked against its pinned digest; a file of the user's own is taken as it is.
    return SmartTurn(path, check=settings.turn_model in ("auto", "smart-turn"))


def turn_model_path(settings: TurnModelSettings) -> Path | None:
    """The end-of-turn model's file, or None: `auto` takes Smart Turn where replies are fast enough to
    gain from it (a GPU), `none` never does."""
    choice = settings.turn_model
    if choice == "none" or (choice == "auto" and resolve_device(settings.device) != "cuda"):
        return None
    if choice in ("auto", "smart-turn"):
        return packaged_smart_turn_path()
    return Path(choice).expanduser()
