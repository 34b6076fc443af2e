"""What a scripted caller says: a turn's text in its voice, paused where the scenario says and for exactly
as long, or its recording at the pipeline's rate; and a clear error for a bad marker or an unreadable WAV."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from parley.audio import PIPELINE_RATE
from parley.bench.speech import espeak, trim
from parley.scenarios.scenario import ScenarioError, Turn, Voice
from parley.scenarios.voices import render, spoken_text

ESPEAK = Voice("espeak", "en-us")


@pytest.mark.parametrize(("marker", "samples"), [("[pause 900ms]", 14400), ("[pause 1.2s]", 19200)])
def test_a_pause_is_exactly_that_much_silence_between_the_parts_spoken(marker: str, samples: int) -> None:
    audio = render(Turn(say=f"my number is {marker} five five five"), ESPEAK)
    before, after = trim(espeak("my number is")), trim(espeak("five five five"))
    assert audio.size == before.size + samples + after.size
    assert np.array_equal(audio[: before.size], before)
    assert not audio[before.size : before.size + samples].any()
    assert np.array_equal(audio[before.size + samples :], after)


def test_text_is_spoken_by_the_turns_voice_else_the_callers() -> None:
    default = render(Turn(say="good morning"), ESPEAK)
    assert np.array_equal(default, trim(espeak("good morning")))
    own = render(Turn(say="good morning", voice=Voice("espeak", "en-gb")), ESPEAK)
    assert np.array_equal(own, trim(espeak("good morning", voice="en-gb")))
    assert not np.array_equal(own, default)


def test_the_words_without_the_pauses() -> None:
    turn = Turn(say="my number is [pause 900ms] five five [pause 1.2s]  five")
    assert spoken_text(turn) == "my number is five five five"
    assert spoken_text(Turn(wav="hello.wav")) == ""


@pytest.mark.parametrize(
    "text", ["wait [pause] there", "wait [pause 900] there", "wait [laughs] there", "wait [pause 900ms there"]
)
def test_a_malformed_marker_is_a_scenario_error(text: str) -> None:
    with pytest.raises(ScenarioError, match="pause"):
        render(Turn(say=text), ESPEAK)
    with pytest.raises(ScenarioError):
        spoken_text(Turn(say=text))


def test_a_voice_espeak_does_not_have_is_a_scenario_error() -> None:
    with pytest.raises(ScenarioError, match="nosuchvoice"):
        render(Turn(say="hello"), Voice("espeak", "nosuchvoice"))


def test_a_recording_is_mixed_to_mono_at_the_pipelines_rate(tmp_path: Path) -> None:
    left = np.sin(2 * np.pi * 200 * np.arange(8000) / 8000) * 0.5
    stereo = tmp_path / "stereo.wav"
    soundfile.write(str(stereo), np.stack([left, -left], axis=1), 8000)  # the two channels cancel out
    assert render(Turn(wav=str(stereo)), ESPEAK).size == PIPELINE_RATE
    assert np.abs(render(Turn(wav=str(stereo)), ESPEAK)).max() <= 1  # 16-bit samples: not quite
    mono = tmp_path / "mono.wav"
    soundfile.write(str(mono), left, 8000)
    audio = render(Turn(wav=str(mono)), ESPEAK)
    assert audio.size == PIPELINE_RATE and 15000 < np.abs(audio).max() < 17500
    assert np.array_equal(audio, render(Turn(wav=str(mono)), ESPEAK))  # the same every time


@pytest.mark.parametrize("content", [None, b"RIFF, but not a WAV", b""])
def test_an_unreadable_recording_is_a_scenario_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "greeting.wav"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ScenarioError, match="greeting"):
        render(Turn(wav=str(path)), ESPEAK)


def test_a_turn_without_words_or_a_recording_is_not_rendered() -> None:
    with pytest.raises(ScenarioError):
        render(Turn(press="12#"), ESPEAK)
    with pytest.raises(ScenarioError):
        render(Turn(say="[pause 1s]"), ESPEAK)
