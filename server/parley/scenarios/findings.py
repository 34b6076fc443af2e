"""What a played call found, put on its result: the service's record of the call (`GET /api/calls/<id>`:
the transcript as heard, cut where the caller cut it, and how it ended) matched to the scripted turns,
and what the caller's ears measured (both channels' speech, where they overlap, how long each reply took
to start).

Each of the service's turns goes to the scripted turn during which it began (an agent may answer one
scripted turn in two of its own, and an idle prompt belongs to the silence it broke).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from dataclasses import dataclass
from typing import Any

from parley.bench.listening import SPEECH_DBFS, Ears
from parley.scenarios.results import ScenarioResult, Span, TurnResult

SPAN_GAP_S = 0.25  # speech frames this close belong to one span (Piper pauses between sentences)


@dataclass(frozen=True)
class Played:
    """How the call was played, as the runner knows it: the caller's ears (what it heard, the events),
    when the call connected (on the caller's clock and on the wall clock) and ended, when each turn began, and
    which turns were backchannels (said over a reply on purpose: not talk-over, not owed an answer)."""

    ears: Ears
    t0: float
    wall_t0: float
    ended_at: float  # when the call ended or was hung up, on the caller's clock
    windows: list[tuple[float, TurnResult]]
    backchannels: set[int]


def fill_in(
    result: ScenarioResult,
    details: dict[str, Any],
    played: Played,
    mocked_calls: list[dict[str, Any]] | None,
) -> None:
    """`mocked_calls`: the tool calls as the mock webhook received them (what the backend would have
    got); None when the service's own tools ran, whose calls the record then gives."""
    ears, t0 = played.ears, played.t0
    transcript: list[dict[str, Any]] = details.get("transcript") or []
    result.outcome = str(details.get("ended_reason") or "")
    result.transferred_to = getattr(ears, "transferred_to", "") or str(
        (ears.latest_event("transfer") or {}).get("to") or ""
    )
    result.duration_s = round(played.ended_at - t0, 2)
    _match_transcript(result, transcript, played)
    if mocked_calls is not None:
        result.tool_calls = mocked_calls
    else:
        result.tool_calls = [_tool(t) for entry in transcript for t in entry.get("tools") or []]
    result.caller_speech = [t.spoke for t in result.turns if t.spoke is not None]
    result.agent_speech = _agent_spans(ears, t0)
    spoken_over = [
        t.spoke for t in result.turns if t.spoke is not None and t.index not in played.backchannels
    ]
    result.talk_over = _overlaps(spoken_over, result.agent_speech)
    for index, turn in enumerate(result.turns):
        if turn.spoke is not None and turn.index not in played.backchannels and turn.reply:
            following = result.turns[index + 1].spoke if index + 1 < len(result.turns) else None
            turn.response_s = _response(ears, t0, turn.spoke.end, following.start if following else None)
    latencies = sorted(t.response_s for t in result.turns if t.response_s is not None)
    if latencies:
        result.response_p50_s = round(statistics.median(latencies), 3)
        result.response_p95_s = round(latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], 3)


def _match_transcript(result: ScenarioResult, transcript: list[dict[str, Any]], played: Played) -> None:
    """A service turn began when the first event naming it reached the caller (else when the record says
    it started, on the wall clock)."""
    first_seen: dict[str, float] = {}
    for at, payload in played.ears.events:
        turn_id = payload.get("turn_id")
        if isinstance(turn_id, str):
            first_seen.setdefault(turn_id, at)
    for entry in transcript:
        turn_id = str(entry.get("turn_id", ""))
        if turn_id == "greeting":
            result.greeting = str(entry.get("agent") or "")
            continue
        seen = first_seen.get(turn_id)
        if seen is None and isinstance(entry.get("started"), int | float):
            seen = played.t0 + float(entry["started"]) - played.wall_t0
        owner = _owner(played.windows, seen)
        if owner is None:
            continue
        if entry.get("user"):
            owner.heard = " ".join(filter(None, (owner.heard, str(entry["user"]))))
        if entry.get("agent"):
            owner.reply = " ".join(filter(None, (owner.reply, str(entry["agent"]))))
            owner.interrupted = owner.interrupted or bool(entry.get("interrupted"))
        owner.tools += [_tool(t) for t in entry.get("tools") or []]


def _owner(windows: list[tuple[float, TurnResult]], at: float | None) -> TurnResult | None:
    if at is None:
        return None
    owner = None
    for begun, turn in windows:
        if begun <= at:
            owner = turn
    return owner


def _agent_spans(ears: Ears, t0: float) -> list[Span]:
    spans: list[Span] = []
    for at, level in zip(ears.heard.times, ears.heard.levels, strict=False):
        if level <= SPEECH_DBFS:
            continue
        t = at - t0
        if spans and t - spans[-1].end <= SPAN_GAP_S:
            spans[-1] = Span(spans[-1].start, t + 0.02)
        else:
            spans.append(Span(t, t + 0.02))
    return [Span(round(s.start, 3), round(s.end, 3)) for s in spans]


def _response(ears: Ears, t0: float, spoken_end: float, until: float | None) -> float | None:
    """From the end of the caller's speech to the onset of reply audio after it (a reply still sounding
    when the caller stopped is not its answer: the onset follows a silence)."""
    silent_seen = False
    for at, level in zip(ears.heard.times, ears.heard.levels, strict=False):
        t = at - t0
        if t < spoken_end:
            continue
        if until is not None and t >= until:
            return None
        if level <= SPEECH_DBFS:
            silent_seen = True
        elif silent_seen:
            return round(t - spoken_end, 3)
    return None


def _tool(entry: dict[str, Any]) -> dict[str, Any]:
    arguments = entry.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    result = entry.get("result")
    if isinstance(result, str):
        with contextlib.suppress(ValueError):
            result = json.loads(result)
    return {"name": entry.get("name"), "arguments": arguments, "result": result}


def _overlaps(caller: list[Span], agent: list[Span]) -> list[Span]:
    found = []
    for a in caller:
        for b in agent:
            start, end = max(a.start, b.start), min(a.end, b.end)
            if end > start:
                found.append(Span(round(start, 3), round(end, 3)))
    return found
