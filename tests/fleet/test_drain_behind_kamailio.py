"""Draining one instance behind Kamailio (issue 46, item 2): once drained, an instance answers new
INVITEs and OPTIONS probes 503, so Kamailio's dispatcher sends every new call to the other instance and
none is refused while that one has room; the drained instance's live call goes on until its caller
hangs up. Slow (two services and a proxy): `make test-all`.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator

import pytest

from parley.bench.service import Service
from parley.bench.sip_caller import SipCaller
from parley.bench.speech import espeak, trim
from tests.fleet.conftest import behind_kamailio
from tests.fleet.kamailio import Kamailio
from tests.fleet.test_sip_through_kamailio import holder
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], Kamailio]]:
    folder = tmp_path_factory.mktemp("drain")
    with behind_kamailio(folder, cluster.new_database()) as fleet:
        yield fleet


def drain(service: Service) -> dict[str, object]:
    request = urllib.request.Request(
        f"{service.base_url}/api/drain", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


async def test_a_drained_instance_gets_no_new_call_and_keeps_its_live_one(
    fleet: tuple[list[Service], Kamailio],
) -> None:
    services, proxy = fleet
    uri = f"sip:parley@127.0.0.1:{proxy.port}"
    live = SipCaller(services[0].base_url, uri)
    await live.connect()
    newcomers: list[SipCaller] = []
    try:
        drained = await asyncio.to_thread(holder, services, live.call_id)
        assert drained is not None
        other = 1 - drained
        assert (await asyncio.to_thread(drain, services[drained]))["draining"] is True

        # New calls: those Kamailio offers the drained instance are answered 503 there and go on to the
        # other one (its failure route); none is refused.
        for _ in range(4):
            caller = SipCaller(services[0].base_url, uri)
            await caller.connect()  # raises CallFailed on anything but a 200
            newcomers.append(caller)
        holders = [await asyncio.to_thread(holder, services, c.call_id) for c in newcomers]
        assert holders == [other] * 4, holders

        # The drained instance's call goes on: its caller still gets answers.
        _, spoken_end = await live.say(trim(espeak("what is the capital city of japan")))
        await live.wait_for_audio(after=spoken_end, timeout=30)
        assert await asyncio.to_thread(holder, services, live.call_id) == drained
    finally:
        for caller in (live, *newcomers):
            await caller.hangup()
