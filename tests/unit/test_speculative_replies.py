"""Speculative replies, in a call with test engines: the reply starts at the turn's first pause, nothing
of it is heard before the turn has ended, and speech that goes on cancels it unheard."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from parley import metrics
from parley.agent.agentfile import Agent
from parley.agent.tools import ToolRunner
from parley.call import Call
from parley.config import Settings
from parley.engines.llm import Message
from parley.engines.toolcalls import ToolCall
from parley.engines.urgency import due_by
from parley.pipeline.messages import Response, Tag
from parley.pipeline.speculation import SpeculativeReplies
from tests import agent_tools
from tests.doubles import ScriptedLlm, ScriptedStt, loud, make_engines, quiet
from tests.unit.test_agent_call import SLOW
from tests.unit.test_call import RATE, Line, on_a_line


class TimedLlm(ScriptedLlm):
    """Remembers when each reply was asked for, and when the engine would take its words to be due."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.asked_at: list[float] = []
        self.due_at: list[float] = []

    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: list[dict[str, Any]] | None = None,
        *,
        calls: bool = True,
    ) -> Iterator[str | ToolCall]:
        self.asked_at.append(time.monotonic())
        self.due_at.append(due_by()())
        return super().stream(messages, should_stop, tools, calls=calls)


class StampedLine(Line):
    """A Line that also remembers when each event came."""

    def __init__(self, call: Call) -> None:
        self.stamps: list[float] = []
        super().__init__(call)

    def deliver_event(self, payload: dict[str, Any]) -> None:
        self.stamps.append(time.monotonic())
        super().deliver_event(payload)

    def state_at(self, state: str) -> float:
        index = next(i for i, e in enumerate(self.events) if e["type"] == "state" and e["state"] == state)
        return self.stamps[index]


def wasted() -> float:
    return float(metrics.SPECULATIVE_REPLIES_TOTAL.labels(outcome="wasted")._value.get())


@pytest.fixture
def call_and_line() -> Iterator[tuple[Call, StampedLine, TimedLlm]]:
    # A long end of turn, so that a reply started at the pause is well under way before the turn ends.
    settings = Settings(greeting="", end_of_turn_ms=700, reopen_grace_ms=100)
    llm = TimedLlm(token_s=0.01)
    call = Call("c-spec", "test", settings, make_engines(llm=llm, stt=ScriptedStt()), outbound_rate=RATE)
    line = StampedLine(call)
    call.start()
    line.start()
    yield call, line, llm
    line.stop()
    call.end("test_over")
    assert call.join(5.0)


