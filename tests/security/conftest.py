"""Attacks over real sockets against a service the test starts, and the check that follows each one:
the SIP listener still answers an OPTIONS and a real call still completes (INVITE, 200, ACK, RTP both
ways, BYE).

`start(**settings)` runs the real app in-process on 127.0.0.1 (HTTP on a free port, SIP on another) with
engine doubles: what is under test is what a peer can send, not the models. `certificate` is the
self-signed certificate a TLS listener presents (`start_tls` and the TLS peers are in tls_peer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from parley.transports.sip.message import SipRequest
from tests.security.tls_peer import Certificate, TlsWire, callee, write_certificate
from tests.sip_app import SipApp, eventually
from tests.sip_wire import LOCAL, branch, offer, text, token


def rtp_packet(sequence: int, *, payload_type: int = 0, ssrc: int = 0x1234, samples: int = 160) -> bytes:
    """One RTP packet (RFC 3550 5.1) of `samples` bytes of G.711 silence."""
    header = struct.pack("!BBHII", 0x80, payload_type, sequence & 0xFFFF, sequence * samples, ssrc)
    return header + b"\xff" * samples


def sdp_audio_port(body: bytes) -> int:
    match = re.search(rb"^m=audio (\d+) RTP/", body, re.MULTILINE)
    assert match, body
    return int(match.group(1))


@dataclass
class Service(SipApp):
    """The app under test, its SIP port, and the raw peers talking to it (closed with it)."""

    async def options(self, transport: str = "UDP") -> int:
        """An OPTIONS from a fresh peer: the status it got."""
        wire = await self.wire(transport)
        call_id = f"{token()}@check"
        wire.send(
            text(
                [
                    f"OPTIONS {self.target} SIP/2.0",
                    f"Via: {wire.via(branch())}",
                    "Max-Forwards: 70",
                    f"From: <sip:check@{wire.here}>;tag={token()}",
                    f"To: <{self.target}>",
                    f"Call-ID: {call_id}",
                    "CSeq: 1 OPTIONS",
                ]
            )
        )
        return (await wire.final(method="OPTIONS", call_id=call_id, timeout=5.0)).status

    async def call_completes(self, transport: str = "UDP", headers: tuple[str, ...] = ()) -> None:
        """A real call from a fresh peer: answered, RTP both ways, hung up with a BYE that gets 200."""
        wire = await self.wire(transport)
        rtp = await self.rtp()
        d = self.dialogue(wire)
        wire.send(d.invite(offer(rtp.port), headers=headers))
        ok = await wire.response(200, call_id=d.call_id, timeout=10.0)
        d.learn(ok)
        wire.send(d.ack())
        their_port = sdp_audio_port(ok.body)
        for sequence in range(10):
            rtp.send(rtp_packet(sequence), their_port)
        deadline = time.monotonic() + 5.0
        while not rtp.packets:
            assert time.monotonic() < deadline, "no RTP from the agent within 5 s"
            await asyncio.sleep(0.02)
        wire.send(d.request("BYE"))
        assert (await wire.final(method="BYE", call_id=d.call_id, timeout=5.0)).status == 200

    async def still_serves(self) -> None:
        """The check after every attack: the listener answers, and a call still goes through."""
        assert await self.options() == 200
        await self.call_completes()


Start = Callable[..., Awaitable[Service]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    services: list[Service] = []

    async def start_service(**overrides: Any) -> Service:
        service = await Service.start(ice_addresses=(LOCAL,), **overrides)
        services.append(service)
        return service

    yield start_service
    for service in services:
        await service.close()


@contextlib.asynccontextmanager
async def dialled_over_tls(
    start: Start, certificate: Certificate
) -> AsyncIterator[tuple[Service, TlsWire, SipRequest, int]]:
    """A service that trusts the test's certificate dials sips:bob at a TLS callee listening with it:
    the service, the callee's end of the connection, the INVITE that came over it, the callee's port."""
    server, accepted = await callee(certificate)
    port = int(server.sockets[0].getsockname()[1])
    try:
        service = await start(sip_tls_ca_file=certificate.cert_file, dial_trunks=(f"localhost:{port}",))
        response = await service.client.post(
            "/api/calls/sip", json={"to": f"sips:bob@localhost:{port}"}, headers=service.auth
        )
        assert response.status == 202, await response.text()
        wire = await asyncio.wait_for(accepted.get(), 5.0)
        service.wires.append(wire)
        yield service, wire, await wire.request("INVITE"), port
    finally:
        server.close()


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """The service's self-signed TLS certificate for localhost and 127.0.0.1 (tls_peer.py)."""
    return write_certificate(tmp_path_factory.mktemp("tls"))


__all__ = ["LOCAL", "Service", "Start", "dialled_over_tls", "eventually", "rtp_packet", "sdp_audio_port"]
