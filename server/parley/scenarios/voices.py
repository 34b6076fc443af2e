"""What a scripted caller sounds like: a turn's text spoken by its voice, or its recorded WAV, as the
16 kHz mono int16 clip the caller's mouth plays.

Text may hold pauses mid-sentence, "[pause 900ms]" or "[pause 1.2s]": each stretch between them is
spoken on its own, its silence cut, and the stretches joined by exactly that much silence, so that a
scenario says how long the caller hesitates and not how long the synthesiser happens to breathe.
Piper speaks with its prosody noise off (speech.piper's `steady`), so a turn sounds the same every run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import soundfile
import soxr

from parley.audio import PIPELINE_RATE
from parley.bench.speech import espeak, piper, silence_ms, trim
from parley.scenarios.scenario import ScenarioError, Turn, Voice, spoken_parts

# Any bracketed stretch is a marker: "[laughs]" read aloud as text would be a scenario's bug, not speech.

# Synthesis takes a good part of a second per phrase (Piper) and a suite repeats its callers' phrases.
_spoken: dict[tuple[str, str, str], np.ndarray] = {}
_recorded: dict[tuple[str, int, int], np.ndarray] = {}


def render(turn: Turn, default: Voice) -> np.ndarray:
    """The caller's audio for `turn`: its `say` text spoken by its voice (else `default`), or its `wav`;
    16 kHz mono int16, read-only (it is shared with later renders of the same text)."""
    if turn.say:
        return _said(turn.say, turn.voice or default)
    if turn.wav:
        return _wav(Path(turn.wav))
    raise ScenarioError("this turn has nothing to say: only `say` and `wav` turns are spoken")


def spoken_text(turn: Turn) -> str:
    """What the caller says in `turn`, pauses left out: for the report, and to compare with what the agent
    transcribed ("" for a recording or a turn that says nothing)."""
    words = [part for part in _parts(turn.say) if isinstance(part, str)]
    return " ".join(" ".join(words).split())


def _said(text: str, voice: Voice) -> np.ndarray:
    parts = _parts(text)
    if not any(isinstance(part, str) and part.strip() for part in parts):
        raise ScenarioError(f"say {text!r} has no words to speak")
    pieces = [
        silence_ms(part) if not isinstance(part, str) else _speak(part.strip(), voice)
        for part in parts
        if not isinstance(part, str) or part.strip()
    ]
    return _frozen(np.concatenate(pieces))


def _parts(text: str) -> list[str | float]:
    try:
        return spoken_parts(text)
    except ScenarioError as exc:
        raise ScenarioError(f"say {text!r}: {exc}") from None


def _speak(text: str, voice: Voice) -> np.ndarray:
    key = (voice.engine, voice.name, text)
    cached = _spoken.get(key)
    if cached is not None:
        return cached
    try:
        if voice.engine == "piper":
            audio = piper(text, voice=voice.name, steady=True)
        else:
            audio = espeak(text, voice=voice.name)
    except FileNotFoundError as exc:  # a Piper voice path that is not there
        raise ScenarioError(f"voice {voice.name!r}: {exc}") from None
    except subprocess.CalledProcessError as exc:  # espeak-ng refuses a voice it does not have
        why = (exc.stderr or b"").decode(errors="replace").strip() or f"exit status {exc.returncode}"
        raise ScenarioError(f"espeak voice {voice.name!r}: {why}") from None
    spoken = _frozen(trim(audio))
    if spoken.size == 0:
        raise ScenarioError(f"{voice.engine} voice {voice.name!r} made no sound of {text!r}")
    _spoken[key] = spoken
    return spoken


def _wav(path: Path) -> np.ndarray:
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        cached = _recorded.get(key)
        if cached is not None:
            return cached
        data, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    except (OSError, RuntimeError) as exc:  # soundfile's errors are RuntimeErrors
        raise ScenarioError(f"wav {str(path)!r} cannot be read: {exc}") from None
    if data.size == 0:
        raise ScenarioError(f"wav {str(path)!r} holds no audio")
    mono = data.mean(axis=1) * 32767
    if int(rate) != PIPELINE_RATE:
        # In floats: soxr dithers what it rounds to int16, and a recording must sound the same every run.
        mono = soxr.resample(mono, int(rate), PIPELINE_RATE, quality="HQ")
    clip = _frozen(np.clip(np.round(mono), -32768, 32767))
    _recorded[key] = clip
    return clip


def _frozen(pcm: np.ndarray) -> np.ndarray:
    """A copy nobody can write to: the caches hand the same array to every caller."""
    out = np.array(pcm, dtype=np.int16)
    out.flags.writeable = False
    return out
