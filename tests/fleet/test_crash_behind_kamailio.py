"""One instance killed under calls (issue 46, item 3): two instances with the real models behind
Kamailio share one PostgreSQL records database; one is killed with SIGKILL while it holds a call. The survivor
closes that call's record as `crashed` (the records table says so, not the dead process), and new calls
keep coming in through Kamailio: first after its 4 s failover to the next instance, then at once, once
its OPTIONS probing has taken the dead one out. Slow (two services and a proxy): `make test-all`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from parley.bench.service import Service
from parley.bench.sip_caller import SipCaller
from tests.fleet.conftest import instances
from tests.fleet.kamailio import Kamailio
from tests.fleet.test_sip_through_kamailio import holder
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

CLOSED_WITHIN_S = 40.0  # three missed 5 s heartbeats, and the survivor's next look
NEW_CALLS_S = 35.0  # new calls are placed this long after the kill, one a second


@pytest.fixture
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], Kamailio]]:
    folder = tmp_path_factory.mktemp("crash")
    with (
        instances(folder, cluster.new_database()) as services,
        Kamailio(folder, [s.sip_port for s in services]) as proxy,
    ):
        yield services, proxy


def record(service: Service, call_id: str) -> dict[str, Any]:
    found: dict[str, Any] = service.get_json(f"/api/calls/{call_id}")
    return found


async def test_a_killed_instance_s_calls_are_closed_as_crashed_and_new_calls_go_on(
    fleet: tuple[list[Service], Kamailio],
) -> None:
    services, proxy = fleet
    uri = f"sip:parley@127.0.0.1:{proxy.port}"
    callers = [SipCaller(services[0].base_url, uri) for _ in range(2)]
    for caller in callers:
        await caller.connect()
    placed: list[SipCaller] = []
    try:
        holders = [await asyncio.to_thread(holder, services, c.call_id) for c in callers]
        assert sorted(h for h in holders if h is not None) == [0, 1], holders
        victim = holders[0]
        assert victim is not None
        survivor = services[1 - victim]
        dead_call = callers[0].call_id
        process = services[victim].process
        assert process is not None
        killed_at = time.monotonic()
        process.kill()  # SIGKILL: no shutdown, no BYE, no record closed by it

        # New calls, one a second: every one is answered (by the survivor).
        setups: list[tuple[float, float]] = []
        closed_after: float | None = None
        while time.monotonic() - killed_at < NEW_CALLS_S:
            caller = SipCaller(survivor.base_url, uri)
            await caller.connect(timeout=30)  # raises CallFailed on anything but a 200
            placed.append(caller)
            assert caller.setup_s is not None
            setups.append((round(time.monotonic() - killed_at, 1), round(caller.setup_s, 2)))
            await caller.hangup()
            if (
                closed_after is None
                and (await asyncio.to_thread(record, survivor, dead_call)).get("ended_reason") == "crashed"
            ):
                closed_after = time.monotonic() - killed_at
            await asyncio.sleep(1.0)
        while closed_after is None and time.monotonic() - killed_at < CLOSED_WITHIN_S:
            if (await asyncio.to_thread(record, survivor, dead_call)).get("ended_reason") == "crashed":
                closed_after = time.monotonic() - killed_at
            await asyncio.sleep(0.5)
        print(f"crashed record closed after {closed_after} s; new calls (s after kill, set-up s): {setups}")
        assert closed_after is not None, record(survivor, dead_call)
        # Once Kamailio has taken the dead instance out, set-ups are quick again.
        assert all(setup < 2.0 for _, setup in setups[-5:]), setups
        # The survivor's own live call went on untouched.
        assert (await asyncio.to_thread(record, survivor, callers[1].call_id))["state"] != "ended"
    finally:
        for caller in (*callers, *placed):
            await caller.hangup()
