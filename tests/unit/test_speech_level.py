"""A chunk's level, and which chunks are quiet against the speech heard before them."""

from __future__ import annotations

import numpy as np
import pytest

from parley.audio import SILENCE_DBFS, rms_dbfs
from parley.pipeline.speech_level import QUIET_BELOW_DB, SpeechLevel


def tone(dbfs: float) -> np.ndarray:
    """A 32 ms chunk of a 200 Hz tone whose RMS level is `dbfs`."""
    t = np.arange(512) / 16000
    return (np.sqrt(2) * 32768 * 10 ** (dbfs / 20) * np.sin(2 * np.pi * 200 * t)).astype(np.int16)


@pytest.mark.parametrize("dbfs", [-10.0, -30.0, -60.0])
def test_a_chunks_level_is_its_rms_in_dbfs(dbfs: float) -> None:
    assert rms_dbfs(tone(dbfs)) == pytest.approx(dbfs, abs=0.5)


def test_digital_silence_is_at_the_floor() -> None:
    assert rms_dbfs(np.zeros(512, dtype=np.int16)) == SILENCE_DBFS
    assert rms_dbfs(np.zeros(0, dtype=np.int16)) == SILENCE_DBFS


def test_quiet_is_relative_to_the_mean_of_the_speech_heard() -> None:
    level = SpeechLevel()
    assert not level.is_quiet(SILENCE_DBFS)  # nothing heard yet: nothing to be quiet against
    for dbfs in (-18.0, -22.0):
        level.heard_speech(dbfs)
    assert level.is_quiet(-20.0 - QUIET_BELOW_DB - 1)
    assert not level.is_quiet(-20.0 - QUIET_BELOW_DB + 1)
