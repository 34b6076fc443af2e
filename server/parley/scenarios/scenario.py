"""A scenario: one call to the agent, as the caller plays it and as it must go.

Written as TOML (docs/scenarios.md); scenario_file.py reads and checks a file into these values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

When = Literal["after_reply", "during_reply", "at_once"]


class ScenarioError(ValueError):
    """A scenario file that cannot be run: the message names the file and the key."""


_MARKER = re.compile(r"\[([^\[\]]*)\]")
_PAUSE = re.compile(r"pause\s+(\d+(?:\.\d+)?)\s*(ms|s)", re.IGNORECASE)


def spoken_parts(say: str) -> list[str | float]:
    """A turn's `say` cut at its pause markers: the stretches of text, and between them each pause in
    ms ("[pause 900ms]", "[pause 1.2s]"). ScenarioError (without the file's name) for any other bracket."""
    parts: list[str | float] = []
    at = 0
    for marker in _MARKER.finditer(say):
        pause = _PAUSE.fullmatch(marker.group(1).strip())
        if pause is None:
            raise ScenarioError(f"{marker.group(0)!r} is not a pause (write [pause 900ms] or [pause 1.2s])")
        value, unit = float(pause.group(1)), pause.group(2).lower()
        # Rounded: 0.7 s is 700.0000000000001 ms in floating point, and a length a hair short loses a sample.
        parts += [say[at : marker.start()], round(value * 1000 if unit == "s" else value, 6)]
        at = marker.end()
    parts.append(say[at:])
    if any(isinstance(part, str) and ("[" in part or "]" in part) for part in parts):
        raise ScenarioError("a [ or ] outside a whole [pause ...] marker")
    return parts


@dataclass(frozen=True)
class Voice:
    """Who speaks a caller's turn: `piper` (a Piper voice: "joe", the packaged one, or an .onnx path,
    spoken without Piper's random prosody so every run sounds the same), `espeak` (an espeak-ng voice),
    or `wav` (no text: a recorded file)."""

    engine: Literal["piper", "espeak"]
    name: str


@dataclass(frozen=True)
class Stall:
    """The line holds the caller's audio for `ms` from `at_s` into the call, then delivers it at once."""

    at_s: float
    ms: int


@dataclass(frozen=True)
class Line:
    """The caller's line: its codec, and what happens to the caller's audio on the way (seeded)."""

    codec: str = ""  # PCMU | PCMA (sip), opus (webrtc), mulaw (carrier); "" = the transport's own
    loss: float = 0.0  # share of the caller's 20 ms packets lost, 0..0.5
    jitter_ms: int = 0  # each packet is delayed 0..jitter_ms (so some arrive out of order)
    stalls: tuple[Stall, ...] = ()
    noise: str = ""  # street | babble | music | a WAV path; "" = a clean line
    snr_db: float = 15.0  # the caller's speech over the noise


@dataclass(frozen=True)
class TurnExpectation:
    """What must hold of the agent's reply to this turn, as the caller heard it."""

    says: tuple[str, ...] = ()  # each word or phrase appears (case and punctuation ignored)
    says_any: tuple[str, ...] = ()  # at least one of these appears
    says_regex: str = ""  # a regular expression found in the reply (case-insensitive)
    never_says: tuple[str, ...] = ()  # none of these appears
    hears: tuple[str, ...] = ()  # the agent's transcript of the caller has each of these
    replies: bool = True  # the agent answers this turn at all (False: it must stay quiet)


@dataclass(frozen=True)
class Turn:
    """One thing the caller does. Exactly one of `say`, `wav`, `press`, `silence_s`, `hangup`."""

    say: str = ""  # text; "[pause 900ms]" inside it is a pause mid-sentence
    wav: str = ""  # a recorded WAV (any rate, mono), resolved against the scenario's folder
    press: str = ""  # DTMF digits
    silence_s: float = 0.0  # the caller says nothing for this long (goes quiet)
    hangup: bool = False
    voice: Voice | None = None  # this turn's voice (default: the caller's)
    when: When = "after_reply"  # after the agent fell silent; during its reply (barge-in); at once
    after_s: float = 0.0  # after_reply: the wait once it fell silent; during_reply: how far into it
    backchannel: bool = False  # said over the reply ("mhm"): the reply must go on, not be cut
    expect: TurnExpectation = field(default_factory=TurnExpectation)


@dataclass(frozen=True)
class ToolMock:
    """What a tool answers in this scenario (the real backend is never called)."""

    result: Any = None  # JSON the tool returns
    error: str = ""  # or: the tool fails with this (non-2xx), which the agent must cope with
    delay_ms: int = 0  # how long it takes (past the agent's hold_after_ms, the hold phrase is said)


@dataclass(frozen=True)
class ToolExpectation:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)  # each given argument has this value
    times: int = 1  # exactly this many calls (0: never)


@dataclass(frozen=True)
class Judge:
    rubric: str  # what an LLM judge (--judge-url) checks of the whole transcript


@dataclass(frozen=True)
class CallExpectation:
    outcome: str = ""  # the call's ended reason: agent_hangup | hangup | transferred | idle | voicemail ...
    transferred_to: str = ""  # with outcome transferred: the destination
    tools: tuple[ToolExpectation, ...] = ()
    max_talk_over_ms: int | None = None  # no stretch of reply heard over the caller lasts longer
    response_p50_ms: int | None = None  # caller's speech end -> reply audio, at the caller
    response_p95_ms: int | None = None
    judge: Judge | None = None


@dataclass(frozen=True)
class LlmCaller:
    """An open conversation: after the scripted turns, an LLM plays the caller and answers whatever the
    agent says, in character, towards its goal, for at most `max_turns` turns."""

    persona: str
    goal: str
    max_turns: int = 6
    voice: Voice | None = None


@dataclass(frozen=True)
class Scenario:
    path: Path
    name: str
    description: str = ""
    agent: str = ""  # the agent's name on the service ("" = its default agent)
    transport: str = ""  # webrtc | sip | carrier ("" = the command's --transport)
    seed: int = 0  # every random draw of the line (noise offset, loss, jitter) comes from it
    voice: Voice = Voice("piper", "joe")
    context: dict[str, str] = field(default_factory=dict)  # the call's context variables
    greeting: bool = True  # wait for the agent's greeting before the first turn
    line: Line = field(default_factory=Line)
    turns: tuple[Turn, ...] = ()
    llm_caller: LlmCaller | None = None
    tools: dict[str, ToolMock] = field(default_factory=dict)
    expect: CallExpectation = field(default_factory=CallExpectation)
    max_call_s: float = 120.0  # the runner hangs up and fails the scenario past this
