"""The calls of this process: admission (capacity), lookup, and orderly ending."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from parley.call import Call

log = logging.getLogger(__name__)

KEEP_ENDED = 200  # ended calls stay visible in /api/calls/<id> for a while

Closer = Callable[[], Awaitable[None]]


@dataclass
class _Entry:
    call: Call
    close_transport: Closer


class CallRegistry:
    def __init__(self, max_calls: int) -> None:
        self.max_calls = max_calls
        self._active: dict[str, _Entry] = {}
        self._ended: OrderedDict[str, Call] = OrderedDict()
        self._ending: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[bool]] = set()
        self._admitting = 0

    @staticmethod
    def new_call_id() -> str:
        return "c-" + secrets.token_hex(6)

    def at_capacity(self) -> bool:
        return len(self._active) + self._admitting >= self.max_calls

    @contextlib.contextmanager
    def admitting(self) -> Iterator[None]:
        """Hold a line while a call is being set up (signaling awaits), so that concurrent offers
        cannot all pass the capacity check."""
        self._admitting += 1
        try:
            yield
        finally:
            self._admitting -= 1

    def add(self, call: Call, close_transport: Closer) -> None:
        self._active[call.call_id] = _Entry(call, close_transport)

    def get(self, call_id: str) -> Call | None:
        entry = self._active.get(call_id)
        return entry.call if entry is not None else self._ended.get(call_id)

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
        await asyncio.to_thread(call.join)
        self._active.pop(call.call_id, None)
        self._ended[call.call_id] = call
        while len(self._ended) > KEEP_ENDED:
            self._ended.popitem(last=False)

    def end_soon(self, call_id: str, reason: str) -> None:
        """End a call from a callback that must not wait (e.g. inside the call's own transport task)."""
        task = asyncio.ensure_future(self.end(call_id, reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def end_all(self, reason: str) -> None:
        await asyncio.gather(*(self.end(call_id, reason) for call_id in list(self._active)))
