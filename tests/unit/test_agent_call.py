"""An agent that acts, in a call with test engines: tools between the words, side effects only for the
turn's final revision, hold phrases, hang-up and transfer, and what stays in the history."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from parley.agent.agentfile import Agent, Builtins, ToolSpec
from parley.agent.tools import ToolRunner
from parley.call import Call
from parley.config import Settings
from parley.engines.toolcalls import ToolCall
from tests import agent_tools
from tests.doubles import ScriptedLlm, ScriptedStt, loud, make_engines, quiet
from tests.unit.test_call import RATE, Line

NUMBER = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}
LOOKUP = ToolSpec(
    "lookup_order",
    "Look up an order",
    NUMBER,
    python="t:f",
    side_effects=False,
    function=agent_tools.lookup_order,
)
SLOW = ToolSpec(
    "slow_lookup", "Slow", NUMBER, python="t:f", side_effects=True, function=agent_tools.slow_lookup
)


class FakeLine:
    """Stands in for the transport's LineControl: records what the agent did to the line."""

    def __init__(self, transfer_error: str = "") -> None:
        self.hung_up: list[str] = []
        self.transfers: list[str] = []
        self.transfer_error = transfer_error

    def hang_up(self, reason: str) -> None:
        self.hung_up.append(reason)

    def transfer(self, destination: str, timeout_s: float) -> None:
        if self.transfer_error:
            raise RuntimeError(self.transfer_error)
        self.transfers.append(destination)

    def send_dtmf(self, digits: str, timeout_s: float) -> None:
        pass


def start_call(
    agent: Agent, script: list[list[str | ToolCall]], on_line: FakeLine | None = None, **settings: Any
) -> tuple[Call, Line]:
    llm = ScriptedLlm(token_s=0.01, script=script)
    config = Settings(**{"greeting": "", "end_of_turn_ms": 300, "reopen_grace_ms": 300, **settings})
    engines = make_engines(llm=llm, stt=ScriptedStt())
    call = Call("c-agent", "test", config, engines, RATE, agent, line=on_line, tool_runner=ToolRunner())
    line = Line(call)
    call.start()
    line.start()
    return call, line


@pytest.fixture(autouse=True)
def fresh_calls() -> Iterator[None]:
    agent_tools.CALLS.clear()
    yield


def finish(call: Call, line: Line) -> None:
    line.stop()
    call.end("test_over")
    assert call.join(5.0)
    assert call.tool_runner is not None
    call.tool_runner.close()


def agent(**fields: Any) -> Agent:
    return Agent(name="orders", system_prompt="You are the order desk.", **fields)


def test_a_question_leads_to_one_tool_call_and_the_reply_speaks_its_result() -> None:
    script: list[list[str | ToolCall]] = [
        ["Let me ", "check. ", ToolCall("call_1", "lookup_order", '{"number": "123456"}')],
        ["It ", "shipped, ", "arriving ", "Thursday."],
    ]
    call, line = start_call(agent(tools=(LOOKUP,)), script)
    try:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=30)
        done = line.event("agent_done")
        assert done is not None and "Thursday" in done["text"] and done["interrupted"] is False
        assert agent_tools.CALLS == [{"tool": "lookup_order", "number": "123456"}]
        turn = call.details()["transcript"][0]
        assert [t["name"] for t in turn["tools"]] == ["lookup_order"]
        assert json.loads(turn["tools"][0]["result"])["eta"] == "Thursday"
        second_prompt = call.engines.llm.prompts[1]  # type: ignore[attr-defined]
        assert second_prompt[-1]["role"] == "tool" and "Thursday" in second_prompt[-1]["content"]
        assert line.event("tool_call", name="lookup_order") and line.event("tool_result", ok=True)
        assert call.engines.llm.offered[0] == ["lookup_order"]  # type: ignore[attr-defined]
    finally:
        finish(call, line)


