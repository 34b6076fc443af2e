"""The SIP listener on a public address (issue 42, items 1, 4 and 5): where responses go, what one peer
can make the listener hold, and the set-up limit an allow-listed trunk still meets.

Each attack comes over a real socket from 127.0.0.2 or 127.0.0.3 (Linux answers on all of 127/8), so that
the check afterwards, from 127.0.0.1, is another source's call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import cast

from parley.app import RUNTIME
from parley.transports.sip.message import SipResponse, parse_message
from parley.transports.sip.uri import SipError
from tests.security.conftest import LOCAL, Service, Start, eventually
from tests.sip_wire import branch, offer, text, token

ATTACKER = "127.0.0.2"
ANOTHER = "127.0.0.3"


class RawPeer(asyncio.DatagramProtocol):
    """A UDP socket on a chosen local address: sends what a test writes, keeps what comes back."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0
        self.host = ""
        self.datagrams: list[bytes] = []

    @classmethod
    async def open(cls, host: str = ATTACKER, port: int = 0) -> RawPeer:
        peer = cls()
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: peer, local_addr=(host, port))
        return peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        self.host, self.port = transport.get_extra_info("sockname")[:2]

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.datagrams.append(data)

    def send(self, data: str, port: int) -> None:
        assert self.transport is not None
        self.transport.sendto(data.encode(), (LOCAL, port))

    def responses(self) -> list[SipResponse]:
        found = []
        for data in self.datagrams:
            with contextlib.suppress(SipError):
                message = parse_message(data)
                if isinstance(message, SipResponse):
                    found.append(message)
        return found

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def request(
    method: str,
    service: Service,
    via: str,
    *,
    call_id: str | None = None,
    body: str = "",
    ctype: str | None = None,
) -> str:
    """A request outside any dialog, its top Via as given."""
    return text(
        [
            f"{method} {service.target} SIP/2.0",
            f"Via: {via}",
            "Max-Forwards: 70",
            f"From: <sip:mallory@{ATTACKER}>;tag={token()}",
            f"To: <{service.target}>",
            f"Call-ID: {call_id or token() + '@attack'}",
            f"CSeq: 1 {method}",
            f"Contact: <sip:mallory@{ATTACKER}>",
        ],
        body,
        ctype,
    )


async def transactions(service: Service) -> float:
    return await service.counter("parley_sip_transactions")


# --- item 1: responses go to the received address, never to a Via maddr or a name ------------------------


async def test_a_via_maddr_with_a_name_that_cannot_be_encoded_never_closes_the_listener(start: Start) -> None:
    # Before: the name reached sendto, whose TypeError made asyncio close the UDP socket for good.
    service = await start()
    wire = await service.wire()
    call_id = f"{token()}@attack"
    maddr = "\u00ff" * 70  # no IDNA label can be that long
    wire.send(request("OPTIONS", service, f'{wire.via(branch())};maddr="{maddr}"', call_id=call_id))
    answer = await wire.final(method="OPTIONS", call_id=call_id)
    assert answer.status == 200  # to where the request came from
    await service.still_serves()


async def test_a_via_maddr_with_a_name_is_never_resolved_and_the_response_goes_to_the_source(
    start: Start,
) -> None:
    service = await start()
    wire = await service.wire()
    call_id = f"{token()}@attack"
    before = time.monotonic()
    wire.send(request("OPTIONS", service, f"{wire.via(branch())};maddr=reflect.invalid", call_id=call_id))
    assert (await wire.final(method="OPTIONS", call_id=call_id)).status == 200
    assert time.monotonic() - before < 2.0
    await service.still_serves()


async def test_a_via_maddr_never_redirects_a_response_nor_its_retransmissions(start: Start) -> None:
    # The reflector: an INVITE naming a victim in its Via (sent-by and maddr) gets a non-2xx final
    # response, which Timer G sends again and again. All of it must go back to the real source.
    service = await start()
    victim = await RawPeer.open(ATTACKER)
    wire = await service.wire()
    call_id = f"{token()}@attack"
    via = f"SIP/2.0/UDP {victim.host}:{victim.port};branch={branch()};maddr={victim.host}"
    try:
        wire.send(request("INVITE", service, via, call_id=call_id))  # no SDP: 488
        refused = await wire.final(method="INVITE", call_id=call_id)
        assert refused.status == 488
        await wire.wait_for(lambda: list(wire.responses(488, method="INVITE", call_id=call_id)), 3.0, count=2)
        assert victim.datagrams == []
    finally:
        victim.close()
    await service.still_serves()


async def test_a_via_sent_by_naming_another_port_does_not_move_the_response(start: Start) -> None:
    # Without rport the sent-by port once chose the destination (RFC 3261 18.2.2); now the source port does.
    service = await start()
    victim = await RawPeer.open(LOCAL)
    wire = await service.wire()
    call_id = f"{token()}@attack"
    try:
        wire.send(
            request(
                "OPTIONS", service, f"SIP/2.0/UDP {LOCAL}:{victim.port};branch={branch()}", call_id=call_id
            )
        )
        assert (await wire.final(method="OPTIONS", call_id=call_id)).status == 200
        assert victim.datagrams == []
    finally:
        victim.close()
    await service.still_serves()


