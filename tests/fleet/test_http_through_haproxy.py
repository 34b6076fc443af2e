"""HTTP and WebRTC through a proxy (issue 46, items 4 and 5): two instances with the real models behind
Debian's HAProxy running the deployed config (deploy/haproxy/haproxy.cfg, but for its addresses). Offers
are spread over the instances; a call's own requests (`/api/calls/<id>`, its events, `DELETE
/whip/<id>`) reach the instance that holds it, named in the call id (`--instance-tag`); the callers hear
their greeting, whose media goes straight to the instance; carrier streams through the proxy work
whichever instance the webhook and the stream reach (one `--stream-secret`); and `GET
/api/calls?fleet=1` on either instance lists the calls of both. Slow (two services and a proxy):
`make test-all`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from parley.bench.caller import Caller
from parley.bench.carrier import CarrierCaller
from parley.bench.service import Service
from tests.fleet.conftest import behind_haproxy
from tests.fleet.haproxy import HAProxy
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

TAGS = ("p1", "p2")


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], HAProxy]]:
    folder = tmp_path_factory.mktemp("http-fleet")
    tagged = [["--instance-tag", tag, "--trusted-proxies", "127.0.0.1"] for tag in TAGS]
    secret = {"PARLEY_STREAM_SECRET": "one-secret-for-the-fleet"}
    with behind_haproxy(folder, cluster.new_database(), tagged, secret) as fleet:
        yield fleet


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as client:
        yield client


def tag_of(call_id: str) -> str:
    return call_id.split("-")[1]


async def first_event(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    """The first event of a call's event stream (its state, sent at once)."""
    import json

    async with session.get(url) as response:
        assert response.status == 200, (url, response.status, await response.text())
        async for line in response.content:
            if line.startswith(b"data: "):
                event: dict[str, object] = json.loads(line[6:])
                return event
    raise AssertionError(f"{url}: the stream ended without an event")


async def test_page_calls_through_the_proxy_reach_the_instance_that_holds_them(
    fleet: tuple[list[Service], HAProxy], session: aiohttp.ClientSession
) -> None:
    services, proxy = fleet
    callers = [Caller(proxy.url) for _ in range(4)]
    try:
        for caller in callers:
            await caller.connect()  # its offer went through the proxy, to a ready instance
        assert sorted(tag_of(c.call_id) for c in callers) == ["p1", "p1", "p2", "p2"]
        for caller in callers:
            await caller.wait_for_audio(after=0.0, timeout=30)  # the greeting: media straight to the instance
            call = f"{proxy.url}/api/calls/{caller.call_id}"
            async with session.get(call) as response:
                details = await response.json()
            assert details["id"] == caller.call_id and details["state"] != "ended", details
            # Only the instance that holds a call streams its events: a request routed elsewhere is a 404.
            assert (await first_event(session, f"{call}/events"))["type"] == "state"

        # Any instance lists the fleet's calls (from the shared records).
        for service in services:
            async with session.get(f"{service.base_url}/api/calls?fleet=1") as response:
                listed = {c["id"] for c in await response.json()}
            assert {c.call_id for c in callers} <= listed, listed

        for caller in callers:
            async with session.delete(f"{proxy.url}/whip/{caller.call_id}") as response:
                assert response.status == 200, await response.text()
            caller.call_id = ""  # ended: its hangup has nothing left to end
    finally:
        for caller in callers:
            await caller.hangup()


async def test_carrier_streams_through_the_proxy_work_on_either_instance(
    fleet: tuple[list[Service], HAProxy],
) -> None:
    _, proxy = fleet
    callers = [CarrierCaller(proxy.url) for _ in range(2)]
    try:
        for caller in callers:
            await caller.connect()  # webhook and stream through the proxy, maybe to different instances
            await caller.wait_for_audio(after=0.0, timeout=30)
            # Its events came through the proxy from the instance that holds it (named in its id).
            await caller.wait_for_event("state", timeout=10)
            assert tag_of(caller.call_id) in TAGS
    finally:
        for caller in callers:
            await caller.hangup()
