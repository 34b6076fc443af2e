"""An agent's hold sound: a short WAV clip looped while a tool runs long (the agent file's `hold_sound`).

Loaded and checked once, when the agent file is read: a file that cannot be played is an agent-file error
naming it, not a silent line on the first call that needs it. A call plays it at its Outbound's rate
(`at`), resampled once per rate and kept.
"""

from __future__ import annotations

import threading
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from parley.audio import resample

MIN_RATE = 8000
MAX_RATE = 48000
MIN_SECONDS = 0.1  # shorter than a few frames, a loop is a buzz
MAX_SECONDS = 30.0  # a hold sound loops: a longer file is a recording, and costs memory in every rate


class HoldSoundError(ValueError):
    """The file cannot be a hold sound; the message says why (the agent file adds its name and line)."""


@dataclass(frozen=True, eq=False)
class HoldSound:
    """Mono int16 samples at `rate`, from `path`."""

    path: str
    pcm: np.ndarray = field(repr=False)
    rate: int
    _by_rate: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def seconds(self) -> float:
        return self.pcm.size / self.rate

    def at(self, rate: int) -> np.ndarray:
        """The clip at `rate` (int16, mono), resampled the first time a call asks for that rate."""
        with self._lock:
            clip = self._by_rate.get(rate)
            if clip is None:
                clip = self._by_rate[rate] = resample(self.pcm, self.rate, rate)
            return clip


def load_hold_sound(path: Path) -> HoldSound:
    """Read a WAV file of linear PCM (8 to 32 bits, any number of channels, mixed to mono)."""
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            data = wav.readframes(wav.getnframes())
    except FileNotFoundError:
        raise HoldSoundError("no such file") from None
    except (OSError, EOFError, wave.Error) as exc:
        raise HoldSoundError(f"not a WAV file of linear PCM ({exc})") from None
    if not MIN_RATE <= rate <= MAX_RATE:
        raise HoldSoundError(f"its sample rate is {rate} Hz; a hold sound takes {MIN_RATE}-{MAX_RATE} Hz")
    if width not in (1, 2, 3, 4) or channels < 1:
        raise HoldSoundError(f"{8 * width}-bit samples are not linear PCM of 8 to 32 bits")
    pcm = _mono_int16(data, width, channels)
    seconds = pcm.size / rate
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise HoldSoundError(
            f"it lasts {seconds:.2f} s; a hold sound lasts {MIN_SECONDS}-{MAX_SECONDS:.0f} s"
        )
    if not pcm.any():
        raise HoldSoundError("it is silent")
    return HoldSound(str(path), pcm, rate)


def _mono_int16(data: bytes, width: int, channels: int) -> np.ndarray:
    usable = len(data) // (width * channels) * width * channels
    raw = np.frombuffer(data[:usable], dtype=np.uint8)
    if width == 1:  # 8-bit WAV is unsigned
        samples = (raw.astype(np.int32) - 128) << 8
    else:
        # Little-endian samples of `width` bytes: keep the top two bytes, the sign in the last.
        grouped = raw.reshape(-1, width)
        samples = grouped[:, -2].astype(np.int32) | (grouped[:, -1].astype(np.int8).astype(np.int32) << 8)
    mono = samples.reshape(-1, channels).mean(axis=1)
    pcm: np.ndarray = np.clip(np.round(mono), -32768, 32767).astype(np.int16)
    return pcm
