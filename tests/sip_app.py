"""The app under test, run in-process with its SIP listener on loopback, and the raw SIP and RTP peers a
test talks to it with: started by `SipApp.start`, everything closed by `close`, which checks that no call,
dialog or INVITE being answered is left behind."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp.test_utils import TestClient, TestServer

from parley.app import RUNTIME, SIP, create_app
from parley.bench.service import free_port
from parley.config import Settings
from parley.engines import Engines
from tests.doubles import make_engines
from tests.sip_wire import LOCAL, Dialogue, RtpPeer, SipWire


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


@dataclass
class SipApp:
    client: TestClient  # type: ignore[type-arg]
    sip_port: int
    wires: list[SipWire] = field(default_factory=list)
    rtp_peers: list[RtpPeer] = field(default_factory=list)

    @classmethod
    async def start(cls, engines: Engines | None = None, **settings: Any) -> Self:
        """The app on a free SIP port of 127.0.0.1, with no greeting and no RTP timeout unless told."""
        sip_port = free_port()
        options: dict[str, Any] = {"sip": f"{LOCAL}:{sip_port}", "greeting": "", "rtp_timeout_s": 0}
        options.update(settings)
        app = create_app(Settings(**options), engines=engines or make_engines())
        client: TestClient = TestClient(TestServer(app))  # type: ignore[type-arg]
        await client.start_server()
        return cls(client, sip_port)

    async def close(self) -> None:
        """End the calls (BYEs, which the wires answer), stop the user agent, close the peers."""
        app = self.client.app
        ua = app.get(SIP)
        runtime = app[RUNTIME]
        await self.client.close()
        for wire in self.wires:
            await wire.close()
        for peer in self.rtp_peers:
            peer.close()
        assert not runtime.registry.active()
        if ua is not None:
            assert not ua.legs and not ua.setups

    @property
    def target(self) -> str:
        return f"sip:agent@{LOCAL}:{self.sip_port}"

    @property
    def auth(self) -> dict[str, str]:
        token = self.client.app[RUNTIME].settings.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def wire(self, transport: str = "UDP") -> SipWire:
        wire = await SipWire.open(self.sip_port, transport)
        self.wires.append(wire)
        return wire

    async def rtp(self) -> RtpPeer:
        peer = await RtpPeer.open()
        self.rtp_peers.append(peer)
        return peer

    def dialogue(self, wire: SipWire, user: str = "agent", cseq: int = 1) -> Dialogue:
        return Dialogue(wire, f"sip:{user}@{LOCAL}:{self.sip_port}", cseq=cseq)

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