def test_a_side_effecting_tool_never_runs_for_a_revision_the_caller_reopened() -> None:
    # The first part of the question asks for the slow tool at once; the caller goes on speaking inside
    # the reopen grace, so that revision is superseded before its tool may run. The whole question
    # (revision 1) asks again, and the tool runs once.
    script: list[list[str | ToolCall]] = [
        [ToolCall("call_1", "slow_lookup", '{"number": "1"}')],
        [ToolCall("call_2", "slow_lookup", '{"number": "2"}')],
        ["It ", "is ", "delayed."],
    ]
    call, line = start_call(agent(tools=(SLOW,)), script, reopen_grace_ms=600)
    try:
        line.say(np.concatenate([loud(600), quiet(400), loud(600), quiet(700)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=30)
        assert agent_tools.CALLS == [{"tool": "slow_lookup", "number": "2"}]
        turn = call.details()["transcript"][0]
        assert turn["revision"] == 1 and [t["tool_call_id"] for t in turn["tools"]] == ["call_2"]
    finally:
        finish(call, line)


def test_a_tool_running_when_the_caller_interrupts_finishes_once_and_stays_in_the_history() -> None:
    script: list[list[str | ToolCall]] = [
        ["One ", "moment. ", ToolCall("call_1", "slow_lookup", '{"number": "7"}')],
        ["It ", "is ", "delayed."],
    ]
    call, line = start_call(agent(tools=(SLOW,), hold_phrase="Still looking.", hold_after_ms=300), script)
    call.engines.tts.seconds_per_word = 0.3  # type: ignore[attr-defined]
    try:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(line.playing, timeout=10)
        time.sleep(0.9)  # the tool runs (1.5 s), the hold phrase is playing
        line.say(loud(1200))  # the caller talks over it
        line.wait(lambda: line.event("agent_done", interrupted=True) is not None)
        line.wait(lambda: bool(agent_tools.CALLS), timeout=5)
        time.sleep(0.3)
        assert agent_tools.CALLS == [{"tool": "slow_lookup", "number": "7"}]
        first = call.details()["transcript"][0]
        assert [t["tool_call_id"] for t in first["tools"]] == ["call_1"] and first["tools"][0]["ok"]
        spoken = [e["text"] for e in line.events if e["type"] == "agent_text"]
        assert spoken.count("Still looking.") == 1
    finally:
        finish(call, line)


def test_a_tool_that_hangs_reaches_the_model_as_a_timeout_and_the_call_goes_on() -> None:
    hanging = ToolSpec(
        "slow_lookup", "Slow", NUMBER, python="t:f", function=agent_tools.slow_lookup, timeout_ms=300
    )
    script: list[list[str | ToolCall]] = [
        [ToolCall("call_1", "slow_lookup", '{"number": "9"}')],
        ["Sorry, ", "the ", "system ", "is ", "slow."],
    ]
    call, line = start_call(agent(tools=(hanging,)), script)
    try:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=30)
        tool = call.details()["transcript"][0]["tools"][0]
        assert tool["ok"] is False and "300 ms" in json.loads(tool["result"])["error"]
        assert "slow" in (line.event("agent_done") or {})["text"]
    finally:
        finish(call, line)


def test_goodbye_then_the_agent_hangs_up_once_it_was_heard() -> None:
    script: list[list[str | ToolCall]] = [
        ["Goodbye, ", "have a nice day. ", ToolCall("c1", "end_call", "{}")],
        [],
    ]
    fake = FakeLine()
    call, line = start_call(agent(builtins=Builtins(end_call=True)), script, fake)
    try:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=30)
        line.wait(lambda: fake.hung_up == ["agent_hangup"], timeout=5)
        assert "Goodbye" in (line.event("agent_done") or {})["text"]
    finally:
        finish(call, line)


