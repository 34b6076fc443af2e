"""The noises `parley bench noise` mixes into the caller's questions, made here, and how they are mixed.

All three are made fresh on each run, at 16 kHz, repeatably (sox's `-R`, fixed texts and voices):

- street: traffic as sox makes it: brown noise low-passed at 500 Hz whose level swells and fades like
  passing cars (`tremolo 0.13 80`: a 7.7 s cycle, 80 % deep), mixed with pink noise high-passed at
  300 Hz (tyres and wind) on a faster, shallower swell (`tremolo 0.21 50`);
- babble: a crowd: five espeak-ng voices (en-gb, en-us+f3, en-029, en-gb-scotland, en-us-nyc) and the
  packaged Piper voice, each reading other sentences than the questions, at the same level, all at once;
- music: a song's backing: sox's plucked-string synthesis (`synth pluck`, at 48 kHz, resampled) of
  the chords C, Am, F, G struck twice a second each, over their root an octave down.

A question's level is that of its speech (its RMS once the silence around it is cut), set to
SPEECH_DBFS; the noise is scaled so that the speech is `snr_db` above it, over the whole trial.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile

from parley.audio import PIPELINE_RATE, rms_dbfs
from parley.bench.speech import SpeechToolMissing, espeak, piper, trim

NOISES = ("street", "babble", "music")
SPEECH_DBFS = -24.0  # a question's speech level on the line (a phone call's usual level)
NOISE_S = 12.0  # each noise's length: trials take stretches of it at different offsets

BABBLE_VOICES = ("en-gb", "en-us+f3", "en-029", "en-gb-scotland", "en-us-nyc")
BABBLE_TEXTS = (
    "the train was late again this morning so i walked the last part of the way to work",
    "she said the market opens early on saturdays and the bread is gone by nine",
    "we spent the whole afternoon looking for a place to park near the old harbour",
    "if you ask me the best time to visit is in the spring before the crowds arrive",
    "they painted the kitchen a bright yellow and now nobody wants to leave it",
    "my brother keeps telling the same story about the dog that stole his sandwich",
)
CHORDS = (
    ("C3", "E3", "G3", "C4"),
    ("A2", "E3", "A3", "C4"),
    ("F2", "F3", "A3", "C4"),
    ("G2", "D3", "G3", "B3"),
)


def _sox(*args: str) -> np.ndarray:
    """Run sox with a null input (its options in `args`) and read back what it made, 16 kHz mono int16."""
    binary = shutil.which("sox")
    if binary is None:
        raise SpeechToolMissing("sox is not installed (make install installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "noise.wav"
        command = [binary, "-R", *args]
        at = command.index("OUT")
        command[at] = str(out)
        subprocess.run(command, check=True, capture_output=True)
        data, rate = soundfile.read(str(out), dtype="int16")
    if int(rate) != PIPELINE_RATE:
        raise RuntimeError(f"sox gave {rate} Hz, not {PIPELINE_RATE}")
    return np.asarray(data, dtype=np.int16).reshape(-1)


def _at_level(pcm: np.ndarray, dbfs: float) -> np.ndarray:
    gain = 10 ** ((dbfs - rms_dbfs(pcm)) / 20)
    return np.asarray(pcm.astype(np.float64) * gain)


def street(seconds: float = NOISE_S) -> np.ndarray:
    length = f"{seconds}"
    head = ["-r", str(PIPELINE_RATE), "-c", "1", "-n", "-b", "16", "OUT", "synth", length]
    rumble = _sox(*head, "brownnoise", "lowpass", "500", "tremolo", "0.13", "80")
    hiss = _sox(*head, "pinknoise", "highpass", "300", "tremolo", "0.21", "50")
    return _sum([_at_level(rumble, -20.0), _at_level(hiss, -26.0)])


def music(seconds: float = NOISE_S) -> np.ndarray:
    bars = []
    for chord in CHORDS:
        # pluck synthesises at 44.1-48 kHz only: made at 48 kHz, each string a channel, mixed to one.
        notes = [tone for note in (_octave_down(chord[0]), *chord) for tone in ("pluck", note)]
        strum = _sox(
            "-r", "48000", "-c", str(len(chord) + 1), "-n", "-b", "16", "OUT",
            "synth", "0.5", *notes, "remix", "-", "fade", "0", "0.5", "0.05", "rate", str(PIPELINE_RATE),
        )  # fmt: skip
        bars += [strum, strum]
    song = np.concatenate(bars).astype(np.float64)
    return _looped(song, seconds)


def babble(seconds: float = NOISE_S) -> np.ndarray:
    voices: list[np.ndarray] = []
    for i, voice in enumerate(BABBLE_VOICES):
        texts = BABBLE_TEXTS[i:] + BABBLE_TEXTS[:i]
        voices.append(_at_level(np.concatenate([trim(espeak(t, voice=voice)) for t in texts[:3]]), -24.0))
    said = [trim(piper(t, steady=True)) for t in BABBLE_TEXTS[-3:]]
    voices.append(_at_level(np.concatenate(said), -24.0))
    # Each voice starts at another point of what it says, so that no two pause together.
    return _sum([np.roll(_looped(v, seconds), int(i * 1.7 * PIPELINE_RATE)) for i, v in enumerate(voices)])


def make(kind: str, seconds: float = NOISE_S) -> np.ndarray:
    """The noise `kind` (one of NOISES), as float samples at int16 scale, not yet at any level."""
    makers = {"street": street, "babble": babble, "music": music}
    if kind not in makers:
        raise ValueError(f"noise must be one of {', '.join(NOISES)}, not {kind!r}")
    return makers[kind](seconds)


def mixed(
    question: np.ndarray, noise: np.ndarray | None, snr_db: float, offset: int, lead: int, tail: int
) -> np.ndarray:
    """`question` (16 kHz int16, the silence around it cut) at SPEECH_DBFS, `lead` samples after the start
    and `tail` before the end, with the stretch of `noise` from `offset` under all of it, `snr_db` lower
    than the speech (None: silence around it); int16."""
    voice = _at_level(question, SPEECH_DBFS)
    padded = np.concatenate([np.zeros(lead), voice, np.zeros(tail)])
    if noise is None:
        return _int16(padded)
    return _int16(padded + noise_at(noise, padded.size, snr_db, offset))


def alone(noise: np.ndarray, samples: int, snr_db: float, offset: int) -> np.ndarray:
    """A stretch of `noise` alone, as loud as it is under a question at `snr_db`; int16."""
    return _int16(noise_at(noise, samples, snr_db, offset))


def noise_at(noise: np.ndarray, samples: int, snr_db: float, offset: int) -> np.ndarray:
    """`samples` of `noise` from `offset` (wrapping round), at SPEECH_DBFS - `snr_db`."""
    stretch = np.take(noise, np.arange(offset, offset + samples), mode="wrap")
    return _at_level(stretch, SPEECH_DBFS - snr_db)


def _int16(pcm: np.ndarray) -> np.ndarray:
    return np.asarray(np.clip(np.round(pcm), -32768, 32767)).astype(np.int16)


def _sum(parts: list[np.ndarray]) -> np.ndarray:
    length = min(p.size for p in parts)
    return np.asarray(np.sum([p[:length] for p in parts], axis=0))


def _looped(pcm: np.ndarray, seconds: float) -> np.ndarray:
    return np.resize(pcm.astype(np.float64), int(seconds * PIPELINE_RATE))


def _octave_down(note: str) -> str:
    return note[:-1] + str(int(note[-1]) - 1)


def write(path: str | Path, pcm: np.ndarray) -> None:
    """Keep a noise or a mixture as a WAV (to listen to what the benchmark played)."""
    soundfile.write(str(path), _int16(pcm), PIPELINE_RATE)
