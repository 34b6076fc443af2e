"""Call events for a team's backend (`--events-url`): one outbox per process, off every media path.

Each event is POSTed as JSON `{"id", "type", "call_id", "at", "data"}`, signed when a secret is set.
Events of one call are delivered in order (the next waits for the previous); calls do not wait for each
other. A failed delivery is retried with backoff, keeping its `id`, so a receiver that deduplicates
sees each event once. A slow or dead receiver costs the calls nothing: publishing never blocks, and
the backlog is bounded (the oldest events of the longest backlog go first when it overflows).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp

from parley import metrics
from parley.agent.signing import HEADER, sign
from parley.call import Call
from parley.log import event
from parley.records.redaction import record_without_text, without_text

log = logging.getLogger(__name__)

BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 60.0, 60.0)
TIMEOUT_S = 10.0
MAX_PENDING = 10_000
CLOSE_GRACE_S = 5.0


class EventOutbox:
    def __init__(self, url: str, secret: str = "", *, backoff_s: tuple[float, ...] = BACKOFF_S) -> None:
        self.url = url
        self.secret = secret
        self.backoff_s = backoff_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._queues: dict[str, deque[dict[str, Any]]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._pending = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))

    def publish(self, call_id: str, kind: str, data: dict[str, Any]) -> None:
        """Queue an event (from any thread; never blocks)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        item = {"id": uuid.uuid4().hex, "type": kind, "call_id": call_id, "at": time.time(), "data": data}
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._enqueue(item)
        else:
            loop.call_soon_threadsafe(self._enqueue, item)

    def _enqueue(self, item: dict[str, Any]) -> None:
        if self._pending >= MAX_PENDING:
            longest = max(self._queues.values(), key=len)
            dropped = longest.popleft() if len(longest) > 1 else None
            if dropped is not None:
                self._pending -= 1
                metrics.EVENTS_TOTAL.labels(type=dropped["type"], outcome="dropped").inc()
        call_id = item["call_id"]
        self._queues.setdefault(call_id, deque()).append(item)
        self._pending += 1
        if call_id not in self._workers:
            self._workers[call_id] = asyncio.ensure_future(self._drain(call_id))

    async def _drain(self, call_id: str) -> None:
        queue = self._queues[call_id]
        try:
            while queue:
                item = queue[0]
                delivered = await self._deliver(item)
                if queue and queue[0] is item:
                    queue.popleft()
                    self._pending -= 1
                metrics.EVENTS_TOTAL.labels(
                    type=item["type"], outcome="delivered" if delivered else "failed"
                ).inc()
        finally:
            self._workers.pop(call_id, None)
            if not queue:
                self._queues.pop(call_id, None)

    async def _deliver(self, item: dict[str, Any]) -> bool:
        body = json.dumps(item).encode()
        for attempt, pause in enumerate((0.0, *self.backoff_s)):
            if pause:
                await asyncio.sleep(pause)
            headers = {"Content-Type": "application/json", "User-Agent": "parley"}
            if self.secret:
                headers[HEADER] = sign(body, self.secret)  # signed afresh: a retry's timestamp is current
            try:
                assert self._session is not None
                async with self._session.post(self.url, data=body, headers=headers) as response:
                    if 200 <= response.status < 300:
                        return True
                    failure = f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                failure = type(exc).__name__
            event(
                log,
                "event_delivery_retry",
                logging.WARNING if attempt == len(self.backoff_s) else logging.DEBUG,
                call_id=item["call_id"],
                type=item["type"],
                attempt=attempt + 1,
                failure=failure,
            )
        return False

    async def close(self) -> None:
        """Deliver what is queued for a few seconds more, then give up on the rest."""
        workers = list(self._workers.values())
        if workers:
            await asyncio.wait(workers, timeout=CLOSE_GRACE_S)
        for task in list(self._workers.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._session is not None:
            await self._session.close()


class CallEvents:
    """The registry's observer that turns calls starting and ending into `call.started` and
    `call.ended` (whose data is the call's record: the transcript as heard, the outcome, the tool calls,
    the latencies). Tools and transfers publish through the `publisher` each call is built with. With
    `--record-transcripts off` no event carries what was said, tool arguments or results, or variables
    (records/redaction.py)."""

    def __init__(self, outbox: EventOutbox) -> None:
        self.outbox = outbox

    def publisher(self, call_id: str, keep: bool) -> Callable[[str, dict[str, Any]], None]:
        """How a call publishes its own events (tool.called, call.transferred); `keep`: with what was said."""

        def publish(kind: str, data: dict[str, Any]) -> None:
            self.outbox.publish(call_id, kind, data if keep else without_text(data))

        return publish

    def call_added(self, call: Call) -> None:
        keep = call.settings.record_transcripts
        summary = call.summary()
        self.outbox.publish(call.call_id, "call.started", summary if keep else record_without_text(summary))

    def call_ended(self, call: Call) -> None:
        record = call.record()
        keep = call.settings.record_transcripts
        self.outbox.publish(call.call_id, "call.ended", record if keep else record_without_text(record))