# --- item 4: what one peer can make the listener hold ---------------------------------------------------


async def test_a_flood_of_requests_outside_any_call_is_dropped_past_the_rate_and_a_call_still_completes(
    start: Start,
) -> None:
    service = await start(sip_request_rate=10.0, sip_request_burst=50)
    flooder = await RawPeer.open(ATTACKER)
    sent, began = 0, time.monotonic()
    try:
        for i in range(3000):
            method = ("OPTIONS", "MESSAGE", "REGISTER")[i % 3]
            flooder.send(
                request(method, service, f"SIP/2.0/UDP {ATTACKER}:{flooder.port};branch={branch()}"),
                service.sip_port,
            )
            sent += 1
            await asyncio.sleep(0)  # the listener reads one datagram per turn of the loop
            if time.monotonic() - began > 10:
                break
        elapsed = time.monotonic() - began
        await service.still_serves()
        answered = len(flooder.responses())
        assert answered <= 50 + 10 * (elapsed + 1) + 5, (answered, sent, elapsed)
        assert await transactions(service) <= 128
        dropped = await service.counter(
            "parley_transport_errors_total", transport="sip", reason="rate_limited"
        )
        assert dropped >= sent / 2
    finally:
        flooder.close()


async def test_one_source_cannot_hold_more_transactions_than_its_share(start: Start) -> None:
    service = await start(sip_request_rate=0, sip_max_transactions_per_source=100)
    flooder = await RawPeer.open(ATTACKER)
    try:
        for _ in range(400):
            flooder.send(
                request("OPTIONS", service, f"SIP/2.0/UDP {ATTACKER}:{flooder.port};branch={branch()}"),
                service.sip_port,
            )
            await asyncio.sleep(0)
        await eventually(lambda: _answered(flooder, 400), what="every request answered")
        statuses = [r.status for r in flooder.responses()]
        assert statuses.count(200) == 100 and statuses.count(503) == 300
        busy = next(r for r in flooder.responses() if r.status == 503)
        assert int(busy.headers.get("Retry-After") or 0) >= 1
        assert await transactions(service) <= 100
        await service.still_serves()
    finally:
        flooder.close()


async def test_a_full_transaction_table_refuses_strangers_with_503_yet_a_call_in_progress_hangs_up(
    start: Start,
) -> None:
    service = await start(sip_request_rate=0, sip_max_transactions_per_source=80, sip_max_transactions=120)
    wire, rtp = await service.wire(), await service.rtp()
    d = service.dialogue(wire)
    wire.send(d.invite(offer(rtp.port)))
    ok = await wire.response(200, call_id=d.call_id, timeout=10.0)
    d.learn(ok)
    wire.send(d.ack())
    flooders = [await RawPeer.open(ATTACKER), await RawPeer.open(ANOTHER)]
    try:
        for flooder in flooders:
            for _ in range(100):
                via = f"SIP/2.0/UDP {flooder.host}:{flooder.port};branch={branch()}"
                flooder.send(request("OPTIONS", service, via), service.sip_port)
                await asyncio.sleep(0)
        for flooder in flooders:
            await eventually(lambda f=flooder: _answered(f, 100), what="every request answered")  # type: ignore[misc]
        assert await transactions(service) <= 120
        # A stranger now: refused clearly, never left to retransmit into a full table.
        assert await service.options() == 503
        # The call in progress still ends: its BYE finds room.
        wire.send(d.request("BYE"))
        assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    finally:
        for flooder in flooders:
            flooder.close()


async def _answered(peer: RawPeer, count: int) -> bool:
    return len(peer.responses()) >= count


async def _closed_at_once(reader: asyncio.StreamReader, timeout: float = 2.0) -> bool:
    """True when the listener closed the connection without a word (EOF or a reset)."""
    try:
        return await asyncio.wait_for(reader.read(100), timeout) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def _options_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, service: Service) -> int:
    here = "{}:{}".format(*writer.get_extra_info("sockname")[:2])
    writer.write(request("OPTIONS", service, f"SIP/2.0/TCP {here};branch={branch()}").encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    return int(head.split(b" ", 2)[1])


async def test_tcp_connections_past_the_cap_per_source_are_closed_at_once(start: Start) -> None:
    service = await start(sip_max_connections_per_source=4)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(4):
            reader, writer = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(ATTACKER, 0))
            held.append((reader, writer))
            assert await _options_over(reader, writer, service) == 200
        for _ in range(3):
            reader, writer = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(ATTACKER, 0))
            held.append((reader, writer))
            assert await _closed_at_once(reader)
        refused = await service.counter(
            "parley_transport_errors_total", transport="sip", reason="connections_full"
        )
        assert refused >= 3
        # Another source is not counted against this one's share.
        assert await service.options("TCP") == 200
        await service.still_serves()
    finally:
        for _, writer in held:
            writer.close()


