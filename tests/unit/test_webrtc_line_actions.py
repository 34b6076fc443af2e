"""What the agent does to a WebRTC call, as the page sees it: a browser has no telephone line, so a
transfer, keypad digits and the agent hanging up arrive as page events, the last of them before the peer
connection closes. An aiortc caller on loopback against the app with engine doubles."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from parley.app import RUNTIME, create_app
from parley.bench.caller import Caller
from parley.call import Call
from parley.config import Settings
from parley.transports.base import LineActionFailed, LineControl
from tests.doubles import make_engines


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    c: TestClient = TestClient(TestServer(create_app(Settings(sip="off", greeting=""), make_engines())))  # type: ignore[type-arg]
    await c.start_server()
    yield c
    await c.close()
    assert not c.app[RUNTIME].registry.active()


async def connected(client: TestClient) -> tuple[Caller, Call, LineControl]:  # type: ignore[type-arg]
    """A caller whose events channel is open (the call's first event has arrived)."""
    caller = Caller(f"http://127.0.0.1:{client.port}")
    await caller.connect()
    await until(lambda: types(caller), "the first event")
    call = client.app[RUNTIME].registry.get(caller.call_id)
    assert call is not None and call.line is not None
    return caller, call, call.line


def types(caller: Caller) -> list[str]:
    return [str(e.get("type")) for _, e in caller.events]


def of_type(caller: Caller, kind: str) -> list[dict[str, Any]]:
    return [e for _, e in caller.events if e.get("type") == kind]


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


async def test_a_transfer_tells_the_page_where_then_ends_the_call_as_transferred(client) -> None:  # type: ignore[no-untyped-def]
    caller, call, line = await connected(client)
    try:
        await asyncio.to_thread(line.transfer, "+15551230000", 5)
        await until(
            lambda: of_type(caller, "state") and of_type(caller, "state")[-1]["state"] == "ended", "end"
        )
        tail = [e for _, e in caller.events][-3:]
        assert tail == [
            {"type": "transfer", "to": "+15551230000"},
            {"type": "hangup", "reason": "transferred"},
            {"type": "state", "state": "ended"},
        ]
        assert call.end_reason == "transferred"
    finally:
        await caller.hangup()


async def test_the_agent_hanging_up_reaches_the_page_before_the_connection_closes(client) -> None:  # type: ignore[no-untyped-def]
    caller, call, line = await connected(client)
    try:
        line.hang_up("agent_hangup")
        await until(lambda: call.ended and client.app[RUNTIME].registry.get(call.call_id) is call, "end")
        await until(
            lambda: of_type(caller, "state") and of_type(caller, "state")[-1]["state"] == "ended", "end"
        )
        assert of_type(caller, "hangup") == [{"type": "hangup", "reason": "agent_hangup"}]
        assert types(caller).index("hangup") < len(types(caller)) - 1  # before the final state
        await until(lambda: caller.pc is not None and caller.pc.connectionState != "connected", "the close")
    finally:
        await caller.hangup()


async def test_the_agents_digits_are_shown_to_the_page_and_bad_ones_refused(client) -> None:  # type: ignore[no-untyped-def]
    caller, call, line = await connected(client)
    try:
        await asyncio.to_thread(line.send_dtmf, "12#", 5)
        await until(lambda: of_type(caller, "dtmf_out"), "the digits")
        assert of_type(caller, "dtmf_out") == [{"type": "dtmf_out", "digits": "12#"}]
        with pytest.raises(LineActionFailed, match="keypad"):
            await asyncio.to_thread(line.send_dtmf, "1x", 5)
        with pytest.raises(LineActionFailed, match="destination"):
            await asyncio.to_thread(line.transfer, "desk", 5)
        assert not call.ended
    finally:
        await caller.hangup()
