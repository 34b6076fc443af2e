"""A team's backend (tool webhook and events receiver) and a SIP caller who speaks a turn: what the
prompt-injection and data tests put through a running service."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.test_utils import TestServer

from parley.audio import ulaw_encode
from tests.doubles import loud, quiet
from tests.security.conftest import Service, sdp_audio_port
from tests.sip_wire import Dialogue, RtpPeer, SipWire, offer

SAMPLES = 160  # 20 ms at 8 kHz


class Backend:
    """The team's backend: a tool webhook (answering `answer`) and an events receiver; keeps the JSON
    of every request."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.answer = answer or {"status": "shipped"}
        self.requests: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.server: TestServer | None = None

    async def tool(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        return web.json_response(self.answer)

    async def event(self, request: web.Request) -> web.Response:
        self.events.append(await request.json())
        return web.json_response({})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/tool", self.tool)
        app.router.add_post("/events", self.event)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}"

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()


async def speak(rtp: RtpPeer, port: int, ms: float = 800) -> None:
    """Speech then silence as G.711 RTP at real pace: one turn for the LoudnessVad double."""
    speech = np.concatenate([loud(ms, 8000), quiet(600, 8000)])
    for sequence, at in enumerate(range(0, speech.size, SAMPLES)):
        header = bytes([0x80, 0]) + sequence.to_bytes(2, "big") + (sequence * SAMPLES).to_bytes(4, "big")
        rtp.send(header + (0x5EED).to_bytes(4, "big") + ulaw_encode(speech[at : at + SAMPLES]), port)
        await asyncio.sleep(0.02)


async def answered_call(
    service: Service, headers: tuple[str, ...] = (), caller_user: str = "caller"
) -> tuple[SipWire, Dialogue, RtpPeer, int]:
    """An INVITE from `sip:<caller_user>@...` with `headers`, answered and ACKed: (wire, dialogue, the
    caller's RTP peer, the service's RTP port)."""
    wire = await service.wire()
    rtp = await service.rtp()
    dialogue = service.dialogue(wire)
    invite = dialogue.invite(offer(rtp.port), headers=headers)
    wire.send(invite.replace("<sip:caller@", f"<sip:{caller_user}@", 1))
    ok = await wire.response(200, call_id=dialogue.call_id, timeout=10.0)
    dialogue.learn(ok)
    wire.send(dialogue.ack())
    return wire, dialogue, rtp, sdp_audio_port(ok.body)


async def hang_up(wire: SipWire, dialogue: Dialogue) -> None:
    wire.send(dialogue.request("BYE"))
    assert (await wire.final(method="BYE", call_id=dialogue.call_id, timeout=5.0)).status == 200
