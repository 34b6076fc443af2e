"""Admission: at capacity the service says so (readyz 503, offers 503 + Retry-After) and recovers after."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.test_utils import TestServer

from parley.app import create_app
from parley.bench.caller import Caller
from parley.config import Settings
from tests.doubles import make_engines


async def test_a_full_service_refuses_politely_and_accepts_again_after_a_hangup() -> None:
    settings = Settings(max_calls=1, greeting="Hi.", ice_addresses=("127.0.0.1",))
    server = TestServer(create_app(settings, engines=make_engines()), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
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
    finally:
        await server.close()


async def test_a_caller_that_vanishes_without_hanging_up_is_ended() -> None:
    settings = Settings(greeting="", ice_addresses=("127.0.0.1",))
    server = TestServer(create_app(settings, engines=make_engines()), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
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
    finally:
        await server.close()
