"""When a reply's words are due, and how that deadline travels with the work to the engine that does it."""

from __future__ import annotations

import time

import pytest

from parley.call import Call
from parley.config import Settings
from parley.engines.deadlines import call_with_deadline, stream_with_deadline, with_deadlines
from parley.engines.urgency import URGENCY, due_by
from parley.pipeline.messages import REFILL_DUE_S, REPLY_DUE_S, SPEECH_S_PER_CHAR, Response, Tag
from tests.doubles import loud, make_engines, quiet
from tests.unit.test_call import RATE, on_a_line
from tests.unit.test_speculative_replies import TimedLlm


def test_a_replys_first_words_are_due_a_moment_after_the_caller_stops_then_as_its_speech_runs_out() -> None:
    response = Response(Tag("t", 0, 1), speech_end=100.0)
    assert response.text_due_at() == pytest.approx(100.0 + REPLY_DUE_S)

    response.text_sent = 50  # characters given to TTS, about three seconds of speech
    response.first_audio_at = 101.0
    assert response.text_due_at() == pytest.approx(101.0 + 50 * SPEECH_S_PER_CHAR - REFILL_DUE_S)

    greeting = Response(Tag(None, None, 1))  # no speech before it: due from when it was made
    assert greeting.text_due_at() == pytest.approx(greeting.created_at + REPLY_DUE_S)


def test_work_asked_for_no_reply_is_due_when_it_is_asked_for() -> None:
    before = time.monotonic()
    due = due_by()
    assert before <= due() <= time.monotonic()
    token = URGENCY.set(lambda: 42.0)
    try:
        assert due_by()() == 42.0
    finally:
        URGENCY.reset(token)


def test_the_deadline_goes_with_the_work_to_the_engines_worker_thread() -> None:
    def deadline() -> float:
        return 7.0

    token = URGENCY.set(deadline)
    try:
        assert call_with_deadline("stt", 5.0, URGENCY.get) is deadline
        streamed = list(stream_with_deadline("llm", 5.0, lambda _abandoned: iter([URGENCY.get()])))
    finally:
        URGENCY.reset(token)
    assert streamed == [deadline]
    assert call_with_deadline("stt", 5.0, URGENCY.get) is None  # not left behind for other work


def test_a_call_asks_its_llm_for_words_due_a_moment_after_the_caller_stopped() -> None:
    llm = TimedLlm(reply="Hello there.")
    settings = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    # Wrapped as the service wraps them: each engine call on a worker thread of its own.
    engines = with_deadlines(make_engines(llm=llm), 5.0)
    call = Call("c-due", "test", settings, engines, outbound_rate=RATE)
    spoke_until = 0.0
    with on_a_line(call) as line:
        line.say(loud(800))
        spoke_until = time.monotonic()
        line.say(quiet(600))
        line.wait(lambda: line.event("agent_done") is not None, timeout=20)
    assert llm.asked_at
    asked_at, due = llm.asked_at[0], llm.due_at[0]
    speech_end = due - REPLY_DUE_S
    # Due from the end of the caller's speech (which the VAD places within its frames), not from the ask.
    assert spoke_until - 0.3 < speech_end < asked_at
