"""Synthetic test speech for the engine tests (espeak-ng + sox), and a check that the helper works."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

RATE = 16000

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("sox") is None, reason="espeak-ng and sox are needed"
)


def speech(text: str, folder: Path) -> np.ndarray:
    """`text` spoken by espeak-ng, as 16 kHz mono int16."""
    stem = "".join(ch if ch.isalnum() else "_" for ch in text)[:60]
    raw, out = folder / f"{stem}.raw.wav", folder / f"{stem}.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out)], check=True)
    audio, rate = sf.read(out, dtype="int16")
    assert rate == RATE
    return np.asarray(audio)


def normalise(text: str) -> str:
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())


@needs_espeak
def test_speech_is_16k_mono_int16_of_plausible_length(tmp_path: Path) -> None:
    audio = speech("what is the weather like in paris today", tmp_path)

    assert audio.dtype == np.int16 and audio.ndim == 1
    assert 1.5 < audio.size / RATE < 5.0
    assert np.abs(audio).max() > 3000
