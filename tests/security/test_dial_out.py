"""Dial-out is toll fraud waiting to happen (issue 42, item 9): one API request must not make the agent
call any host or any number, nor as often as it likes. Each refusal is a 403 (429 for the hourly budget)
with a JSON error naming the setting to change, and is counted in parley_dial_refused_total{reason}.
"""

from __future__ import annotations

from aiohttp import ClientResponse

from tests.security.conftest import Service, Start
from tests.sip_wire import LOCAL, SipWire

REFUSED = "parley_dial_refused_total"


async def trunk() -> SipWire:
    """A raw peer standing for the trunk: it answers every INVITE 486 Busy, so calls end at once."""
    peer = await SipWire.open(0)
    peer.auto_answer["INVITE"] = 486
    return peer


def attach(service: Service, *peers: SipWire) -> None:
    for peer in peers:
        peer.server_port = service.sip_port
        service.wires.append(peer)


async def dial(service: Service, to: str) -> ClientResponse:
    return await service.client.post("/api/calls/sip", json={"to": to}, headers=service.auth)


async def refused(response: ClientResponse, status: int, setting: str) -> None:
    assert response.status == status, await response.text()
    assert setting in (await response.json())["error"]


async def test_with_no_trunks_named_dial_out_is_off(start: Start) -> None:
    peer = await trunk()
    service = await start()
    attach(service, peer)
    before = await service.counter(REFUSED, reason="host")
    await refused(await dial(service, f"sip:+15550100@{peer.here}"), 403, "--dial-trunks")
    assert await service.counter(REFUSED, reason="host") == before + 1
    assert not peer.requests("INVITE")
    await service.still_serves()


async def test_a_host_that_is_not_a_trunk_is_403_and_counted_and_the_trunk_is_dialled(start: Start) -> None:
    carrier, elsewhere = await trunk(), await trunk()
    service = await start(dial_trunks=(carrier.here,))
    attach(service, carrier, elsewhere)
    before = await service.counter(REFUSED, reason="host")
    for to in (
        f"sip:+15550100@{elsewhere.here}",
        f"sip:+15550100@{LOCAL}",  # the trunk's host, but not its port (5060 then)
        f"sip:+15550100@localhost:{carrier.port}",  # the same address by another name: as written
    ):
        await refused(await dial(service, to), 403, "--dial-trunks")
    assert await service.counter(REFUSED, reason="host") == before + 3
    assert not elsewhere.requests("INVITE")
    assert (await dial(service, f"sip:+15550100@{carrier.here}")).status == 202
    await carrier.wait_for(lambda: list(carrier.requests("INVITE")), 5)
    await service.still_serves()


async def test_a_number_outside_the_prefixes_is_403(start: Start) -> None:
    carrier = await trunk()
    service = await start(dial_trunks=(carrier.here,), dial_prefixes=("+1", "+44"))
    attach(service, carrier)
    before = await service.counter(REFUSED, reason="prefix")
    for number in ("+882345678", "0044123456", "%2B4412345", "+1;phone-context=x", "agent"):
        await refused(await dial(service, f"sip:{number}@{carrier.here}"), 403, "--dial-prefixes")
    assert await service.counter(REFUSED, reason="prefix") == before + 5
    assert not carrier.requests("INVITE")
    assert (await dial(service, f"sip:+1-555-0100@{carrier.here}")).status == 202
    assert (await dial(service, f"sip:+442079460000@{carrier.here}")).status == 202
    await carrier.wait_for(lambda: list(carrier.requests("INVITE")), 5, count=2)
    await service.still_serves()


async def test_past_the_hourly_budget_dial_out_is_429_with_retry_after(start: Start) -> None:
    carrier = await trunk()
    service = await start(dial_trunks=(carrier.here,), dial_max_per_hour=2)
    attach(service, carrier)
    before = await service.counter(REFUSED, reason="rate")
    for _ in range(2):
        assert (await dial(service, f"sip:+15550100@{carrier.here}")).status == 202
    response = await dial(service, f"sip:+15550100@{carrier.here}")
    await refused(response, 429, "--dial-max-per-hour")
    assert 3500 <= int(response.headers["Retry-After"]) <= 3600
    assert await service.counter(REFUSED, reason="rate") == before + 1
    await carrier.wait_for(lambda: list(carrier.requests("INVITE")), 5, count=2)
    assert len(carrier.requests("INVITE")) == 2
    await service.still_serves()


async def test_a_trunk_named_by_host_name_is_dialled_at_its_address(start: Start) -> None:
    carrier = await trunk()
    service = await start(dial_trunks=(f"localhost:{carrier.port}",))
    attach(service, carrier)
    assert (await dial(service, f"sip:+15550100@localhost:{carrier.port}")).status == 202
    invite = await carrier.request("INVITE")
    assert invite.uri == f"sip:+15550100@localhost:{carrier.port}"
    await service.still_serves()
