"""Calls that must end by themselves: too long (`--max-call-s`), or nobody spoke (`--max-silence-s`).

A line held by a caller who walked away (a phone left off the hook, a tab left open with the microphone
muted) is a line no one else can use. The watchdog hears each call's state (the registry tells it of
every call, like the call records) and, twice a second, ends the calls past a limit through the registry,
as any hang-up: the transport closes its side (SIP sends BYE, a carrier stream closes), the outcome
(`max_duration`, `silence`) goes into the call's record and `parley_calls_total`.

Silence is time spent in the `listening` state: not while the caller speaks, the agent thinks or talks,
or keys are pressed. Before the media connects a call is `starting`; the transport's own connect timeout
ends those.

Parts that act on calls in time without ending them tick on the same clock (`clocked`: the idle prompts,
idle.py), so no call needs a thread or timer of its own. An idle prompt is the agent talking: it starts
the silence count again, so prompts shorter than `--max-silence-s` end a quiet call first (as `idle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from parley.call import Call
from parley.log import event
from parley.registry import CallRegistry

log = logging.getLogger(__name__)

TICK_S = 0.5
ACTIVITY_EVENTS = frozenset({"dtmf", "agent_paused", "user_transcript"})


class Clocked(Protocol):
    """A part that acts on the calls on the watchdog's clock (on the event loop; must not block)."""

    def tick(self, now: float) -> None: ...


class CallWatchdog:
    def __init__(
        self,
        registry: CallRegistry,
        max_call_s: float,
        max_silence_s: float,
        clocked: Sequence[Clocked] = (),
    ) -> None:
        self.registry = registry
        self.max_call_s = max_call_s
        self.max_silence_s = max_silence_s
        self.clocked = tuple(clocked)
        self._lock = threading.Lock()
        self._quiet_since: dict[str, float | None] = {}  # call id -> since when it is `listening`
        self._unwatch: dict[str, Callable[[], None]] = {}
        self._ending: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    # the registry's observer (event loop)

    def call_added(self, call: Call) -> None:
        call_id = call.call_id
        with self._lock:
            self._quiet_since[call_id] = time.monotonic() if call.state == "listening" else None
        self._unwatch[call_id] = call.watch(lambda payload: self._heard(call_id, payload))

    def call_ended(self, call: Call) -> None:
        unwatch = self._unwatch.pop(call.call_id, None)
        if unwatch is not None:
            unwatch()
        with self._lock:
            self._quiet_since.pop(call.call_id, None)
        self._ending.discard(call.call_id)

    def _heard(self, call_id: str, payload: dict[str, Any]) -> None:
        """A call's event, from any of its threads."""
        kind = payload.get("type")
        if kind != "state" and kind not in ACTIVITY_EVENTS:
            return
        now = time.monotonic()
        with self._lock:
            if call_id not in self._quiet_since:
                return  # ended meanwhile
            if kind == "state":
                self._quiet_since[call_id] = now if payload.get("state") == "listening" else None
            elif self._quiet_since[call_id] is not None:
                self._quiet_since[call_id] = now

    # the clock

    def start(self) -> None:
        if self._task is None and (self.max_call_s > 0 or self.max_silence_s > 0 or self.clocked):
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick(time.monotonic(), time.time())
            except Exception:
                log.exception("watchdog_failed")

    def tick(self, now: float, wall: float) -> None:
        """End the calls past a limit (`now` monotonic, `wall` the epoch clock calls start on)."""
        for call in self.registry.active():
            call_id = call.call_id
            if call.ended or call_id in self._ending:
                continue
            with self._lock:
                since = self._quiet_since.get(call_id)
            if self.max_call_s > 0 and wall - call.started_at >= self.max_call_s:
                self._end(call, "max_duration", call_s=round(wall - call.started_at, 1))
            elif self.max_silence_s > 0 and since is not None and now - since >= self.max_silence_s:
                self._end(call, "silence", silent_s=round(now - since, 1))
        for part in self.clocked:
            try:
                part.tick(now)
            except Exception:
                log.exception("watchdog_part_failed")
        self.registry.follow_stuck_threads()

    def _end(self, call: Call, reason: str, **fields: Any) -> None:
        self._ending.add(call.call_id)
        event(log, "call_limit_reached", call_id=call.call_id, reason=reason, **fields)
        self.registry.end_soon(call.call_id, reason)
