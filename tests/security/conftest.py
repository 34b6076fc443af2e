"""Attacks over real sockets against a service the test starts, and the check that follows each one:
the SIP listener still answers an OPTIONS and a real call still completes (INVITE, 200, ACK, RTP both
ways, BYE).

`start(**settings)` runs the real app in-process on 127.0.0.1 (HTTP on a free port, SIP on another) with
engine doubles: what is under test is what a peer can send, not the models. `certificate` is the
self-signed certificate a TLS listener presents (`start_tls` and the TLS peers are in tls_peer.py).
"""

from __future__ import annotations

import asyncio
import re
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from parley.app import RUNTIME, SIP, create_app
from parley.bench.service import free_port
from parley.config import Settings
from tests.doubles import make_engines
from tests.security.tls_peer import Certificate, write_certificate
from tests.sip_wire import LOCAL, Dialogue, RtpPeer, SipWire, branch, offer, text, token


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


def rtp_packet(sequence: int, *, payload_type: int = 0, ssrc: int = 0x1234, samples: int = 160) -> bytes:
    """One RTP packet (RFC 3550 5.1) of `samples` bytes of G.711 silence."""
    header = struct.pack("!BBHII", 0x80, payload_type, sequence & 0xFFFF, sequence * samples, ssrc)
    return header + b"\xff" * samples


def sdp_audio_port(body: bytes) -> int:
    match = re.search(rb"^m=audio (\d+) RTP/", body, re.MULTILINE)
    assert match, body
    return int(match.group(1))


@dataclass
class Service:
    """The app under test, its SIP port, and the raw peers talking to it (closed with it)."""

    client: TestClient  # type: ignore[type-arg]
    sip_port: int
    wires: list[SipWire] = field(default_factory=list)
    rtp_peers: list[RtpPeer] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"sip:agent@{LOCAL}:{self.sip_port}"

    async def wire(self, transport: str = "UDP") -> SipWire:
        wire = await SipWire.open(self.sip_port, transport)
        self.wires.append(wire)
        return wire

    async def rtp(self) -> RtpPeer:
        peer = await RtpPeer.open()
        self.rtp_peers.append(peer)
        return peer

    def dialogue(self, wire: SipWire, user: str = "agent") -> Dialogue:
        return Dialogue(wire, f"sip:{user}@{LOCAL}:{self.sip_port}")

    async def counter(self, name: str, **labels: str) -> float:
        """A sample of /metrics (0 when absent), whatever the label order."""
        exposition = await (await self.client.get("/metrics", headers=self.auth)).text()
        for line in exposition.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    @property
    def auth(self) -> dict[str, str]:
        token = self.client.app[RUNTIME].settings.token
        return {"Authorization": f"Bearer {token}"} if token else {}

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
        sip_port = free_port()
        options: dict[str, Any] = {
            "sip": f"{LOCAL}:{sip_port}",
            "greeting": "",
            "rtp_timeout_s": 0,
            "ice_addresses": (LOCAL,),
        }
        options.update(overrides)
        engines = options.pop("engines", None) or make_engines()
        client: TestClient = TestClient(TestServer(create_app(Settings(**options), engines=engines)))  # type: ignore[type-arg]
        await client.start_server()
        service = Service(client, sip_port)
        services.append(service)
        return service

    yield start_service
    for service in services:
        app = service.client.app
        ua = app.get(SIP)
        runtime = app[RUNTIME]
        await service.client.close()  # ends the calls (BYEs, which the wires answer) and stops the UA
        for wire in service.wires:
            await wire.close()
        for peer in service.rtp_peers:
            peer.close()
        assert not runtime.registry.active()
        if ua is not None:
            assert not ua.legs and not ua.setups


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """The service's self-signed TLS certificate for localhost and 127.0.0.1 (tls_peer.py)."""
    return write_certificate(tmp_path_factory.mktemp("tls"))


__all__ = ["LOCAL", "Service", "Start", "eventually", "rtp_packet", "sdp_audio_port"]
