"""Call records in SQLite and in a real PostgreSQL (a throw-away cluster): written as the call goes,
read back through the API when the call is long gone, paged, kept without text on request, expired,
and migrated once by any number of instances. The calls run on test engines (no models)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from parley.app import create_app
from parley.call import Call
from parley.call_origin import Origin
from parley.config import Settings
from parley.records import BadCursor, CallRecords, open_records
from parley.records.database import Database, connect
from parley.records.schema import MIGRATIONS, migrate
from parley.records.store import CallInfo, RecordStore
from parley.runtime import Runtime
from parley.transports.base import HangUp, open_call
from tests.doubles import ToneTts, loud, make_engines, quiet

RATE = 16000
FRAME = 320
DAY = 86400.0


class Phone:
    """A transport that plays the agent's audio out at real pace (so replies are heard) and talks."""

    def __init__(self, call: Call, hang_up: HangUp) -> None:
        self.call = call
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._player = threading.Thread(target=self._play, daemon=True)
        self._player.start()

    def _play(self) -> None:
        while not self._stop.is_set():
            self.call.outbound.pull_frame()
            time.sleep(0.02)

    def deliver_event(self, payload: dict[str, Any]) -> None:
        self.events.append(payload)

    def audio_flushed(self) -> None:
        pass

    async def close(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._player.join)

    async def say(self, pcm: np.ndarray) -> None:
        for i in range(0, pcm.size, FRAME):
            self.call.push_audio(pcm[i : i + FRAME])
            await asyncio.sleep(0.02)

    async def wait_for(
        self, matches: Callable[[dict[str, Any]], bool], timeout: float = 15.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (found := next((e for e in self.events if matches(e)), None)) is None:
            assert time.monotonic() < deadline, f"not heard; events: {self.events}"
            await asyncio.sleep(0.01)
        return found

    async def wait(self, kind: str, timeout: float = 15.0, **match: Any) -> dict[str, Any]:
        return await self.wait_for(
            lambda e: e["type"] == kind and all(e.get(k) == v for k, v in match.items()), timeout
        )


async def phone(call: Call, hang_up: HangUp) -> Phone:
    return Phone(call, hang_up)


# Who the calls are between, as a SIP INVITE names them, and what its token set.
ALICE = Origin("sip:alice@example.com", "sip:agent@parley", token_context={"account": "A-17"})


async def written(records: CallRecords | None, timeout: float = 10.0) -> CallRecords:
    assert records is not None
    deadline = time.monotonic() + timeout
    while records.pending():
        assert time.monotonic() < deadline, "the records writer fell behind"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the last write taken off the queue is committed
    return records


def settings_for(database: tuple[str, Path], **overrides: Any) -> Settings:
    url, folder = database
    base: dict[str, Any] = {
        "greeting": "Hello there.",
        "sip": "off",
        "end_of_turn_ms": 300,
        "reopen_grace_ms": 300,
        "database": url,
        "data_dir": str(folder),
    }
    return Settings(**{**base, **overrides})


def open_db(database: tuple[str, Path]) -> Database:
    return connect(database[0], database[1])


async def test_a_call_is_recorded_as_it_goes_and_read_back_when_it_is_over(
    database: tuple[str, Path],
) -> None:
    tts = ToneTts(seconds_per_word=0.05)
    runtime = Runtime(settings_for(database), make_engines(tts=tts))
    await runtime.open_records()
    try:
        call, line = await open_call(runtime, "sip", RATE, phone, origin=ALICE)
        await line.wait("agent_done", turn_id="greeting")

        tts.seconds_per_word = 0.4  # a long reply, to talk over
        await line.say(np.concatenate([loud(800), quiet(400)]))
        first = await line.wait("user_transcript")
        await line.wait("agent_text", turn_id=first["turn_id"])
        await asyncio.sleep(0.3)
        tts.seconds_per_word = 0.05
        await line.say(np.concatenate([loud(1000), quiet(500)]))
        cut = await line.wait("agent_done", turn_id=first["turn_id"], interrupted=True)
        second = await line.wait_for(
            lambda e: e["type"] == "user_transcript" and e["turn_id"] != first["turn_id"]
        )
        await line.wait("agent_done", turn_id=second["turn_id"], interrupted=False)

        records = await written(runtime.records)
        live = await asyncio.to_thread(records.get, call.call_id)
        assert live is not None and live["state"] == "active"
        assert [t["user"] for t in live["transcript"] if t["turn_id"] != "greeting"][:2] == [
            "hello there"
        ] * 2

        call.dtmf_received("7")
        call.dtmf_received("#")
        keys = await line.wait("user_transcript", keypad=True)
        await line.wait("agent_done", turn_id=keys["turn_id"])
        assert await runtime.registry.end(call.call_id, "hangup")

        record = await asyncio.to_thread((await written(runtime.records)).get, call.call_id)
    finally:
        await runtime.close()
    assert record is not None
    assert record["state"] == "ended" and record["ended_reason"] == "hangup" and record["transport"] == "sip"
    assert record["caller"] == "sip:alice@example.com" and record["context"] == {"account": "A-17"}
    assert record["duration_s"] > 0 and record["barge_ins"] == 1 and record["turns"] == 3
    turns = {t["turn_id"]: t for t in record["transcript"]}
    assert next(iter(turns)) == "greeting" and turns["greeting"]["agent"] == "Hello there."
    interrupted = turns[first["turn_id"]]
    assert interrupted["interrupted"] and interrupted["agent"] == cut["text"]
    assert "Anything else" not in interrupted["agent"]  # only what was heard
    answered = turns[second["turn_id"]]
    assert answered["agent_state"] == "committed" and "weather" in answered["agent"]
    assert answered["response_s"] is not None and answered["stt_s"] is not None
    assert answered["revisions"] and answered["revisions"][-1]["text"] == "hello there"
    assert turns[keys["turn_id"]]["user"] == "[DTMF 7#]" and turns[keys["turn_id"]]["keypad"]
    assert [d["digit"] for d in record["dtmf"]] == ["7", "#"]
    assert [i["by"] for i in record["interruptions"]] == ["speech"]


async def test_without_transcripts_a_record_keeps_no_text(database: tuple[str, Path]) -> None:
    runtime = Runtime(settings_for(database, record_transcripts=False), make_engines())
    await runtime.open_records()
    try:
        call, line = await open_call(runtime, "webrtc", RATE, phone, origin=ALICE)
        await line.say(np.concatenate([loud(800), quiet(500)]))
        said = await line.wait("user_transcript")
        await line.wait("agent_done", turn_id=said["turn_id"])
        call.dtmf_received("4")
        await runtime.registry.end(call.call_id, "hangup")
        record = await asyncio.to_thread((await written(runtime.records)).get, call.call_id)
    finally:
        await runtime.close()
    assert record is not None and record["turns"] == 1 and record["context"] == {}
    assert all(t["user"] is None and t["agent"] is None for t in record["transcript"])
    assert record["dtmf"] == [{"at": record["dtmf"][0]["at"], "digit": None}]
    assert not any("text" in e or "digit" in e for e in record["events"])
    assert record["transcript"][-1]["response_s"] is not None  # what happened and when is kept


def test_without_transcripts_no_tool_data_or_heard_words_are_kept_and_numbers_are_masked(
    database: tuple[str, Path],
) -> None:
    store = RecordStore(open_db(database), keep_text=False)
    try:
        migrate(store.db)
        info = CallInfo("c-private", "sip", 1000.0, "sip:+15551234567@trunk", "tel:+15557654321", {"a": "b"})
        store.call_started(info, 1000.0)
        events = [
            {"type": "tool_call", "turn_id": "t1", "name": "lookup", "arguments": '{"card": "4111"}'},
            {
                "type": "tool_result",
                "turn_id": "t1",
                "name": "lookup",
                "arguments": "{}",
                "result": "ok 4111",
            },
            {"type": "agent_resumed", "heard": "your card 4111"},
            {"type": "dtmf", "digit": "4"},
        ]
        for seq, payload in enumerate(events):
            store.call_event("c-private", seq, 1001.0 + seq, payload)
        store.call_ended(info, 1010.0, "hangup", [])
        record = store.get("c-private")
    finally:
        store.db.close()
    assert record is not None and "4111" not in json.dumps(record) and record["context"] == {}
    assert [e["type"] for e in record["events"]] == ["tool_call", "tool_result", "agent_resumed", "dtmf"]
    assert record["caller"] == "sip:+********567@trunk" and record["called"] == "tel:+********321"


def _store_call(store: RecordStore, call_id: str, started: float, ended: float | None) -> None:
    info = CallInfo(call_id, "webrtc", started)
    store.call_started(info, started)
    store.call_event(
        call_id, 0, started + 1, {"type": "user_transcript", "turn_id": f"{call_id}:t1", "text": "hi"}
    )
    if ended is not None:
        store.call_ended(info, ended, "hangup", [])


async def test_ended_calls_are_paged_through_the_api_from_any_instance(database: tuple[str, Path]) -> None:
    now = time.time()
    store = RecordStore(open_db(database), instance="another-pod")
    migrate(store.db)
    for n in range(7):
        _store_call(store, f"c-{n:02d}", now - 100 + n, now - 50 + n)
    _store_call(store, "c-live", now - 10, None)
    store.db.close()

    client = TestClient(TestServer(create_app(settings_for(database), engines=make_engines())))
    await client.start_server()
    try:
        seen: list[str] = []
        cursor = ""
        for _ in range(4):
            response = await client.get(
                "/api/calls", params={"state": "ended", "limit": "3", "cursor": cursor}
            )
            assert response.status == 200
            page = await response.json()
            seen += [c["id"] for c in page["calls"]]
            assert all(c["state"] == "ended" and c["instance"] == "another-pod" for c in page["calls"])
            if page["next"] is None:
                break
            cursor = page["next"]
        assert seen == [f"c-{n:02d}" for n in reversed(range(7))]

        stored = await client.get("/api/calls/c-03")  # never in this instance's memory
        assert stored.status == 200
        body = await stored.json()
        assert body["ended_reason"] == "hangup" and body["transcript"][0]["user"] == "hi"
        assert (await client.get("/api/calls/c-nothere")).status == 404
        assert (await client.get("/api/calls", params={"state": "ended", "cursor": "x!"})).status == 400
        assert (await client.get("/api/calls", params={"state": "later"})).status == 400
        assert await (await client.get("/api/calls")).json() == []  # active calls: none here
    finally:
        await client.close()


async def test_records_expire_and_a_crashed_instance_s_calls_are_closed(database: tuple[str, Path]) -> None:
    now = time.time()
    store = RecordStore(open_db(database), instance="pod-a")
    migrate(store.db)
    _store_call(store, "c-old", now - 40 * DAY, now - 40 * DAY + 60)
    _store_call(store, "c-lost-old", now - 40 * DAY, None)  # pod-a died during this call, long ago
    _store_call(store, "c-lost", now - 600, None)  # ... and during this one, lately
    _store_call(store, "c-recent", now - 3 * DAY, now - 3 * DAY + 60)
    store.db.close()

    url, folder = database
    records = CallRecords(lambda: connect(url, folder), retention_days=30, instance="pod-a")
    await asyncio.to_thread(records.start)
    try:
        page, _ = await asyncio.to_thread(records.list_ended, 10)
    finally:
        await asyncio.to_thread(records.close)
    assert {c["id"]: c["ended_reason"] for c in page} == {"c-lost": "lost", "c-recent": "hangup"}


def test_the_calls_of_an_instance_gone_silent_are_closed_as_crashed_by_another(
    database: tuple[str, Path],
) -> None:
    # pod-a was killed (SIGKILL: no shutdown ran) during two calls; pod-b, alive, notices it has not been
    # heard from and closes them. A live instance's calls are left alone, and so are the ones that ended.
    now = time.time()
    dead, alive = (
        RecordStore(open_db(database), instance="pod-a"),
        RecordStore(open_db(database), instance="pod-b"),
    )
    other = RecordStore(open_db(database), instance="pod-c")
    migrate(dead.db)
    dead.heartbeat(now - 60)
    other.heartbeat(now - 2)
    _store_call(dead, "c-1", now - 120, None)
    _store_call(dead, "c-2", now - 90, None)
    _store_call(dead, "c-done", now - 300, now - 200)
    _store_call(other, "c-live", now - 30, None)
    try:
        closed = alive.close_crashed(now, silent_s=15)
        assert sorted(closed) == [("pod-a", "c-1"), ("pod-a", "c-2")]
        assert alive.close_crashed(now, silent_s=15) == []  # once
        records = {c: alive.get(c) for c in ("c-1", "c-2", "c-done", "c-live")}
        assert {c: r["ended_reason"] if r else None for c, r in records.items()} == {
            "c-1": "crashed",
            "c-2": "crashed",
            "c-done": "hangup",
            "c-live": None,
        }
        # The fleet's live calls: those of instances heard from lately (pod-c's), none of the dead one's.
        assert [c["id"] for c in alive.list_live(now, silent_s=15)] == ["c-live"]
        other.leave()  # a clean stop: no longer watched
        assert other.db.rows("SELECT instance FROM instances ORDER BY instance") == [("pod-a",)]
    finally:
        for store in (dead, alive, other):
            store.db.close()


def test_migrations_are_numbered_and_applied_once_by_many_instances(database: tuple[str, Path]) -> None:
    versions: list[int] = []
    errors: list[BaseException] = []

    def instance() -> None:
        db = open_db(database)
        try:
            versions.append(migrate(db))
        except BaseException as exc:
            errors.append(exc)
        finally:
            db.close()

    threads = [threading.Thread(target=instance) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    latest = MIGRATIONS[-1].version
    assert not errors and versions == [latest] * 4
    db = open_db(database)
    try:
        assert db.rows("SELECT version FROM schema_version ORDER BY version") == [
            (m.version,) for m in MIGRATIONS
        ]
        assert migrate(db) == latest
    finally:
        db.close()


def test_a_bad_cursor_is_refused(tmp_path: Path) -> None:
    records = open_records(Settings(data_dir=str(tmp_path), sip="off"))
    assert records is not None
    records.start()
    try:
        with pytest.raises(BadCursor):
            records.list_ended(5, "bm90IGpzb24")
    finally:
        records.close()
    assert open_records(Settings(database="off")) is None
