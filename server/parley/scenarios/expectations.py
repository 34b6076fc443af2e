"""Judging a scenario's call against what it expects: each failure is a sentence naming what was wanted
and what was heard, put on the turn it concerns (or on the call).

Words are compared as spoken text: case, punctuation and spacing ignored ("Order #4712." says "order
4712"). The agent's reply is what the caller heard of it, cut where it was cut.
"""

from __future__ import annotations

import json
import re
from typing import Any

from parley.scenarios.results import ScenarioResult, TurnResult
from parley.scenarios.scenario import CallExpectation, Scenario, ToolExpectation, Turn, TurnExpectation

QUOTE_CHARS = 160  # how much of a transcript a failure message quotes


def normalised(text: str) -> str:
    # "4,712" is the number 4712 (Whisper and models group digits), not the words "4" and "712".
    text = re.sub(r"(?<=\d)[,.](?=\d{3}\b)", "", text.lower())
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def contains(text: str, phrase: str) -> bool:
    """`phrase` appears in `text` as whole words (case, punctuation and spacing ignored)."""
    wanted = normalised(phrase)
    return bool(wanted) and f" {wanted} " in f" {normalised(text)} "


def quoted(text: str) -> str:
    text = " ".join(text.split())
    if not text:
        return "nothing"
    return json.dumps(text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 3] + "...")


def check_turn(turn: Turn, result: TurnResult, over: TurnResult | None) -> list[str]:
    """The failures of one turn. `over`: for a backchannel, the turn whose reply it was said over."""
    found = _reply_failures(turn.expect, result)
    if turn.backchannel and over is not None and over.interrupted:
        found.append(
            f"the backchannel cut the reply it was said over (turn {over.index}): {quoted(over.reply)}"
        )
    if turn.backchannel and result.reply:
        found.append(f"the agent answered the backchannel: {quoted(result.reply)}")
    return found


def _reply_failures(expect: TurnExpectation, result: TurnResult) -> list[str]:
    reply, heard = result.reply, result.heard
    found = [
        f"the reply did not say {phrase!r}: heard {quoted(reply)}"
        for phrase in expect.says
        if not contains(reply, phrase)
    ]
    if expect.says_any and not any(contains(reply, p) for p in expect.says_any):
        found.append(f"the reply said none of {list(expect.says_any)}: heard {quoted(reply)}")
    if expect.says_regex and not re.search(expect.says_regex, reply, re.IGNORECASE):
        found.append(f"the reply did not match /{expect.says_regex}/: heard {quoted(reply)}")
    found += [
        f"the reply said {phrase!r}: heard {quoted(reply)}"
        for phrase in expect.never_says
        if contains(reply, phrase)
    ]
    found += [
        f"the agent did not hear {phrase!r}: it heard {quoted(heard)}"
        for phrase in expect.hears
        if not contains(heard, phrase)
    ]
    if not expect.replies and reply:
        found.append(f"the agent replied, where it should have stayed quiet: {quoted(reply)}")
    return found


def check_call(expect: CallExpectation, result: ScenarioResult) -> list[str]:
    """The call's failures: its outcome, the tools called, talking over the caller, latency."""
    found: list[str] = []
    if expect.outcome and result.outcome != expect.outcome:
        found.append(
            f"the call ended as {result.outcome or 'nothing (it had not ended)'!r}, not {expect.outcome!r}"
        )
    if expect.transferred_to and result.transferred_to != expect.transferred_to:
        found.append(
            f"the call was transferred to {result.transferred_to or 'nowhere'!r}, "
            f"not {expect.transferred_to!r}"
        )
    found += [f for tool in expect.tools if (f := _tool_failure(tool, result.tool_calls))]
    if expect.max_talk_over_ms is not None and result.talk_over:
        longest = max(result.talk_over, key=lambda s: s.end - s.start)
        ms = round(1000 * (longest.end - longest.start))
        if ms > expect.max_talk_over_ms:
            found.append(
                f"the agent talked over the caller for {ms} ms at {longest.start:.1f} s "
                f"(at most {expect.max_talk_over_ms} ms)"
            )
    for name, budget_ms, value in (
        ("p50", expect.response_p50_ms, result.response_p50_s),
        ("p95", expect.response_p95_ms, result.response_p95_s),
    ):
        if budget_ms is None:
            continue
        if value is None:
            found.append(f"no response latency was measured, so the {name} budget of {budget_ms} ms is unmet")
        elif value * 1000 > budget_ms:
            found.append(f"response latency {name} was {round(value * 1000)} ms (at most {budget_ms} ms)")
    if expect.judge is not None:
        if result.judge is None:
            found.append("the judge gave no verdict")
        elif not result.judge.passed:
            found.append(f"the judge failed the call: {result.judge.reason}")
    return found


def _tool_failure(expected: ToolExpectation, calls: list[dict[str, Any]]) -> str:
    named = [c for c in calls if c.get("name") == expected.name]
    matching = [c for c in named if _arguments_match(expected.arguments, c.get("arguments") or {})]
    if len(matching) == expected.times:
        return ""
    wanted = f"{expected.name}({json.dumps(expected.arguments)})" if expected.arguments else expected.name
    made = ", ".join(f"{c['name']}({json.dumps(c.get('arguments') or {})})" for c in calls) or "none"
    return f"{wanted} was called {len(matching)} times, not {expected.times}; the calls made: {made}"


def _arguments_match(expected: dict[str, Any], given: dict[str, Any]) -> bool:
    """Each expected argument has its value; strings compared as spoken text ("4712" == " 4712")."""
    for key, value in expected.items():
        if key not in given:
            return False
        actual = given[key]
        if isinstance(value, str) and isinstance(actual, str):
            if normalised(value) != normalised(actual):
                return False
        elif value != actual:
            return False
    return True


def judge_result(scenario: Scenario, result: ScenarioResult) -> None:
    """Put every failure on the result: each scripted turn's on the turn, the call's on the call."""
    scripted = {t.index: t for t in result.turns if not t.by_llm}
    for index, turn in enumerate(scenario.turns, start=1):
        outcome = scripted.get(index)
        if outcome is None:
            continue  # the call ended before this turn; the call's expectations say what that cost
        over = scripted.get(index - 1) if turn.backchannel else None
        outcome.failures += check_turn(turn, outcome, over)
    if len(scripted) < len(scenario.turns) and not result.error:
        result.failures.append(
            f"the call ended after turn {len(scripted)} of {len(scenario.turns)} "
            f"({result.outcome or 'no outcome'})"
        )
    result.failures += check_call(scenario.expect, result)
