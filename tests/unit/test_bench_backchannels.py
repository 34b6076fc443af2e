"""`parley bench backchannels` asks the check where the turn-taker would, on the real VAD's chunks."""

from __future__ import annotations

import numpy as np

from parley.audio import PIPELINE_RATE
from parley.bench.backchannels import CHUNK, over_the_phone, stretches_heard
from parley.bench.speech import espeak, join, silence_ms
from parley.config import Settings
from parley.engines.vad import load_vad


def padded(pcm: np.ndarray) -> np.ndarray:
    return join(silence_ms(1000), pcm, silence_ms(1000))


def test_a_word_is_checked_once_after_the_silence_the_settings_ask_for() -> None:
    vad = load_vad(Settings())
    for ask_ms in (32, 64, 96):
        settings = Settings(backchannel_ask_ms=ask_ms)
        (stretch,) = stretches_heard(padded(espeak("stop")), vad, settings)
        assert settings.min_speech_ms <= stretch.speech_ms < settings.backchannel_max_ms
        (check,) = stretch.checks
        clip, speech_ms = check
        assert speech_ms == stretch.speech_ms
        # the preroll, the speech, and `ask_ms` of silence (rounded up to whole chunks) after it
        speech_and_silence_ms = 1000 * clip.size / PIPELINE_RATE - Settings().preroll_ms
        assert speech_and_silence_ms >= speech_ms + ask_ms - 1000 * CHUNK / PIPELINE_RATE


def test_speech_after_a_blips_silence_is_a_stretch_of_its_own_wideband_and_over_g711() -> None:
    vad = load_vad(Settings())
    settings = Settings()
    uh_wait = padded(join(espeak("uh"), silence_ms(400), espeak("wait")))
    for audio in (uh_wait, over_the_phone(uh_wait)):
        stretches = stretches_heard(audio, vad, settings)
        assert len(stretches) == 2
        assert all(s.checks for s in stretches)
    # silence is no stretch at all
    assert stretches_heard(padded(np.zeros(PIPELINE_RATE // 2, dtype=np.int16)), vad, settings) == []
