"""Call records, kept off the media path.

The registry tells `CallRecords` when a call is added and when it has ended; in between the recorder
watches the call's events (`Call.watch`, the same events the page gets). Every one becomes a write,
queued (bounded) for one writer thread: a thread of the call never waits for the database, and when the
database falls behind, events are dropped and counted rather than piling up in memory.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from parley import metrics
from parley.call import Call
from parley.log import event
from parley.queue_worker import QueueWorker
from parley.records.database import Database, DatabaseError, Reconnecting
from parley.records.schema import migrate
from parley.records.store import AfterCall, CallInfo, RecordStore

log = logging.getLogger(__name__)

QUEUE_SIZE = 10_000  # events; at ~10 events per turn, minutes of every call's events
PURGE_EVERY_S = 3600.0  # records past --retention-days go at start, then this often
IDLE_WAKE_S = 5.0  # the writer wakes this often without writes, to beat and purge on time
# Each instance says it is alive this often; one silent for FLEET_SILENT_S (three beats missed: killed,
# or its host gone) has its open calls closed as `crashed` by whichever instance notices first.
FLEET_BEAT_S = 5.0
FLEET_SILENT_S = 15.0
RECONNECT_AFTER_S = 1.0
STOP_TIMEOUT_S = 10.0

T = TypeVar("T")
Write = Callable[[RecordStore], None]
Connect = Callable[[], Database]


def _info(call: Call) -> CallInfo:
    return CallInfo(
        call.call_id,
        call.transport,
        call.started_at,
        call.origin.caller,
        call.origin.called,
        dict(call.origin.values),
    )


class CallRecords:
    def __init__(
        self,
        connect: Connect,
        *,
        keep_text: bool = True,
        retention_days: float = 0.0,
        instance: str = "",
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._connect = connect
        self.keep_text = keep_text
        self.retention_s = retention_days * 86400.0
        self.instance = instance or socket.gethostname()
        self._watching: dict[str, tuple[Callable[[], None], Iterator[int]]] = {}
        self._writer: RecordStore | None = None
        self._reader: Reconnecting[RecordStore] = Reconnecting(self._store, _close_store)
        self._worker: QueueWorker[Write] = QueueWorker(
            "records-writer",
            self._write,
            maxsize=queue_size,
            wake_s=IDLE_WAKE_S,
            periodic=self._housekeeping,
        )
        self._next_purge = 0.0
        self._next_beat = 0.0
        self._failures = 0

    # lifecycle (blocking: from asyncio, run them in a thread)

    def start(self) -> None:
        """Connect, migrate the schema, close what a previous run of this instance left open, purge."""
        writer = self._store()
        version = migrate(writer.db)
        lost = writer.close_lost()
        self._writer = writer
        self._purge_if_due()
        self._watch_fleet_if_due()
        metrics.QUEUE_DEPTH.labels(stage="records").set_function(self._worker.pending)
        self._worker.start()
        event(log, "records_open", database=writer.db.kind, schema=version, closed_lost=lost)

    def close(self) -> None:
        """Write what is queued, then stop (waits up to STOP_TIMEOUT_S)."""
        for unwatch, _ in list(self._watching.values()):
            unwatch()
        self._watching.clear()
        self._worker.close(STOP_TIMEOUT_S)
        if self._writer is not None:
            with contextlib.suppress(DatabaseError):
                self._writer.leave()
            self._writer.db.close()
        self._writer = None
        self._reader.close()

    # the registry's observer (any thread; never blocks)

    def call_added(self, call: Call) -> None:
        info, at = _info(call), time.time()
        numbers = itertools.count()
        call_id = call.call_id

        def on_event(payload: dict[str, Any]) -> None:
            seq, now = next(numbers), time.time()
            self._put(lambda store: store.call_event(call_id, seq, now, payload))

        self._put(lambda store: store.call_started(info, at))
        self._watching[call_id] = (call.watch(on_event), numbers)

    def call_ended(self, call: Call) -> None:
        watching = self._watching.pop(call.call_id, None)
        if watching is not None:
            watching[0]()
        info, at = _info(call), time.time()
        outcome = call.end_reason or "hangup"
        turns = call.conversation.snapshot()
        self._put(lambda store: store.call_ended(info, at, outcome, turns))

    def keep_after(self, call_id: str, name: AfterCall, value: Any) -> None:
        """What became known of a call after its turns (an answering-machine verdict, where its recording
        is, its analysis): kept with its record. Never blocks."""
        self._put(lambda store: store.set_after(call_id, name, value))

    # reading (blocking; the API runs these in a thread)

    def list_ended(self, limit: int, cursor: str = "") -> tuple[list[dict[str, Any]], str | None]:
        return self._read(lambda store: store.list_ended(limit, cursor))

    def list_live(self) -> list[dict[str, Any]]:
        """Every live instance's calls in progress, as the records have them."""
        return self._read(lambda store: store.list_live(time.time(), FLEET_SILENT_S))

    def get(self, call_id: str) -> dict[str, Any] | None:
        return self._read(lambda store: store.get(call_id))

    def pending(self) -> int:
        return self._worker.pending()

    # internals

    def _store(self) -> RecordStore:
        return RecordStore(self._connect(), keep_text=self.keep_text, instance=self.instance)

    def _put(self, write: Write) -> None:
        if not self._worker.offer(write):
            metrics.RECORD_EVENTS_DROPPED_TOTAL.labels(reason="queue_full").inc()

    def _read(self, query: Callable[[RecordStore], T]) -> T:
        return self._reader.run(query)

    def _housekeeping(self) -> None:
        self._purge_if_due()
        self._watch_fleet_if_due()

    def _write(self, write: Write) -> None:
        try:
            if self._writer is None:
                self._writer = self._store()
            write(self._writer)
            self._failures = 0
        except DatabaseError as exc:
            metrics.RECORD_EVENTS_DROPPED_TOTAL.labels(reason="write_failed").inc()
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                event(log, "record_write_failed", logging.WARNING, error=str(exc), failures=self._failures)
            if self._writer is not None:  # reconnect for the next write (PostgreSQL restarted, ...)
                self._writer.db.close()
                self._writer = None
            time.sleep(RECONNECT_AFTER_S)

    def _watch_fleet_if_due(self) -> None:
        """Say this instance is alive, and close the calls of instances that went silent."""
        now = time.time()
        if now < self._next_beat or self._writer is None:
            return
        self._next_beat = now + FLEET_BEAT_S
        try:
            self._writer.heartbeat(now)
            crashed = self._writer.close_crashed(now, FLEET_SILENT_S)
        except DatabaseError as exc:
            event(log, "records_heartbeat_failed", logging.WARNING, error=str(exc))
            return
        for instance in sorted({instance for instance, _ in crashed}):
            calls = [call_id for gone, call_id in crashed if gone == instance]
            event(log, "calls_closed_crashed", logging.WARNING, instance=instance, calls=len(calls))

    def _purge_if_due(self) -> None:
        now = time.time()
        if self.retention_s <= 0 or now < self._next_purge or self._writer is None:
            return
        self._next_purge = now + PURGE_EVERY_S
        try:
            deleted = self._writer.purge(now - self.retention_s)
        except DatabaseError as exc:
            event(log, "records_purge_failed", logging.WARNING, error=str(exc))
            return
        if deleted:
            event(log, "records_purged", calls=deleted, retention_days=self.retention_s / 86400)


def _close_store(store: RecordStore) -> None:
    store.db.close()
