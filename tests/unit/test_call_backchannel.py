"""A caller who says "oh wow" over the agent lets it go on; one who says "no" stops it (test engines)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from parley.call import Call
from parley.config import Settings
from tests.doubles import ScriptedLlm, ScriptedStt, loud, make_engines, quiet
from tests.unit.test_call import RATE, Line

REPLY = "Once upon a time a little dragon lived by the sea. It loved the waves and the wind."


def call_with(short_speech: str) -> tuple[Call, Line, ScriptedStt]:
    """A call whose Whisper hears `short_speech` in anything under a second, and a question otherwise."""
    stt = ScriptedStt(lambda seconds: short_speech if seconds < 1.0 else "tell me a story")
    engines = make_engines(stt=stt, llm=ScriptedLlm(REPLY, token_s=0.01))
    engines.tts.seconds_per_word = 0.3  # type: ignore[attr-defined]
    call = Call("c-bc", "test", Settings(greeting="", end_of_turn_ms=300), engines, outbound_rate=RATE)
    line = Line(call)
    call.start()
    line.start()
    return call, line, stt


@pytest.fixture
def ended() -> Iterator[list[Call]]:
    calls: list[Call] = []
    yield calls
    for call in calls:
        call.end("test_over")
        assert call.join(5.0)


def ask_for_a_story(line: Line) -> None:
    line.say(np.concatenate([loud(1500), quiet(400)]))
    line.wait(line.playing, timeout=10)


def test_an_exclamation_over_the_agent_pauses_it_and_it_goes_on(ended: list[Call]) -> None:
    call, line, _ = call_with("Oh, wow!")
    ended.append(call)
    ask_for_a_story(line)
    line.say(np.concatenate([loud(400), quiet(700)]))
    line.wait(lambda: line.event("agent_resumed") is not None)
    assert line.event("agent_paused") is not None
    line.wait(lambda: line.event("agent_done") is not None, timeout=30)
    done = line.event("agent_done")
    assert done is not None and not done["interrupted"] and done["text"] == REPLY
    assert line.event("barge_in") is None
    assert [e["text"] for e in line.events if e["type"] == "user_transcript"] == ["tell me a story"]
    assert len(call.details()["transcript"]) == 1  # "oh wow" never became a turn
    line.stop()


def test_a_no_over_the_agent_stops_it_and_is_answered_without_transcribing_it_again(
    ended: list[Call],
) -> None:
    call, line, stt = call_with("No.")
    ended.append(call)
    ask_for_a_story(line)
    transcribed = len(stt.calls)
    line.say(np.concatenate([loud(400), quiet(700)]))
    line.wait(lambda: line.event("agent_done", interrupted=True) is not None)
    line.wait(lambda: line.event("user_transcript", text="No.") is not None)
    assert line.event("agent_resumed") is None
    assert len(stt.calls) == transcribed + 1  # the check's transcript served the turn
    turns = call.details()["transcript"]
    assert [t["user"] for t in turns] == ["tell me a story", "No."]
    assert turns[0]["agent_state"] == "interrupted"
    line.stop()
