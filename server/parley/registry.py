"""The calls of this process: admission (capacity), lookup, and orderly ending."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sys
import traceback
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from parley.call import Call
from parley.log import event
from parley.pipeline.stages import StageRunner

log = logging.getLogger(__name__)

KEEP_ENDED = 200  # ended calls stay visible in /api/calls/<id> for a while
JOIN_TIMEOUT_S = 5.0  # a closed queue wakes its stage at once: a stage thread alive past this is stuck

Closer = Callable[[], Awaitable[None]]


class CallObserver(Protocol):
    """Hears of every call the registry adds and of every call that ended (e.g. call records).
    Called on the event loop; must not block."""

    def call_added(self, call: Call) -> None: ...

    def call_ended(self, call: Call) -> None: ...


@dataclass
class _Entry:
    call: Call
    close_transport: Closer
    holder: str = ""  # the source it counts against (--max-calls-per-source); "" for none


class CallRegistry:
    def __init__(self, max_calls: int, instance_tag: str = "") -> None:
        self.max_calls = max_calls
        # In every call id: a proxy in front of a fleet sends a call's requests to its instance by it.
        self._id_prefix = f"c-{instance_tag}-" if instance_tag else "c-"
        self._active: dict[str, _Entry] = {}
        self._ended: OrderedDict[str, Call] = OrderedDict()
        self._ending: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[bool]] = set()
        self._admitting = 0
        self._setting_up: dict[str, tuple[Call, str]] = {}
        self.closing = False  # set by end_all: no call is admitted any more
        self.observers: list[CallObserver] = []  # call records, call events
        self.stuck: list[tuple[str, StageRunner]] = []  # stage threads that did not stop with their call

    def new_call_id(self) -> str:
        return self._id_prefix + secrets.token_hex(6)

    def at_capacity(self) -> bool:
        return self.closing or len(self._active) + self._admitting >= self.max_calls

    def lines_held_by(self, holder: str) -> int:
        """Calls live or being set up that count against `holder` (a source)."""
        live = sum(entry.holder == holder for entry in self._active.values())
        return live + sum(held == holder for _, held in self._setting_up.values())

    @contextlib.contextmanager
    def setting_up(self, call: Call, holder: str = "") -> Iterator[None]:
        """Hold a line while a call is being set up (signaling awaits), so that concurrent setups
        cannot all pass the capacity check; meanwhile `get` finds the call (e.g. an outbound call ringing)."""
        self._admitting += 1
        self._setting_up[call.call_id] = (call, holder)
        try:
            yield
        finally:
            self._admitting -= 1
            self._setting_up.pop(call.call_id, None)

    def remember_ended(self, call: Call) -> None:
        """Keep an ended call visible to `get` (a call that never got past its setup, too)."""
        self._ended[call.call_id] = call
        while len(self._ended) > KEEP_ENDED:
            self._ended.popitem(last=False)
        self._tell(call, lambda observer: observer.call_ended(call))

    def add(self, call: Call, close_transport: Closer, holder: str = "") -> None:
        self._active[call.call_id] = _Entry(call, close_transport, holder)
        self._tell(call, lambda observer: observer.call_added(call))

    def _tell(self, call: Call, news: Callable[[CallObserver], None]) -> None:
        for observer in self.observers:
            try:
                news(observer)
            except Exception:
                log.exception("call_observer_failed", extra={"call_id": call.call_id})

    def get(self, call_id: str) -> Call | None:
        entry = self._active.get(call_id)
        if entry is not None:
            return entry.call
        setting_up = self._setting_up.get(call_id)
        return setting_up[0] if setting_up is not None else self._ended.get(call_id)

    def active(self) -> list[Call]:
        return [entry.call for entry in self._active.values()]

    async def end(self, call_id: str, reason: str) -> bool:
        """End a call: stop its threads, close its transport, wait for both. False if it is not active."""
        if call_id in self._ending:
            await asyncio.shield(self._ending[call_id])
            return True
        entry = self._active.get(call_id)
        if entry is None:
            return False
        task = asyncio.ensure_future(self._end(entry, reason))
        self._ending[call_id] = task
        try:
            await asyncio.shield(task)
        finally:
            self._ending.pop(call_id, None)
        return True

    async def _end(self, entry: _Entry, reason: str) -> None:
        call = entry.call
        call.end(reason)
        try:
            await entry.close_transport()
        except Exception:
            log.exception("transport_close_failed", extra={"call_id": call.call_id})
        joined = await asyncio.to_thread(call.join, JOIN_TIMEOUT_S)
        self._active.pop(call.call_id, None)
        self.remember_ended(call)
        if not joined:
            self._note_stuck(call)
        # Kept for /api/calls/<id> a while, the call must not keep its peer connection, audio and stage
        # state alive with it.
        call.release()

    def _note_stuck(self, call: Call) -> None:
        """A stage thread did not stop within the call's join (a model that never returns, a bug): Python
        cannot kill a thread, so its line is freed anyway, the thread is counted
        (`parley_stage_threads_stuck`) and logged with where it is stuck, and followed until it ends."""
        frames = sys._current_frames()
        for thread in call.stuck_threads():
            self.stuck.append((call.call_id, thread))
            frame = frames.get(thread.ident or 0)
            where = " < ".join(
                f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                for f in reversed(traceback.extract_stack(frame, limit=6) if frame is not None else [])
            )
            event(
                log,
                "stage_thread_stuck",
                logging.ERROR,
                call_id=call.call_id,
                stage_thread=thread.name,
                where=where,
            )

    def follow_stuck_threads(self) -> None:
        """Forget stuck threads that have ended since (each logged once)."""
        for call_id, thread in [entry for entry in self.stuck if not entry[1].is_alive()]:
            event(log, "stage_thread_recovered", call_id=call_id, stage_thread=thread.name)
        self.stuck = [entry for entry in self.stuck if entry[1].is_alive()]

    def end_soon(self, call_id: str, reason: str) -> None:
        """End a call from a callback that must not wait (e.g. inside the call's own transport task)."""
        task = asyncio.ensure_future(self.end(call_id, reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def end_all(self, reason: str) -> None:
        self.closing = True
        await asyncio.gather(*(self.end(call_id, reason) for call_id in list(self._active)))