def test_the_reply_starts_at_the_pause_and_is_heard_only_once_the_turn_has_ended(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line, llm = call_and_line
    line.say(np.concatenate([loud(800), quiet(1000)]))
    line.wait(lambda: line.event("agent_done") is not None)
    ended_at = line.state_at("thinking")
    assert llm.asked_at and llm.asked_at[0] < ended_at - 0.3  # started at the pause, not at the end
    first_sound = next(t for t, sound in line.heard if sound)
    assert first_sound >= ended_at  # held until the turn ended
    done = line.event("agent_done")
    assert done is not None and done["interrupted"] is False and "weather" in done["text"]
    assert call.details()["transcript"][0]["agent_state"] == "committed"


def test_speech_after_a_short_pause_cancels_the_reply_unheard(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line, llm = call_and_line
    before = wasted()
    line.say(np.concatenate([loud(600), quiet(400), loud(600)]))
    assert not any(sound for _, sound in line.heard)  # nothing of the first draft was played
    line.say(quiet(1000))
    line.wait(lambda: line.event("agent_done") is not None)
    assert wasted() >= before + 1
    assert len(llm.asked_at) == 2  # the cancelled draft and the reply to the whole turn
    said = [e for e in line.events if e["type"] == "user_transcript"]
    assert len(said) == 1 and said[0]["revision"] == 0  # no transcript of half a turn
    replies = [e for e in line.events if e["type"] == "agent_done"]
    assert len(replies) == 1 and replies[0]["interrupted"] is False
    transcript = call.details()["transcript"]
    assert len(transcript) == 1 and transcript[0]["agent_state"] == "committed"


def test_without_speculation_the_reply_waits_for_the_end_of_the_turn() -> None:
    settings = Settings(greeting="", end_of_turn_ms=700, reopen_grace_ms=100, speculative_replies=False)
    llm = TimedLlm(token_s=0.01)
    call = Call("c-nospec", "test", settings, make_engines(llm=llm, stt=ScriptedStt()), outbound_rate=RATE)
    line = Line(call)
    call.start()
    line.start()
    try:
        started = time.monotonic()
        line.say(np.concatenate([loud(800), quiet(1000)]))
        line.wait(lambda: line.event("agent_done") is not None)
        assert llm.asked_at[0] - started > 0.8 + 0.6  # the speech, then most of the end-of-turn silence
    finally:
        line.stop()
        call.end("test_over")
        assert call.join(5.0)


def order_desk(call_id: str, script: list[list[str | ToolCall]], end_of_turn_ms: int) -> Call:
    """A call to an agent with a slow tool that has side effects (1.5 s), its model playing `script`."""
    settings = Settings(greeting="", end_of_turn_ms=end_of_turn_ms, reopen_grace_ms=100)
    engines = make_engines(llm=ScriptedLlm(token_s=0.01, script=script), stt=ScriptedStt())
    agent = Agent(name="orders", system_prompt="You are the order desk.", tools=(SLOW,))
    return Call(call_id, "test", settings, engines, RATE, agent, tool_runner=ToolRunner())


def test_a_side_effecting_tool_waits_for_the_end_of_the_turn_and_never_runs_for_a_cancelled_reply() -> None:
    agent_tools.CALLS.clear()
    script: list[list[str | ToolCall]] = [
        [ToolCall("call_1", "slow_lookup", '{"number": "1"}')],
        [ToolCall("call_2", "slow_lookup", '{"number": "2"}')],
        ["It ", "is ", "delayed."],
    ]
    call = order_desk("c-spec-tool", script, end_of_turn_ms=700)
    line = Line(call)
    call.start()
    line.start()
    try:
        line.say(np.concatenate([loud(600), quiet(500)]))  # a pause: the first draft asks for the tool
        assert agent_tools.CALLS == []  # its turn has not ended: a side effect may not happen yet
        line.say(np.concatenate([loud(600), quiet(1200)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=15)
        assert agent_tools.CALLS == [{"tool": "slow_lookup", "number": "2"}]
    finally:
        line.stop()
        call.end("test_over")
        assert call.join(5.0)
        call.tool_runner.close()


def test_a_pause_longer_than_the_grace_still_gives_one_reply_while_nothing_was_heard() -> None:
    # The grace is 100 ms, the pause 900 ms, and the reply takes 1.5 s: the caller goes on before
    # hearing any of it, so the turn is reopened and answered as a whole.
    settings = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=100)
    llm = ScriptedLlm(first_token_s=1.5, token_s=0.01)
    call = Call("c-unheard", "test", settings, make_engines(llm=llm, stt=ScriptedStt()), outbound_rate=RATE)
    with on_a_line(call) as line:
        line.say(np.concatenate([loud(600), quiet(900), loud(600)]))
        spoke_until = time.monotonic()
        line.say(quiet(600))
        line.wait(lambda: line.event("agent_done") is not None)
        assert not any(sound for t, sound in line.heard if t < spoke_until)
        said = [e for e in line.events if e["type"] == "user_transcript"]
        assert said[-1]["revision"] == 1
        replies = [e for e in line.events if e["type"] == "agent_done"]
        assert len(replies) == 1 and replies[0]["interrupted"] is False
        assert len(call.details()["transcript"]) == 1


def test_a_side_effecting_tool_settles_its_turn_so_speech_after_it_is_a_new_turn() -> None:
    agent_tools.CALLS.clear()
    script: list[list[str | ToolCall]] = [
        [ToolCall("call_1", "slow_lookup", '{"number": "1"}')],
        ["It ", "is ", "delayed."],
    ]
    call = order_desk("c-settled", script, end_of_turn_ms=300)
    try:
        with on_a_line(call) as line:
            line.say(np.concatenate([loud(600), quiet(700)]))  # the turn ends; the tool starts (1.5 s)
            line.wait(lambda: line.event("tool_call") is not None)
            line.say(np.concatenate([loud(1200), quiet(600)]))  # nothing heard yet, but the tool acted
            line.wait(lambda: sum(e["type"] == "agent_done" for e in line.events) >= 2, timeout=15)
            said = [(e["turn_id"], e["revision"]) for e in line.events if e["type"] == "user_transcript"]
            assert said == [("c-settled:turn-1", 0), ("c-settled:turn-2", 0)]
            assert agent_tools.CALLS == [{"tool": "slow_lookup", "number": "1"}]
    finally:
        call.tool_runner.close()


def test_one_draft_at_a_time_and_only_its_own_tag_is_held() -> None:
    replies = SpeculativeReplies()
    first = Response(Tag("t-1", 0, 0), speech_end=1.0)
    second = Response(Tag("t-1", 0, 1), speech_end=2.0)
    assert replies.start(first) is None
    assert replies.holds(first.tag) and not replies.holds(Tag("t-1", 1, 0))
    assert replies.start(second) is first  # the caller cancels the one it replaces
    assert replies.adopt("t-1", 0, speech_end=1.0) is None  # made for other speech: not this turn's
    assert replies.hold_event(second, {"type": "user_transcript"})
    adopted = replies.adopt("t-1", 0, speech_end=2.0)
    assert adopted is not None and adopted[0] is second and adopted[1] == [{"type": "user_transcript"}]
    assert not replies.holds(second.tag) and replies.wait(second.tag, 0.01)
    assert not replies.hold_event(second, {"type": "user_transcript"})  # adopted: sent at once
