"""Admission: at capacity the service says so (readyz 503, offers 503 + Retry-After) and recovers after."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp.test_utils import TestServer

from parley.app import create_app
from parley.bench.caller import Caller
from parley.config import Settings
from tests.doubles import make_engines


@contextlib.asynccontextmanager
async def service_with_test_engines(**settings: object) -> AsyncIterator[str]:
    """The real app and WebRTC transport on loopback, with fast test engines; yields its URL."""
    app = create_app(Settings(ice_addresses=("127.0.0.1",), sip="off", **settings), engines=make_engines())
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_a_full_service_refuses_politely_and_accepts_again_after_a_hangup() -> None:
    async with service_with_test_engines(max_calls=1, greeting="Hi.") as url:
        first = Caller(url)
        await first.connect()
        await first.wait_for_event("agent_done", timeout=10, turn_id="greeting")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/readyz") as ready:
                assert ready.status == 503
            async with http.post(
                f"{url}/offer", json={"sdp": "v=0\r\nm=audio 9 x 0\r\n", "type": "offer"}
            ) as busy:
                assert busy.status == 503 and busy.headers["Retry-After"]
                assert "capacity" in (await busy.json())["error"]
            calls = await (await http.get(f"{url}/api/calls")).json()
            assert [c["id"] for c in calls] == [first.call_id]
        await first.hangup()
        await asyncio.sleep(0.2)
        second = Caller(url)
        await second.connect()
        await second.hangup()


async def test_a_caller_that_vanishes_without_hanging_up_is_ended() -> None:
    async with service_with_test_engines(greeting="") as url:
        caller = Caller(url)
        await caller.connect()
        assert caller.pc is not None
        await caller.pc.close()  # no DELETE: the browser tab just went away
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                if not await (await http.get(f"{url}/api/calls")).json():
                    break
                await asyncio.sleep(0.1)
            details = await (await http.get(f"{url}/api/calls/{caller.call_id}")).json()
        assert details["state"] == "ended" and details["ended_reason"] == "hangup"
        await caller.hangup()
