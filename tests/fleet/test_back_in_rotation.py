"""Kamailio puts a full instance back (issue 46, item 2): behind Debian's Kamailio running the deployed
config (deploy/kamailio/kamailio.cfg, but for its addresses), instance A takes one call at a time
(`--max-calls 1`) and B takes many, both with the real models. With A holding a call, A answers OPTIONS
503, every new call through Kamailio reaches B and none is refused, and Kamailio's probes take A out of
its set; once A's call ends, A answers 200 again and, after as many good probes as the config asks for,
Kamailio sends new calls to A again. The test measures both waits against the config's probe
interval. Slow (two services and a proxy): `make test-all`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.bench.fleet import options_status
from parley.bench.service import Service, metric_value
from parley.bench.sip_caller import SipCaller
from tests.fleet.conftest import behind_kamailio
from tests.fleet.kamailio import Kamailio
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

CONFIG = (Path(__file__).parents[2] / "deploy" / "kamailio" / "kamailio.cfg").read_text()
TAGS = ("a", "b")


def dispatcher_setting(name: str) -> int:
    found = re.search(rf'^modparam\("dispatcher", "{name}", (\d+)\)', CONFIG, re.MULTILINE)
    assert found, f"deploy/kamailio/kamailio.cfg sets no dispatcher {name}"
    return int(found.group(1))


PING_S = dispatcher_setting("ds_ping_interval")  # OPTIONS to every instance this often
DOWN_AFTER = dispatcher_setting("ds_probing_threshold")  # failed probes before it is taken out
UP_AFTER = dispatcher_setting("ds_inactive_threshold")  # good probes before it is put back


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], Kamailio]]:
    folder = tmp_path_factory.mktemp("rotation")
    args = (("--instance-tag", "a", "--max-calls", "1"), ("--instance-tag", "b"))
    with behind_kamailio(folder, cluster.new_database(), args) as fleet:
        yield fleet


def refused_full(service: Service) -> float:
    """INVITEs the instance refused 503 for being at capacity (its metrics)."""
    return metric_value(
        service.metrics_text(), "parley_calls_refused_total", {"transport": "sip", "reason": "capacity"}
    )


async def call_through(proxy: Kamailio, services: list[Service]) -> tuple[str, float]:
    """One call through Kamailio, hung up once answered: the tag of the instance that answered it
    (raises CallFailed if none did), and how many INVITEs A refused for being full meanwhile."""
    before = await asyncio.to_thread(refused_full, services[0])
    caller = SipCaller(services[1].base_url, f"sip:parley@127.0.0.1:{proxy.port}")
    try:
        await caller.connect()
        tag = caller.call_id.split("-")[1]
    finally:
        await caller.hangup()
    return tag, await asyncio.to_thread(refused_full, services[0]) - before


async def test_kamailio_takes_a_full_instance_out_and_puts_it_back_once_it_has_room(
    fleet: tuple[list[Service], Kamailio],
) -> None:
    services, proxy = fleet
    a = services[0]
    filler = SipCaller(a.base_url, a.sip_uri)  # straight to A, not through Kamailio
    await filler.connect()
    try:
        filled_at = time.monotonic()
        assert filler.call_id.split("-")[1] == "a"
        assert await asyncio.to_thread(options_status, a.sip_port) == 503

        # While A is full, every new call reaches B: at first by A's 503 and Kamailio's failover, then
        # straight, once its probes have taken A out. Round robin offers A every other call while A is
        # in the set, so two calls in a row that A never saw show it is out.
        out_by = PING_S * (DOWN_AFTER + 1) + 5
        unseen = 0
        while unseen < 2:
            assert time.monotonic() - filled_at < out_by, f"A was not taken out within {out_by} s"
            tag, offered_to_a = await call_through(proxy, services)
            assert tag == "b", "a new call reached the full instance"
            unseen = unseen + 1 if offered_to_a == 0 else 0
            await asyncio.sleep(1.5)
        taken_out_s = time.monotonic() - filled_at
    finally:
        await filler.hangup()
    freed_at = time.monotonic()

    deadline = freed_at + 5
    while await asyncio.to_thread(options_status, a.sip_port) != 200:
        assert time.monotonic() < deadline, "A still answers OPTIONS 503 with its call ended"
        await asyncio.sleep(0.1)
    options_ok_s = time.monotonic() - freed_at

    # Kamailio puts A back after UP_AFTER good probes, PING_S apart (the first within PING_S of the
    # call's end): new calls reach it again. The margin covers a call or two that round robin gives B
    # first, a second apart.
    back_by = PING_S * UP_AFTER + 5
    calls_to_b = 0
    while True:
        tag, _ = await call_through(proxy, services)
        answered_s = time.monotonic() - freed_at
        if tag == "a":
            break
        calls_to_b += 1
        assert answered_s < back_by, f"no new call reached A within {back_by} s of its call ending"
        await asyncio.sleep(1.0)
    print(
        f"\nA full -> out of Kamailio's set by {taken_out_s:.1f} s; A's call ended -> OPTIONS 200 "
        f"after {options_ok_s:.2f} s, first new call routed to A after {answered_s:.1f} s "
        f"({calls_to_b} calls to B meanwhile; probes every {PING_S} s, back after {UP_AFTER} good ones)"
    )
    assert answered_s <= back_by
