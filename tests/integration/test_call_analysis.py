"""Post-call analysis over a real SIP call (our own user agent, hand-written SIP and RTP peers): the call
ends, its analysis lands in the records database (a real PostgreSQL, and SQLite) and reaches the team's
backend as a signed `call.analyzed` event; without transcripts neither keeps what retells the call.
The call and the analysis run on engine doubles (tests/analyst_llm.py); tests/unit/test_call_analysis.py
has the real model's extraction."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from parley.records.database import connect
from tests.analyst_llm import SUMMARY, AnalystLlm
from tests.doubles import make_engines
from tests.postgres import PostgresCluster, available
from tests.signed_events import SignedEvents
from tests.sip_app import SipApp, eventually
from tests.sip_wire import offer

SECRET = "analysis-secret"
AGENT = """
system_prompt = "You are the order desk of Acme."
sip_users = ["*"]

[analysis]
summary = true
schema = '''{"type": "object", "required": ["resolved"],
            "properties": {"order_id": {"type": "string"}, "resolved": {"type": "boolean"}}}'''
success = "the caller's order status was given"
"""


@pytest.fixture
async def backend() -> AsyncIterator[tuple[SignedEvents, str]]:
    receiver = SignedEvents(SECRET)
    url = await receiver.start()
    yield receiver, url
    await receiver.close()


@pytest.fixture
def records_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return ""
    if not available():
        pytest.skip("PostgreSQL is not installed")
    server: PostgresCluster = request.getfixturevalue("cluster")
    return server.new_database()


async def a_call_that_asks_and_hangs_up(app: SipApp) -> str:
    """A SIP call: INVITE, a keypad entry the agent answers, the answer heard, then BYE; its id."""
    wire, rtp = await app.wire(), await app.rtp()
    dialogue = app.dialogue(wire)
    wire.send(dialogue.invite(offer(rtp.port)))
    ok = await wire.response(200, call_id=dialogue.call_id)
    dialogue.learn(ok)
    wire.send(dialogue.ack())
    call_id = ok.headers.get("X-Parley-Call-Id") or ""
    body = "Signal=5\r\nDuration=160\r\n"
    wire.send(dialogue.request("INFO", body=body, content_type="application/dtmf-relay"))
    assert (await wire.final(method="INFO", call_id=dialogue.call_id)).status == 200

    async def answered() -> bool:
        details = await (await app.client.get(f"/api/calls/{call_id}")).json()
        return any(t["agent_state"] == "committed" for t in details["transcript"])

    await eventually(answered, timeout=10, what="the agent's answer heard")
    wire.send(dialogue.request("BYE"))
    assert (await wire.final(method="BYE", call_id=dialogue.call_id)).status == 200
    return call_id


@pytest.mark.parametrize(
    ("records_database", "transcripts"),
    [("postgresql", True), ("sqlite", False)],
    indirect=["records_database"],
)
async def test_an_ended_call_is_analysed_into_its_record_and_a_signed_event(
    backend: tuple[SignedEvents, str], records_database: str, transcripts: bool, tmp_path: Path
) -> None:
    receiver, events_url = backend
    agent_file = tmp_path / "orders.toml"
    agent_file.write_text(AGENT)
    llm = AnalystLlm()
    app = await SipApp.start(
        make_engines(llm=llm),
        agent=(str(agent_file),),
        database=records_database,
        data_dir=str(tmp_path),
        events_url=events_url,
        webhook_secret=SECRET,
        record_transcripts=transcripts,
        keypad_timeout_ms=200,
    )
    try:
        call_id = await a_call_that_asks_and_hangs_up(app)

        async def analysed() -> bool:
            return bool(receiver.of("call.analyzed", call_id))

        await eventually(analysed, timeout=15, what="the call.analyzed event")
        event = receiver.of("call.analyzed", call_id)[0]
        shown = await (await app.client.get(f"/api/calls/{call_id}")).json()  # the call is still in memory
    finally:
        await app.close()

    assert receiver.unsigned == 0 and receiver.of("call.ended", call_id)
    assert event["data"]["agent"] == "orders"
    analysis = event["data"]["analysis"]
    assert shown["analysis"] == analysis
    assert analysis["status"] == "ok" and analysis["errors"] == {}
    # The analysis read the call as heard: the caller's keypad entry and the agent's answer.
    transcript = next(m for name, m in llm.questions if name == "summary")[1]["content"]
    assert 'Caller: "[DTMF 5]"' in transcript and 'Agent: "Your order ships on Monday."' in transcript
    if transcripts:
        assert analysis["summary"] == SUMMARY
        assert analysis["extraction"] == {"order_id": "445566", "resolved": True}
        assert analysis["verdict"] == {"success": True, "reason": "The agent gave the order's status."}
    else:
        assert "summary" not in analysis and analysis["extraction"] == {"resolved": True}
        assert analysis["verdict"] == {"success": True}

    # Kept with the call's record in the database, as the API reads it for any instance of a fleet.
    db = connect(records_database, tmp_path)
    try:
        deadline = time.monotonic() + 10
        while not (rows := db.rows("SELECT analysis FROM calls WHERE call_id = ?", (call_id,)))[0][0]:
            assert time.monotonic() < deadline, "the analysis was not stored"
            await asyncio.sleep(0.05)
    finally:
        db.close()
    assert json.loads(rows[0][0]) == analysis
