"""A scripted SIP caller: dials the service over SIP (UDP), speaks clips as G.711 RTP at real-time
pace, and keeps what comes back, the way `bench/caller.py` does over WebRTC.

It measures at the caller (when its speech went out, when reply audio arrived and fell silent) and
follows the call's events through `GET /api/calls/<id>/events`, the call id coming from the
`X-Parley-Call-Id` header of the 200 OK. Used by `parley bench ... --transport sip` and the SIP tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import numpy as np

from parley.audio import rms_dbfs
from parley.bench.listening import CallFailed, Ears, Mouth
from parley.transports.base import send_paced
from parley.transports.sip.dialog import Dialog
from parley.transports.sip.endpoint import SipEndpoint
from parley.transports.sip.media import RtpStream
from parley.transports.sip.message import SipRequest, SipResponse, new_branch, new_call_id, new_tag
from parley.transports.sip.sdp import negotiated_from_answer, offer, parse_sdp
from parley.transports.sip.transactions import Peer, TransactionLayer
from parley.transports.sip.uri import SipUri, bare_host

SIP_RATE = 8000
CALLER_RTP_PORTS = (40000, 49999)


class SipCaller(Ears):
    mic: Mouth

    def __init__(self, base_url: str, sip_uri: str, *, codec: str = "PCMU", token: str = "") -> None:
        super().__init__(SIP_RATE)
        self.base_url = base_url.rstrip("/")
        self.target = SipUri.parse(sip_uri)
        self.codec = codec
        self.token = token
        self.mic = Mouth(SIP_RATE)
        self.call_id = ""
        self.setup_s: float | None = None  # INVITE sent -> 200 OK received
        self.dialog: Dialog | None = None
        self.endpoint = SipEndpoint(self._on_message)
        self.layer = TransactionLayer(self.endpoint.send)
        self.rtp: RtpStream | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _on_message(self, message: SipRequest | SipResponse, peer: Peer) -> None:
        if isinstance(message, SipResponse):
            self.layer.on_response(message)
            return
        tx = self.layer.server_transaction(message, peer)
        if tx is None:
            return
        if message.method == "BYE":
            tx.respond(200)
        elif message.method != "ACK":
            tx.respond(200 if message.method == "OPTIONS" else 405)

    async def connect(self, timeout: float = 20.0) -> str:
        await self.endpoint.start("127.0.0.1", 0)
        self.rtp = await RtpStream.open(
            "127.0.0.1", CALLER_RTP_PORTS, on_audio=self._heard, on_dtmf=lambda d: None
        )
        here = f"127.0.0.1:{self.endpoint.port}"
        sdp = offer(
            address="127.0.0.1",
            port=self.rtp.local_port,
            session_id=1,
            session_version=1,
            codecs=(self.codec,),
        )
        invite = SipRequest("INVITE", str(self.target))
        for name, value in (
            ("Via", f"SIP/2.0/UDP {here};branch={new_branch()};rport"),
            ("Max-Forwards", "70"),
            ("From", f"<sip:caller@{here}>;tag={new_tag()}"),
            ("To", f"<sip:{self.target.user or 'parley'}@{self.target.host}:{self.target.port or 5060}>"),
            ("Call-ID", new_call_id("127.0.0.1")),
            ("CSeq", "1 INVITE"),
            ("Contact", f"<sip:caller@{here}>"),
            ("Content-Type", "application/sdp"),
        ):
            invite.headers.add(name, value)
        invite.body = sdp.encode()
        peer = Peer("UDP", bare_host(self.target.host), self.target.port or 5060)
        sent = time.monotonic()
        response = await asyncio.wait_for(self.layer.start_client(invite, peer).final, timeout)
        if response.status != 200:
            raise CallFailed(f"INVITE refused: {response.status} {response.reason}")
        self.setup_s = time.monotonic() - sent
        self.call_id = response.headers.get("X-Parley-Call-Id") or ""
        self.dialog = Dialog.as_uac(invite, response, f"<sip:caller@{here}>", here, peer)
        self.endpoint.send(self.dialog.ack(1), self.dialog.next_hop())
        self.rtp.configure(negotiated_from_answer(sdp, parse_sdp(response.body.decode())))
        self.rtp.trust_sdp_address()  # we dialled the service and ACKed its answer
        rtp = self.rtp
        self._tasks.append(
            asyncio.ensure_future(send_paced(lambda: self.mic.next_frame(time.monotonic()), rtp.send_frame))
        )
        if self.call_id:
            self._tasks.append(
                asyncio.ensure_future(self.follow_events(self.base_url, self.call_id, self.token))
            )
        return self.call_id

    def _heard(self, pcm: np.ndarray) -> None:
        self.heard.times.append(time.monotonic())
        self.heard.levels.append(rms_dbfs(pcm))
        self.heard.pcm.append(pcm)

    def press(self, digits: str) -> None:
        """Keypad digits as RFC 4733 telephone-events."""
        assert self.rtp is not None
        for digit in digits:
            self.rtp.send_dtmf(digit)

    async def hangup(self) -> None:
        if self.dialog is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(
                    self.layer.request(self.dialog.request("BYE"), self.dialog.next_hop()), 5
                )
            self.dialog = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.rtp is not None:
            self.rtp.close()
        self.layer.close()
        await self.endpoint.close()

    async def __aenter__(self) -> SipCaller:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.hangup()

    def summary(self) -> dict[str, Any]:
        rtp = self.rtp
        return {"received": rtp.received, "lost": rtp.lost, "sent": rtp.sent} if rtp else {}
