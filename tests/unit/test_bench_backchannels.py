"""`parley bench backchannels` runs the service's turn-taker over the corpus: its checks are asked where
the call would ask them, on the real VAD's chunks."""

from __future__ import annotations

import numpy as np
import pytest

from parley.audio import PIPELINE_RATE
from parley.bench.backchannels import (
    CHUNK,
    TalkingAgent,
    heard_over_the_agent,
    judge_sound,
    over_the_phone,
    summarise,
    voices_of,
)
from parley.bench.corpus import ENGLISH_VOICES, PIPER_VOICE, Sound
from parley.bench.speech import espeak, join, silence_ms
from parley.config import Settings
from parley.engines.stt import SttEngine
from parley.engines.vad import load_vad
from parley.pipeline.backchannels import BackchannelJudge


def padded(pcm: np.ndarray) -> np.ndarray:
    return join(silence_ms(1000), pcm, silence_ms(1000))


def talking(whisper: SttEngine, settings: Settings) -> TalkingAgent:
    return TalkingAgent(whisper, BackchannelJudge.for_settings(settings))


def test_a_word_is_checked_once_after_the_silence_the_settings_ask_for(whisper: SttEngine) -> None:
    vad = load_vad(Settings())
    for ask_ms in (32, 64, 96):
        settings = Settings(backchannel_ask_ms=ask_ms)
        agent = talking(whisper, settings)
        heard_over_the_agent(padded(espeak("stop")), vad, agent, settings)
        (check,) = agent.checks
        clip, speech_ms = check
        assert settings.min_speech_ms <= speech_ms < settings.backchannel_max_ms
        # the preroll, the speech, and `ask_ms` of silence (rounded up to whole chunks) after it
        speech_and_silence_ms = 1000 * clip.size / PIPELINE_RATE - Settings().preroll_ms
        assert speech_and_silence_ms >= speech_ms + ask_ms - 1000 * CHUNK / PIPELINE_RATE
        assert agent.decisions == ["cut"]  # "stop" is words


def test_speech_after_a_pause_is_checked_again_wideband_and_over_g711(whisper: SttEngine) -> None:
    vad = load_vad(Settings())
    settings = Settings()
    uh_wait = padded(join(espeak("uh"), silence_ms(400), espeak("wait")))
    for audio in (uh_wait, over_the_phone(uh_wait)):
        agent = talking(whisper, settings)
        heard_over_the_agent(audio, vad, agent, settings)
        assert len(agent.checks) == 2
        assert agent.decisions[-1] == "cut"
    # silence is never checked
    agent = talking(whisper, settings)
    heard_over_the_agent(padded(np.zeros(PIPELINE_RATE // 2, dtype=np.int16)), vad, agent, settings)
    assert agent.checks == [] and agent.decisions == []


def test_a_stop_whisper_writes_as_a_filler_over_g711_still_stops_the_agent(whisper: SttEngine) -> None:
    # espeak-ng's "stop" over G.711, at this phase, is written "Uh..." with 2.7 % odds on "Stop" (the miss
    # `bench backchannels` counted); its "uh" gives "Stop" under 0.1 %.
    vad = load_vad(Settings())
    settings = Settings()
    outcomes = {}
    for word in ("stop", "uh"):
        agent = talking(whisper, settings)
        heard_over_the_agent(padded(over_the_phone(espeak(word))), vad, agent, settings)
        assert agent.checks, word  # the check ran: this is not a blip the VAD never heard
        outcomes[word] = (agent.decisions, agent.heard, agent.command_odds)
    stop, uh = outcomes["stop"], outcomes["uh"]
    assert "cut" in stop[0], stop
    assert "cut" not in uh[0] and max(uh[2]) < settings.backchannel_command_odds, uh
    # without the odds, the same "stop" goes unheard: the path under test is the one that stopped it
    agent = talking(whisper, Settings(backchannel_command_odds=0))
    heard_over_the_agent(padded(over_the_phone(espeak("stop"))), vad, agent, settings)
    assert "cut" not in agent.decisions, (agent.heard, agent.command_odds)


def test_a_hmm_over_g711_lets_the_agent_go_on_at_every_phase(whisper: SttEngine) -> None:
    # espeak-ng's "hmm" over G.711 was written "em." at one phase and cut the agent, until "em" was a filler
    vad = load_vad(Settings())
    settings = Settings()
    judge = BackchannelJudge.for_settings(settings)
    hmm = Sound("filler", "hmm")
    pcm = over_the_phone(hmm.clip())
    for step in range(8):
        row = judge_sound(hmm, pcm, step * CHUNK // 8, vad, whisper, judge, settings)
        assert row["outcome"] == "backchannel", row  # checked (not a blip), and the agent went on


def test_the_summary_names_each_miss_with_its_trials_and_voices() -> None:
    def row(said: str, kind: str, outcome: str, voice: str) -> dict[str, object]:
        return {"said": said, "kind": kind, "outcome": outcome, "voice": voice, "line": "g711"}

    rows = [
        row("right", "backchannel", "words", "en-us"),
        row("right", "backchannel", "words", "en-gb"),
        row("right", "backchannel", "backchannel", "en-us"),
        row("stop", "interruption", "backchannel", "en-us"),
        row("stop", "interruption", "words", "en-gb"),
        row("noise burst", "noise", "blip", ""),
    ]
    summary = summarise(rows, Settings(), 1.0)
    assert summary["g711: sounds taken for words"] == "2/3 (right x2 [en-gb, en-us])"
    assert summary["g711: interruptions taken for a backchannel"] == "1/2 (stop x1)"
    assert summary["g711: blips (never checked, excluded)"] == 1


def test_voices_are_named_or_all() -> None:
    assert voices_of("en-us, en-gb") == ["en-us", "en-gb"]
    assert voices_of("all")[-1] == PIPER_VOICE and len(voices_of("all")) == len(ENGLISH_VOICES) + 1
    with pytest.raises(ValueError):
        voices_of(" , ")


def test_words_are_said_in_the_voice_asked_and_a_cough_in_none() -> None:
    right = Sound("backchannel", "right")
    assert right.spoken and not Sound("cough", "voiced cough").spoken
    us, scots = right.clip(voice="en-us"), right.clip(voice="en-gb-scotland")
    assert us.size > 0 and scots.size > 0 and not np.array_equal(us, scots)
    cough = Sound("cough", "voiced cough")
    assert np.array_equal(cough.clip(seed=3, voice="en-us"), cough.clip(seed=3, voice="en-gb"))
