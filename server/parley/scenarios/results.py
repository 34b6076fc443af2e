"""What a scenario run found: per turn, what the caller said and when, what the agent heard and said (as
the caller heard it), the tool calls, the latencies; both channels' speech on one clock; the failures.

Times are seconds from the call's start at the caller (the moment it was connected).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Span:
    """A stretch of speech on one channel, [start, end) in seconds from the call's start."""

    start: float
    end: float


@dataclass
class TurnResult:
    index: int  # the scenario's turn number, from 1; LLM-played turns follow the scripted ones
    action: str  # what the caller did, for the report: 'said "..."', "pressed 12#", "stayed quiet 8 s"
    said: str = ""  # the caller's words (text), if it spoke
    spoke: Span | None = None  # when its audio went out
    heard: str = ""  # what the agent transcribed of this turn ("" if none)
    reply: str = ""  # the agent's reply to it, as the caller heard it (cut where it was cut)
    interrupted: bool = False  # the reply was cut (by the caller's speech, or the call's end)
    response_s: float | None = None  # caller's speech end -> first reply audio, at the caller
    tools: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments", "result"}
    by_llm: bool = False  # played by the LLM caller
    failures: list[str] = field(default_factory=list)  # this turn's expectations that failed


@dataclass
class Verdict:
    """An LLM judge's reading of the call against the scenario's rubric."""

    passed: bool
    reason: str


@dataclass
class ScenarioResult:
    name: str
    path: str
    transport: str
    seed: int
    call_id: str = ""
    outcome: str = ""  # the call's ended reason, as the service recorded it
    transferred_to: str = ""
    duration_s: float = 0.0
    greeting: str = ""  # what the agent said first, as heard
    turns: list[TurnResult] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # as the mocks received them, in order
    caller_speech: list[Span] = field(default_factory=list)  # the caller's channel
    agent_speech: list[Span] = field(default_factory=list)  # the agent's channel, as heard by the caller
    talk_over: list[Span] = field(default_factory=list)  # agent audio heard while the caller spoke
    response_p50_s: float | None = None
    response_p95_s: float | None = None
    judge: Verdict | None = None
    failures: list[str] = field(default_factory=list)  # call-level ones; turn ones are in the turns
    error: str = ""  # the run itself failed (no call, a crash): the scenario fails with this

    @property
    def passed(self) -> bool:
        return not self.error and not self.failures and not any(t.failures for t in self.turns)

    def all_failures(self) -> list[str]:
        """Every failure, each naming where it happened: 'turn 2: ...' or the call's."""
        found = [f"error: {self.error}"] if self.error else []
        found += [f"turn {t.index}: {f}" for t in self.turns for f in t.failures]
        return found + self.failures