def test_a_failed_transfer_is_told_to_the_caller_and_the_call_goes_on() -> None:
    builtins = Builtins(transfer=("sip:desk@pbx.example.com",))
    script: list[list[str | ToolCall]] = [
        [
            "Putting ",
            "you ",
            "through. ",
            ToolCall("c1", "transfer", '{"destination": "sip:desk@pbx.example.com"}'),
        ],
        ["Sorry, ", "the ", "desk ", "is ", "busy."],
    ]
    fake = FakeLine(transfer_error="the transfer failed: 486 Busy Here")
    call, line = start_call(agent(builtins=builtins), script, fake)
    try:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=30)
        tool = call.details()["transcript"][0]["tools"][0]
        assert not tool["ok"] and "486" in json.loads(tool["result"])["error"]
        assert "busy" in (line.event("agent_done") or {})["text"] and not fake.hung_up
    finally:
        finish(call, line)


def test_arguments_outside_the_transfer_list_are_refused_before_anything_happens() -> None:
    builtins = Builtins(transfer=("sip:desk@pbx.example.com",))
    script: list[list[str | ToolCall]] = [
        [ToolCall("c1", "transfer", '{"destination": "sip:attacker@evil.example"}')],
        ["I ", "cannot ", "do ", "that."],
    ]
    fake = FakeLine()
    call, line = start_call(agent(builtins=builtins), script, fake)
    try:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=30)
        tool = call.details()["transcript"][0]["tools"][0]
        assert not tool["ok"] and "invalid arguments" in json.loads(tool["result"])["error"]
        assert fake.transfers == []
    finally:
        finish(call, line)


@pytest.mark.parametrize("yield_phrase", ["Sure, go ahead.", ""])
def test_a_caller_who_says_wait_gets_the_floor_not_a_reply(yield_phrase: str) -> None:
    llm = ScriptedLlm(token_s=0.01, reply="I'm sorry, but I can't assist with that.")
    stt = ScriptedStt(text_for=lambda seconds: "Uh, wait." if seconds > 0.25 else "")
    config = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    call = Call(
        "c-wait", "test", config, make_engines(llm=llm, stt=stt), RATE, agent(yield_phrase=yield_phrase)
    )
    line = Line(call)
    call.start()
    line.start()
    try:
        line.say(np.concatenate([loud(600), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None)
        done = line.event("agent_done")
        assert done is not None and done["interrupted"] is False
        if yield_phrase:
            assert done["text"] == "Sure, go ahead."
            assert llm.prompts == []  # the model was not asked
            assert call.details()["transcript"][0]["agent"] == "Sure, go ahead."
        else:
            # The model was asked (and, its reply being a refusal, asked once more by the reply guard).
            assert done["text"] == "I'm sorry, but I can't assist with that."
            assert llm.prompts and llm.prompts[0][-1] == {"role": "user", "content": "Uh, wait."}
    finally:
        line.stop()
        call.end("test_over")
        assert call.join(5.0)


@pytest.mark.parametrize(("stop_odds", "floor"), [(0.04, True), (0.001, False)])
def test_a_stop_whisper_wrote_as_uh_gets_the_floor_on_its_odds(stop_odds: float, floor: bool) -> None:
    # Over G.711 a "stop" comes out "Uh..." with a few percent on "Stop" (a real "uh": under 0.3 %).
    llm = ScriptedLlm(token_s=0.01, reply="I'm sorry, I didn't catch that.")
    stt = ScriptedStt(text_for=lambda seconds: "Uh..." if seconds > 0.25 else "", odds={"stop": stop_odds})
    config = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    call = Call("c-stop", "test", config, make_engines(llm=llm, stt=stt), RATE, agent())
    line = Line(call)
    call.start()
    line.start()
    try:
        line.say(np.concatenate([loud(600), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None)
        done = line.event("agent_done")
        assert done is not None
        assert any("stop" in asked for asked in stt.weighed)  # the short turn was weighed
        if floor:
            assert done["text"] == "Sure, go ahead." and llm.prompts == []
        else:
            assert done["text"] == "I'm sorry, I didn't catch that." and len(llm.prompts) == 1
    finally:
        line.stop()
        call.end("test_over")
        assert call.join(5.0)
