"""What `parley test` judges, and how it answers an agent's tools: each failure names the turn and what
was heard; the mock webhook answers the scenario's results and keeps what it was asked."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import aiohttp
import pytest

from parley.agent.agentfile import load_agent_file
from parley.scenarios.expectations import check_call, contains, judge_result
from parley.scenarios.results import ScenarioResult, Span, TurnResult, Verdict
from parley.scenarios.scenario import (
    CallExpectation,
    Scenario,
    ToolExpectation,
    ToolMock,
    Turn,
    TurnExpectation,
)
from parley.scenarios.tool_mocks import ToolMocks, agent_with_mocks, toml_text


def scenario(*turns: Turn, expect: CallExpectation | None = None) -> Scenario:
    return Scenario(Path("orders.toml"), "orders", turns=turns, expect=expect or CallExpectation())


def result(*turns: TurnResult, **fields: object) -> ScenarioResult:
    found = ScenarioResult("orders", "orders.toml", "sip", 0, turns=list(turns))
    for name, value in fields.items():
        setattr(found, name, value)
    return found


def test_words_are_matched_as_spoken_text() -> None:
    assert contains("Your order #4712 has SHIPPED.", "order 4712")
    assert contains("It arrives on Monday!", "monday")
    assert not contains("It arrives Mondays", "monday")  # whole words only
    assert not contains("anything", "")


def test_a_failed_turn_names_itself_and_what_was_heard() -> None:
    said = Turn(say="where is my order 4712", expect=TurnExpectation(says=("shipped",), hears=("4712",)))
    run = result(TurnResult(1, "said", heard="where is my order 47", reply="Sorry, I can't help with that."))
    judge_result(scenario(said), run)
    assert not run.passed
    failures = run.all_failures()
    assert failures[0] == "turn 1: the reply did not say 'shipped': heard \"Sorry, I can't help with that.\""
    assert failures[1] == "turn 1: the agent did not hear '4712': it heard \"where is my order 47\""


def test_regex_any_never_and_silence() -> None:
    expect = TurnExpectation(says_any=("Monday", "Tuesday"), says_regex=r"ship(ped|s)", never_says=("sorry",))
    run = result(TurnResult(1, "said", reply="Sorry, it ships Friday."))
    judge_result(scenario(Turn(say="x", expect=expect)), run)
    assert [f.split(":")[1].strip() for f in run.all_failures()] == [
        "the reply said none of ['Monday', 'Tuesday']",
        "the reply said 'sorry'",
    ]
    quiet = result(TurnResult(1, "said", reply="Hello?"))
    judge_result(scenario(Turn(say="mhm", expect=TurnExpectation(replies=False))), quiet)
    assert quiet.all_failures() == ['turn 1: the agent replied, where it should have stayed quiet: "Hello?"']


def test_a_backchannel_must_not_cut_the_reply_it_was_said_over() -> None:
    turns = (Turn(say="tell me about deliveries"), Turn(say="mhm", when="during_reply", backchannel=True))
    cut = result(TurnResult(1, "said", reply="We deliver on", interrupted=True), TurnResult(2, "said mhm"))
    judge_result(scenario(*turns), cut)
    assert cut.all_failures() == [
        'turn 2: the backchannel cut the reply it was said over (turn 1): "We deliver on"'
    ]
    kept = result(TurnResult(1, "said", reply="We deliver on weekdays."), TurnResult(2, "said mhm"))
    judge_result(scenario(*turns), kept)
    assert kept.passed


def test_tools_are_counted_with_their_arguments() -> None:
    expect = CallExpectation(
        tools=(
            ToolExpectation("lookup_order", {"number": "4712"}, 1),
            ToolExpectation("lookup_order", {"number": "47"}, 0),
            ToolExpectation("cancel_order", {}, 0),
        )
    )
    calls = [{"name": "lookup_order", "arguments": {"number": "47"}, "result": {}}]
    failures = check_call(expect, result(tool_calls=calls))
    made = 'the calls made: lookup_order({"number": "47"})'
    assert failures == [
        f'lookup_order({{"number": "4712"}}) was called 0 times, not 1; {made}',
        f'lookup_order({{"number": "47"}}) was called 1 times, not 0; {made}',
    ]
    right = [{"name": "lookup_order", "arguments": {"number": " 4712"}, "result": {}}]
    assert check_call(expect, result(tool_calls=right)) == []


def test_outcome_talk_over_latency_and_judge() -> None:
    expect = CallExpectation(
        outcome="transferred", max_talk_over_ms=500, response_p50_ms=800, response_p95_ms=2000
    )
    run = result(
        outcome="hangup",
        talk_over=[Span(3.0, 3.2), Span(7.5, 8.4)],
        response_p50_s=0.9,
        response_p95_s=1.5,
    )
    assert check_call(expect, run) == [
        "the call ended as 'hangup', not 'transferred'",
        "the agent talked over the caller for 900 ms at 7.5 s (at most 500 ms)",
        "response latency p50 was 900 ms (at most 800 ms)",
    ]
    from parley.scenarios.scenario import Judge

    judged = CallExpectation(judge=Judge("was polite"))
    assert check_call(judged, result(judge=Verdict(False, "it was rude"))) == [
        "the judge failed the call: it was rude"
    ]
    assert check_call(judged, result(judge=Verdict(True, "fine"))) == []


def test_turns_the_call_never_reached_fail_the_call() -> None:
    run = result(TurnResult(1, "said", reply="Goodbye."), outcome="agent_hangup")
    judge_result(scenario(Turn(say="hi"), Turn(say="and another thing")), run)
    assert run.all_failures() == ["the call ended after turn 1 of 2 (agent_hangup)"]


def test_the_agent_file_copy_points_every_tool_at_the_mocks(tmp_path: Path) -> None:
    (tmp_path / "hold.wav").write_bytes(b"")
    original = tmp_path / "orders.toml"
    original.write_text(
        'greeting = "Acme orders, \\"hi\\""\nhold_sound = "hold.wav"\n'
        '[[tools]]\nname = "lookup_order"\ndescription = "d"\npython = "shop.tools:lookup"\n'
        'parameters = { type = "object", properties = { number = { type = "string" } } }\n'
        '[[tools]]\nname = "cancel_order"\ndescription = "c"\nurl = "https://backend.example.com/c"\n'
        "[builtins]\nend_call = true\n"
    )
    copy = tomllib.loads(agent_with_mocks(original, "http://127.0.0.1:9"))
    assert [t["url"] for t in copy["tools"]] == [
        "http://127.0.0.1:9/tools/lookup_order",
        "http://127.0.0.1:9/tools/cancel_order",
    ]
    assert "python" not in copy["tools"][0]
    assert copy["hold_sound"] == str(tmp_path / "hold.wav")
    assert copy["greeting"] == 'Acme orders, "hi"' and copy["builtins"] == {"end_call": True}


def test_the_rewritten_example_agent_loads(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "agents" / "orders.toml"
    copy = tmp_path / "orders.toml"
    copy.write_text(agent_with_mocks(example, "http://127.0.0.1:9"))
    agent = load_agent_file(copy)
    assert {t.name: t.url for t in agent.tools} == {
        "lookup_order": "http://127.0.0.1:9/tools/lookup_order",
        "cancel_order": "http://127.0.0.1:9/tools/cancel_order",
    }


def test_toml_text_reads_back() -> None:
    data = {"a": "line\nbreak \u00e9", "n": [1, 2.5, True], "t": {"deep": {"x": []}}}
    assert tomllib.loads(toml_text(data)) == data


async def test_the_mock_webhook_answers_the_scenario_and_keeps_the_calls() -> None:
    mocks = await ToolMocks().start()
    try:
        mocks.use(
            {"lookup_order": ToolMock(result={"status": "shipped"}), "cancel_order": ToolMock(error="down")}
        )
        async with aiohttp.ClientSession() as session:

            async def post(name: str) -> tuple[int, object]:
                body = {"call_id": "c1", "name": name, "arguments": {"number": "4712"}}
                async with session.post(f"{mocks.url}/tools/{name}", json=body) as r:
                    return r.status, json.loads(await r.text())

            assert await post("lookup_order") == (200, {"status": "shipped"})
            assert (await post("cancel_order"))[0] == 500
            assert (await post("refund"))[0] == 501
        assert [(c.name, c.arguments) for c in mocks.calls_of("c1")] == [
            ("lookup_order", {"number": "4712"}),
            ("cancel_order", {"number": "4712"}),
            ("refund", {"number": "4712"}),
        ]
        mocks.use({})
        assert mocks.calls == []
    finally:
        await mocks.close()


@pytest.mark.parametrize("bad", [object()])
def test_toml_text_refuses_what_toml_cannot_hold(bad: object) -> None:
    with pytest.raises(TypeError):
        toml_text({"x": bad})
