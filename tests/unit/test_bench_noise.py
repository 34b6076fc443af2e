"""`parley bench noise`: its noises are mixed at the SNR asked, its word error count is an edit distance
over words, and a question over noise goes through the turn-taker to a transcript."""

from __future__ import annotations

import numpy as np
import pytest

from parley.audio import PIPELINE_RATE, rms_dbfs
from parley.bench.noise import Cleaner, ask, word_errors
from parley.bench.noises import SPEECH_DBFS, alone, mixed, music, street
from parley.bench.speech import espeak, trim
from parley.config import Settings
from parley.engines.stt import SttEngine
from parley.engines.vad import load_vad


def test_word_errors_count_substitutions_insertions_and_deletions() -> None:
    said = "what is the capital city of japan"
    assert word_errors("What is the capital city of Japan?", said) == 0
    assert word_errors("What is the capital of Japan", said) == 1  # a word lost
    assert word_errors("so what is the capitol city of japan", said) == 2  # one added, one wrong
    assert word_errors("", said) == 7


@pytest.mark.parametrize("make", [street, music])
def test_a_noise_is_mixed_under_a_question_at_the_snr_asked(make) -> None:  # type: ignore[no-untyped-def]
    noise = make(4.0)
    assert noise.size == 4 * PIPELINE_RATE and rms_dbfs(noise.astype(np.int16)) > -60.0
    question = trim(espeak("how many legs does a spider have"))
    lead = tail = PIPELINE_RATE // 2
    noisy = mixed(question, noise, 10.0, 0, lead, tail)
    quiet = mixed(question, None, 0.0, 0, lead, tail)
    spoken = slice(lead, lead + question.size)
    assert abs(rms_dbfs(quiet[spoken]) - SPEECH_DBFS) < 0.5
    under = (noisy.astype(np.float64) - quiet)[spoken].astype(np.int16)
    assert abs(rms_dbfs(under) - (SPEECH_DBFS - 10.0)) < 1.5
    assert abs(rms_dbfs(alone(noise, PIPELINE_RATE, 10.0, 0)) - (SPEECH_DBFS - 10.0)) < 0.5


def test_a_question_over_street_noise_is_heard_through_the_turn_taker(whisper: SttEngine) -> None:
    settings = Settings()
    question = "what is the capital city of japan"
    said = trim(espeak(question))
    noisy = mixed(said, street(6.0), 15.0, 0, PIPELINE_RATE, 2 * PIPELINE_RATE)
    cleaner = Cleaner("rnnoise")
    row = ask(question, cleaner.clean(noisy), load_vad(settings), whisper, settings)
    assert row["turns"] == 1 and row["ended"] and not row["noise_turn"]
    assert row["word_errors"] <= 2, row["heard"]
    cleaner.measure(noisy[:PIPELINE_RATE], rounds=1)
    assert 0.0 < cleaner.cpu["ms_per_20ms_frame"] < 20.0
