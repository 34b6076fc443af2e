"""Callers who go quiet: the agent asks whether they are still there, then says goodbye and hangs up.

When a call has been `listening` (the agent has finished speaking and the caller says nothing) for its
agent's `idle_prompt_after_s`, the agent says its `idle_prompt`; after `idle_prompts` of those, its
`idle_closing`, and once the caller has heard that line the call ends with outcome `idle` (a closing the
caller cuts by speaking leaves the call up). Speech or a keypad press from the caller starts the count
again. Each line goes into the call's history under a key of its own (`idle-1`, `idle-2`, ...): the
model sees that it asked.

`IdleCaller` decides for one call, from what it hears (the call's state and the caller's activity) and
the time it is given. `IdlePrompts` watches every call the registry adds through its signals, is ticked
by the process's watchdog (watchdog.py: one clock over every call, no thread or timer per call), and
speaks through the call's replies.

The lines are the agent speaking: the call leaves `listening` while they play, which starts this wait
and the watchdog's `--max-silence-s` clock again. So when `idle_prompt_after_s` is shorter than
`--max-silence-s` the prompts run their course and end a silent call as `idle`; when they are off, or
wait as long or longer, the silence limit ends it first (outcome `silence`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from parley import metrics
from parley.agent.agentfile import Agent
from parley.agent.variables import Variables, spoken
from parley.call_signals import CallSignals
from parley.log import event

log = logging.getLogger(__name__)

IdleLine = Literal["prompt", "closing"]
IDLE_OUTCOME = "idle"
# What says the caller is there: the turn-taker heard speech (over the agent, too) or keys were pressed.
CALLER_ACTIVITY = frozenset({"dtmf", "user_transcript", "agent_paused"})


@dataclass(frozen=True)
class IdlePolicy:
    """An agent's idle prompting: `after_s` of silence before each line, `prompts` prompts, a closing."""

    after_s: float
    prompts: int
    prompt: str  # templates over the call's variables
    closing: str

    @classmethod
    def of(cls, agent: Agent, default_after_s: float) -> IdlePolicy | None:
        """The agent's policy (its own `idle_prompt_after_s`, else the service's); None when off."""
        after_s = default_after_s if agent.idle_prompt_after_s is None else agent.idle_prompt_after_s
        if after_s <= 0:
            return None
        return cls(after_s, agent.idle_prompts, agent.idle_prompt, agent.idle_closing)


class IdleCaller:
    """One call's silence count: what it hears in, the line due out. Not thread-safe (IdlePrompts
    locks around it)."""

    def __init__(self, policy: IdlePolicy, listening_since: float | None) -> None:
        self.policy = policy
        self.prompted = 0  # prompts since the caller last did something
        self.lines = 0  # lines said in the whole call (their history keys)
        self.closing = False  # the closing line was said: nothing more is due
        self._listening_since = listening_since

    def heard(self, payload: dict[str, Any], now: float) -> None:
        """One of the call's events, heard at `now` (monotonic)."""
        kind = payload.get("type")
        if kind == "state":
            state = payload.get("state")
            self._listening_since = now if state == "listening" else None
            if state == "user_speaking":
                self._caller_acted()
        elif kind in CALLER_ACTIVITY:
            self._caller_acted()

    def due(self, now: float) -> IdleLine | None:
        """The line to say now, if one is due (counted as said)."""
        since = self._listening_since
        if self.closing or since is None or now - since < self.policy.after_s:
            return None
        # Waiting starts again from here: a line that never plays (the call is ending) is not said on
        # every tick. One that plays moves the call out of `listening`, and the wait restarts after it.
        self._listening_since = now
        self.lines += 1
        if self.prompted < self.policy.prompts:
            self.prompted += 1
            return "prompt"
        self.closing = True
        return "closing"

    def _caller_acted(self) -> None:
        self.prompted = 0
        self.closing = False  # the caller spoke over the closing: it was cut, and the call goes on


class IdleSpeaker(Protocol):
    """What the idle prompts say through (replies.py's Replies)."""

    def say(self, text: str, *, key: str | None = None, then_hang_up: str = "") -> None: ...


class IdleCallParts(Protocol):
    """What the idle prompts need of a call (call.py's Call)."""

    @property
    def call_id(self) -> str: ...

    @property
    def agent(self) -> Agent: ...

    @property
    def signals(self) -> CallSignals: ...

    @property
    def replies(self) -> IdleSpeaker: ...

    def variables(self) -> Variables: ...


@dataclass(frozen=True)
class _Watched:
    call: IdleCallParts
    caller: IdleCaller
    unwatch: Callable[[], None]


class IdlePrompts:
    """The process's idle prompting: a registry observer (event loop), ticked by the watchdog."""

    def __init__(self, default_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.default_after_s = default_after_s
        self._clock = clock
        self._lock = threading.Lock()  # events come from the calls' threads, ticks from the event loop
        self._calls: dict[str, _Watched] = {}

    # the registry's observer

    def call_added(self, call: IdleCallParts) -> None:
        policy = IdlePolicy.of(call.agent, self.default_after_s)
        if policy is None:
            return
        call_id = call.call_id
        unwatch = call.signals.watch(lambda payload: self._heard(call_id, payload))
        with self._lock:
            # The state is read once watching: a change before this is in it, one after is heard.
            listening = call.signals.state == "listening"
            caller = IdleCaller(policy, self._clock() if listening else None)
            self._calls[call_id] = _Watched(call, caller, unwatch)

    def call_ended(self, call: IdleCallParts) -> None:
        with self._lock:
            watched = self._calls.pop(call.call_id, None)
        if watched is not None:
            watched.unwatch()

    def _heard(self, call_id: str, payload: dict[str, Any]) -> None:
        """A call's event, from any of its threads: kept short (the lock, a few fields)."""
        now = self._clock()
        with self._lock:
            watched = self._calls.get(call_id)
            if watched is not None:
                watched.caller.heard(payload, now)

    # the watchdog's clock (event loop)

    def tick(self, now: float) -> None:
        """Say the lines due at `now` (monotonic). A call whose line fails is logged; the others go on."""
        with self._lock:
            due = [(w.call, w.caller.due(now), w.caller.lines) for w in self._calls.values()]
        for call, line, number in due:
            if line is None:
                continue
            try:
                self._say(call, line, number)
            except Exception:
                log.exception("idle_prompt_failed", extra={"call_id": call.call_id})

    def _say(self, call: IdleCallParts, line: IdleLine, number: int) -> None:
        agent = call.agent
        template = agent.idle_prompt if line == "prompt" else agent.idle_closing
        text = spoken(template, call.variables())
        event(log, "idle_caller", call_id=call.call_id, line=line, number=number)
        metrics.IDLE_PROMPTS_TOTAL.labels(type=line).inc()
        call.replies.say(text, key=f"idle-{number}", then_hang_up=IDLE_OUTCOME if line == "closing" else "")
