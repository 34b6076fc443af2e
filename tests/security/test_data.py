"""What parley keeps of a call, and who may read it (issue 42, items 15 and 16): with
`--record-transcripts off` no words, digits, tool arguments or results are kept or sent and the
parties' numbers are masked; numbers are masked in the logs; the records file is its owner's alone;
records past the retention go; and a call token opens one call across a fleet sharing PostgreSQL.
Each over a real call (a SIP INVITE with speech, a WebRTC offer) against a running service."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from parley.access import CallTokens
from parley.app import RUNTIME
from parley.engines.toolcalls import ToolCall
from parley.log import CallContext, KeyValueFormatter
from parley.records import recorder
from parley.records.database import connect
from parley.records.schema import migrate
from parley.records.store import CallInfo, RecordStore
from tests import postgres
from tests.doubles import ScriptedLlm, ScriptedStt, make_engines
from tests.robustness.test_defects import offer_sdp
from tests.security.agent_calls import Backend, answered_call, hang_up, speak
from tests.security.conftest import Service, Start, eventually

NUMBER = "+15551234567"
SPOKEN = "my card number is SPOKEN-9921, order 4417"
ARGUMENT = "ARG-4417"  # a number the caller said: the reply guard asks again for a call with one nobody said
RESULT = "RESULT-7731"
REPLY = "Your order ZEBRA-REPLY has shipped."
SECRET = "call-token-secret-0123456789"
DAY = 86400.0

AGENT = """
system_prompt = "You take orders."
greeting = ""

[[tools]]
name = "lookup_order"
description = "Look up an order"
url = "BACKEND/tool"
side_effects = false
parameters = { type = "object", properties = { number = { type = "string" } }, required = ["number"] }
"""


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    found = Backend({"secret": RESULT})
    yield found
    await found.close()


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """The service's log lines at info, as `parley serve` writes them (its filter, its format)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(KeyValueFormatter())
    handler.addFilter(CallContext())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield out
    root.removeHandler(handler)
    root.setLevel(level)


def everything_in(path: Path) -> str:
    """Every row of every table of a SQLite file, as text."""
    db = sqlite3.connect(path)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for table in tables for row in db.execute(f"SELECT * FROM {table}"))
    finally:
        db.close()


async def records_written(service: Service) -> None:
    records = service.client.app[RUNTIME].records
    assert records is not None

    async def drained() -> bool:
        return records.pending() == 0

    await eventually(drained, 10.0, "the records writer caught up")
    await asyncio.sleep(0.2)  # the write taken off the queue last is committed


async def test_with_record_transcripts_off_no_words_digits_tool_data_or_numbers_are_kept_or_sent(
    start: Start, backend: Backend, logs: io.StringIO, tmp_path: Path
) -> None:
    url = await backend.start()
    agent = tmp_path / "agent.toml"
    agent.write_text(AGENT.replace("BACKEND", url))
    llm = ScriptedLlm(script=[[ToolCall("t1", "lookup_order", json.dumps({"number": ARGUMENT}))], [REPLY]])
    stt = ScriptedStt(lambda seconds: SPOKEN if seconds > 0.25 else "")
    service = await start(
        agent=(str(agent),),
        engines=make_engines(llm=llm, stt=stt),
        record_transcripts=False,
        data_dir=str(tmp_path / "records"),
        events_url=f"{url}/events",
        end_of_turn_ms=300,
        reopen_grace_ms=300,
    )
    wire, dialogue, rtp, port = await answered_call(service, caller_user=NUMBER)
    await speak(rtp, port)

    async def replied() -> bool:
        return len(llm.prompts) >= 2 and bool(backend.requests)

    await eventually(replied, 10.0, "the tool ran and the model answered with its result")
    info = dialogue.request(
        "INFO", body="Signal=7\r\nDuration=160\r\n", content_type="application/dtmf-relay"
    )
    wire.send(info)
    assert (await wire.final(method="INFO", call_id=dialogue.call_id, timeout=5.0)).status == 200
    await asyncio.sleep(0.5)  # the keypad turn is answered
    await hang_up(wire, dialogue)

    async def ended_sent() -> bool:
        return any(e["type"] == "call.ended" for e in backend.events)

    await eventually(ended_sent, 10.0, "call.ended was delivered")
    await records_written(service)

    stored = everything_in(tmp_path / "records" / "calls.sqlite3")
    sent = json.dumps(backend.events)
    for secret in ("SPOKEN-9921", ARGUMENT, RESULT, "ZEBRA-REPLY", NUMBER.lstrip("+"), "[DTMF"):
        assert secret not in stored, secret
        assert secret not in sent, secret
    db = sqlite3.connect(tmp_path / "records" / "calls.sqlite3")
    try:
        (caller,) = db.execute("SELECT caller FROM calls").fetchone()
        kinds = {kind: json.loads(data) for kind, data in db.execute("SELECT type, data FROM call_events")}
        texts = db.execute("SELECT user_text, agent_text FROM turns").fetchall()
    finally:
        db.close()
    assert caller.startswith("sip:+********567@")  # who called, to the last digits
    assert {"tool_call", "tool_result", "dtmf", "user_transcript"} <= set(kinds)  # what happened is kept
    assert kinds["dtmf"].keys() == {"type"} and "name" in kinds["tool_result"]
    assert texts and all(t == (None, None) for t in texts)
    ended = next(e for e in backend.events if e["type"] == "call.ended")["data"]
    assert (
        ended["caller"].startswith("sip:+********567@") and ended["tool_calls"][0]["name"] == "lookup_order"
    )

    logged = logs.getvalue()
    assert "sip_answered" in logged and NUMBER not in logged and "+********567@" in logged
    await service.still_serves()


