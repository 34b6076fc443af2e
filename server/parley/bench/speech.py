"""Scripted caller speech: espeak-ng or Piper phrases and synthetic noises, as 16 kHz mono int16."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import soundfile

from parley.audio import PIPELINE_RATE, resample, trim_silence

if TYPE_CHECKING:
    from piper import PiperVoice

    from parley.engines.tts import PiperTts


class SpeechToolMissing(RuntimeError):
    pass


ESPEAK_VOICE = "en-us"  # the benchmarks' and tests' voice unless one is named


def espeak(text: str, *, voice: str = ESPEAK_VOICE, words_per_minute: int = 150) -> np.ndarray:
    """Speak `text` with espeak-ng (Debian package `espeak-ng`)."""
    binary = shutil.which("espeak-ng")
    if binary is None:
        raise SpeechToolMissing("espeak-ng is not installed (make install installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(
            [binary, "-v", voice, "-s", str(words_per_minute), "-w", str(wav), text],
            check=True,
            capture_output=True,
        )
        data, rate = soundfile.read(str(wav), dtype="int16")
    if data.ndim > 1:
        data = data[:, 0]
    return resample(np.asarray(data, dtype=np.int16), int(rate), PIPELINE_RATE)


def piper(text: str, *, voice: str = "joe", steady: bool = False) -> np.ndarray:
    """Speak `text` with a Piper voice (the packaged one by default): more of a person's intonation than
    espeak-ng's, which an end-of-turn model listens to. Piper draws its prosody at random: a phrase is
    not spoken the same way twice, unless `steady` (its noise at 0), when what Whisper hears of it is
    the same in every run."""
    if steady:
        return _steady_piper(text, voice)
    from parley.engines.tts import PiperTts

    tts = _piper_voices.get(voice) or _piper_voices.setdefault(voice, PiperTts(voice))
    audio = np.concatenate(list(tts.synthesize(text)))
    return resample(audio, tts.sample_rate, PIPELINE_RATE)


def _steady_piper(text: str, voice: str) -> np.ndarray:
    # Piper's own voice, not the agent's engine (which takes the voice's noise from its config).
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    from parley.engines.tts import voice_files

    plain = _steady_voices.get(voice)
    if plain is None:
        plain = _steady_voices[voice] = PiperVoice.load(*voice_files(voice))
    chunks = plain.synthesize(text, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0))
    audio = np.concatenate([np.asarray(c.audio_int16_array, dtype=np.int16).reshape(-1) for c in chunks])
    return resample(audio, int(plain.config.sample_rate), PIPELINE_RATE)


_piper_voices: dict[str, PiperTts] = {}
_steady_voices: dict[str, PiperVoice] = {}


def write_wav(path: str | Path, pcm: np.ndarray, rate: int = PIPELINE_RATE) -> None:
    soundfile.write(str(path), pcm, rate, subtype="PCM_16")


def silence_ms(ms: float) -> np.ndarray:
    return np.zeros(int(PIPELINE_RATE * ms / 1000), dtype=np.int16)


def cough(ms: float = 130.0, *, seed: int = 0, level: float = 0.5) -> np.ndarray:
    """A cough-like blip: a burst of low-passed noise with a fast attack and decay."""
    rng = np.random.default_rng(seed)
    n = int(PIPELINE_RATE * ms / 1000)
    noise = rng.standard_normal(n)
    kernel = np.ones(6) / 6.0  # a crude low-pass: coughs carry most energy below ~2 kHz
    shaped = np.convolve(noise, kernel, mode="same")
    t = np.linspace(0.0, 1.0, n)
    envelope = np.minimum(1.0, t * 12.0) * np.exp(-3.5 * t)
    burst = shaped * envelope
    burst *= level / max(1e-9, float(np.max(np.abs(burst))))
    return np.asarray(burst * 32767, dtype=np.int16)


def trim(pcm: np.ndarray) -> np.ndarray:
    """Cut the silence espeak-ng leaves before and after speech (a few hundred ms each side)."""
    return trim_silence(pcm, PIPELINE_RATE)


def join(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([p.astype(np.int16, copy=False) for p in parts])


def voiced_cough(ms: float = 300.0, *, seed: int = 0) -> np.ndarray:
    """A cough the VAD does hear: a noise burst on a short voiced "hah" that dies away.

    A noise burst alone never reaches silero's speech threshold (0.01-0.13 here); real coughs are partly
    voiced, and this one reads 0.9-1.0 for 150-250 ms, which is what a turn-taker has to cope with.
    """
    rng = np.random.default_rng(seed)
    voice = trim(espeak("hah"))[: int(PIPELINE_RATE * ms / 1000)].astype(np.float64)
    voice *= np.exp(-3.0 * np.arange(voice.size) / voice.size)
    burst = cough(rng.uniform(60, 100), seed=int(rng.integers(1 << 30))).astype(np.float64)
    mixed = np.zeros(max(voice.size, burst.size))
    mixed[: voice.size] += voice
    mixed[: burst.size] += burst
    return np.asarray(np.clip(mixed, -32767, 32767), dtype=np.int16)