async def test_tcp_connections_past_the_cap_in_all_are_closed_at_once(start: Start) -> None:
    service = await start(sip_max_connections=3)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for source in (ATTACKER, ANOTHER, ATTACKER):
            reader, writer = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(source, 0))
            held.append((reader, writer))
            assert await _options_over(reader, writer, service) == 200
        reader, writer = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(ANOTHER, 0))
        held.append((reader, writer))
        assert await _closed_at_once(reader)
        for _, writer in held[:3]:
            writer.close()
        await service.still_serves()
        assert await service.options("TCP") == 200  # the closed ones no longer count
    finally:
        for _, writer in held:
            writer.close()


async def test_a_tcp_connection_from_outside_the_allow_list_is_closed_at_accept(start: Start) -> None:
    service = await start(sip_allow=(LOCAL,))
    reader, writer = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(ATTACKER, 0))
    try:
        assert await _closed_at_once(reader)  # before it sends a byte
    finally:
        writer.close()
    await service.still_serves()


async def test_crlf_keep_alives_do_not_keep_an_idle_tcp_connection_open(start: Start) -> None:
    service = await start(sip_connection_idle_s=1.0)
    pinger = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(ATTACKER, 0))
    talker = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(ATTACKER, 0))
    opened = time.monotonic()
    closed_after: float | None = None
    try:
        while time.monotonic() - opened < 4.0 and closed_after is None:
            pinger[1].write(b"\r\n\r\n")  # RFC 5626 keep-alive, nothing else
            assert await _options_over(*talker, service) == 200  # a real message keeps its connection
            if await _closed_at_once(pinger[0], timeout=0.3):
                closed_after = time.monotonic() - opened
        assert closed_after is not None and 0.8 <= closed_after <= 3.0, closed_after
        assert await _options_over(*talker, service) == 200
    finally:
        pinger[1].close()
        talker[1].close()
    await service.still_serves()


# --- item 5: the allow-list spares a trunk the per-source limit, not a set-up limit of its own ---------


async def test_an_allow_listed_trunk_still_meets_a_global_setup_limit(start: Start) -> None:
    # The per-source limit (a burst of 1) is spared the trunk; the trunks' own limit (3 at once) is not.
    service = await start(
        sip_allow=(LOCAL,),
        setup_rate=0.01,
        setup_burst=1,
        rate_limit_exempt=(),
        sip_trunk_setup_rate=5.0,
        sip_trunk_setup_burst=3,
    )
    wire = await service.wire()
    call_ids = [f"{token()}@trunk" for _ in range(8)]
    for call_id in call_ids:
        via = wire.via(branch())
        wire.send(request("INVITE", service, via, call_id=call_id))  # no SDP: 488 once past the limits
    finals = [await wire.final(method="INVITE", call_id=call_id) for call_id in call_ids]
    statuses = [f.status for f in finals]
    assert statuses.count(488) >= 3 and statuses.count(503) >= 4, statuses
    refused = next(f for f in finals if f.status == 503)
    assert int(refused.headers.get("Retry-After") or 0) >= 1
    await asyncio.sleep(3 / 5.0)  # the trunks' bucket refills (5 a second, 3 at most)
    await service.still_serves()


async def test_one_source_cannot_hold_every_sip_line(start: Start) -> None:
    service = await start(rate_limit_exempt=(), max_calls_per_source=1)
    wire = await service.wire()
    rtp = await service.rtp()
    first = service.dialogue(wire)
    wire.send(first.invite(offer(rtp.port)))
    ok = await wire.response(200, call_id=first.call_id, timeout=10.0)
    first.learn(ok)
    wire.send(first.ack())
    second = service.dialogue(wire)
    wire.send(second.invite(offer(rtp.port)))
    refused = await wire.final(method="INVITE", call_id=second.call_id, timeout=10.0)
    assert refused.status == 503, refused.status
    wire.send(first.request("BYE"))
    assert (await wire.final(method="BYE", call_id=first.call_id, timeout=5.0)).status == 200
    registry = service.client.app[RUNTIME].registry

    async def line_released() -> bool:  # the line is the caller's again once the call has ended
        return not registry.active()

    await eventually(line_released, timeout=10.0, what="the first call ends after its BYE")
    await service.still_serves()


async def test_an_allow_listed_trunk_is_spared(start: Start) -> None:
    service = await start(rate_limit_exempt=(), max_calls_per_source=1, sip_allow=("127.0.0.1",))
    wire = await service.wire()
    rtp = await service.rtp()
    for _ in range(2):
        d = service.dialogue(wire)
        wire.send(d.invite(offer(rtp.port)))
        ok = await wire.response(200, call_id=d.call_id, timeout=10.0)
        d.learn(ok)
        wire.send(d.ack())
    await service.still_serves()