async def test_the_records_file_and_its_folder_are_their_owner_s_alone(start: Start, tmp_path: Path) -> None:
    previous = os.umask(0o022)  # an ordinary login's: files 0644 unless asked otherwise
    try:
        folder = tmp_path / "fresh" / "records"
        service = await start(data_dir=str(folder))
        await service.still_serves()  # a call: the WAL is written
        await records_written(service)

        old = tmp_path / "old"
        old.mkdir()
        sqlite3.connect(old / "calls.sqlite3").close()
        os.chmod(old / "calls.sqlite3", 0o644)  # as an older parley left it
        await start(data_dir=str(old))
    finally:
        os.umask(previous)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(folder) == 0o700
    files = [folder / "calls.sqlite3", folder / "calls.sqlite3-wal", folder / "calls.sqlite3-shm"]
    assert all(file.exists() for file in files)
    assert [mode(file) for file in files] == [0o600] * 3
    assert mode(old / "calls.sqlite3") == 0o600


def store_call(database: tuple[str, Path], call_id: str, ended: float) -> None:
    store = RecordStore(connect(*database))
    try:
        migrate(store.db)
        info = CallInfo(call_id, "sip", ended - 60)
        store.call_started(info, ended - 60)
        store.call_ended(info, ended, "hangup", [])
    finally:
        store.db.close()


async def test_records_past_the_retention_are_deleted_at_start_and_while_the_service_runs(
    start: Start, database: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder, "PURGE_EVERY_S", 0.2)
    monkeypatch.setattr(recorder, "IDLE_WAKE_S", 0.1)
    now = time.time()
    store_call(database, "c-old", now - 40 * DAY)
    store_call(database, "c-recent", now - 3 * DAY)
    url, folder = database
    service = await start(database=url, data_dir=str(folder), retention_days=30)

    async def status(call_id: str) -> int:
        return (await service.client.get(f"/api/calls/{call_id}", headers=service.auth)).status

    assert await status("c-old") == 404 and await status("c-recent") == 200
    store_call(database, "c-aged-meanwhile", now - 31 * DAY)  # another instance wrote it late

    async def purged() -> bool:
        return await status("c-aged-meanwhile") == 404

    await eventually(purged, 5.0, "the running service purged the record past the retention")
    assert await status("c-recent") == 200
    await service.still_serves()


# item 16: one call per call token across a fleet


async def offer_with(service: Service, token: str, sdp: str) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"}
    response = await service.client.post("/offer", json={"sdp": sdp, "type": "offer"}, headers=headers)
    return response.status, await response.json()


async def test_a_call_token_opens_one_call_across_instances_sharing_postgresql(
    start: Start, cluster: postgres.PostgresCluster
) -> None:
    url = cluster.new_database()
    first = await start(database=url, call_token_secret=SECRET)
    second = await start(database=url, call_token_secret=SECRET)
    tokens = CallTokens(SECRET)

    token = tokens.mint(60)
    assert (await offer_with(first, token, await offer_sdp()))[0] == 200
    status, body = await offer_with(second, token, await offer_sdp())
    assert status == 401 and "already" in body["error"]
    assert (await offer_with(first, token, await offer_sdp()))[0] == 401

    # Offered to both at the same moment: one instance has it.
    raced = tokens.mint(60)
    sdps = [await offer_sdp(), await offer_sdp()]
    outcomes = await asyncio.gather(offer_with(first, raced, sdps[0]), offer_with(second, raced, sdps[1]))
    assert sorted(status for status, _ in outcomes) == [200, 401]

    # An offer refused for its own fault gives the token back, to every instance.
    returned = tokens.mint(60)
    assert (await offer_with(first, returned, "v=0\r\nm=video 9 RTP/AVP 96\r\n"))[0] == 400
    assert (await offer_with(second, returned, await offer_sdp()))[0] == 200

    for service in (first, second):
        await service.still_serves()


async def test_a_call_token_is_refused_with_503_while_its_database_cannot_say(
    start: Start, cluster: postgres.PostgresCluster
) -> None:
    url = cluster.new_database()
    service = await start(database=url, call_token_secret=SECRET)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE used_call_tokens RENAME TO used_call_tokens_away")
    try:
        status, body = await offer_with(service, CallTokens(SECRET).mint(60), await offer_sdp())
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE used_call_tokens_away RENAME TO used_call_tokens")
    assert status == 503 and "try again" in body["error"]
    assert (await offer_with(service, CallTokens(SECRET).mint(60), await offer_sdp()))[0] == 200
    await service.still_serves()
