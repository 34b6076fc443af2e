"""A scripted SIP caller: dials the service over SIP (UDP), speaks clips as G.711 RTP at real-time
pace, and keeps what comes back, the way `bench/caller.py` does over WebRTC.

It measures at the caller (when its speech went out, when reply audio arrived and fell silent) and
follows the call's events through `GET /api/calls/<id>/events`, the call id coming from the
`X-Parley-Call-Id` header of the 200 OK. Used by `parley bench ... --transport sip` and the SIP tests.

Given a scenario's `line` (scenarios/line.py), its noise is under every frame it sends and its RTP goes
through the line's losses, jitter and stalls. Transferred by a REFER, it accepts and reports the new
call as answered (RFC 3515), as a phone that carried the transfer out would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import numpy as np

from parley.audio import rms_dbfs
from parley.bench.listening import CallFailed, Ears, LineConditions, Mouth
from parley.transports.base import send_paced
from parley.transports.sip.dialog import Dialog
from parley.transports.sip.endpoint import SipEndpoint
from parley.transports.sip.media import RtpStream
from parley.transports.sip.message import SipRequest, SipResponse, new_branch, new_call_id, new_tag
from parley.transports.sip.sdp import negotiated_from_answer, offer, parse_sdp
from parley.transports.sip.transactions import Peer, ServerTransaction, TransactionLayer
from parley.transports.sip.uri import NameAddr, SipError, SipUri, bare_host

SIP_RATE = 8000
CALLER_RTP_PORTS = (40000, 49999)


class _LineDatagrams(asyncio.DatagramTransport):
    """The RTP socket seen through a scenario's line: RtpStream numbers and encodes each packet, then the
    line loses, delays or holds the datagram, so that a lost packet leaves a gap in the sequence numbers
    as it does on a real network."""

    def __init__(self, transport: asyncio.DatagramTransport, line: LineConditions) -> None:
        super().__init__()
        self._transport = transport

        def send(datagram: tuple[bytes, Any]) -> None:
            transport.sendto(datagram[0], datagram[1])

        self._send = line.impair(send)

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        self._send((bytes(data), addr))

    def close(self) -> None:
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def abort(self) -> None:
        self._transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class SipCaller(Ears):
    mic: Mouth

    def __init__(
        self,
        base_url: str,
        sip_uri: str,
        *,
        codec: str = "PCMU",
        token: str = "",
        line: LineConditions | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(SIP_RATE)
        self.base_url = base_url.rstrip("/")
        self.target = SipUri.parse(sip_uri)
        # A line that names its codec has it (and one that cannot be had over SIP is refused here).
        self.codec = line.codec_for("sip") if line is not None and line.names_codec() else codec
        self.token = token
        self.line = line
        self.mic = Mouth(SIP_RATE, frame_filter=line.noisy(SIP_RATE) if line is not None else None)
        self.transferred_to = ""  # the Refer-To of the REFER that transferred us
        self.headers = dict(headers or {})  # sent with the INVITE (an agent's sip_headers: X-Customer-Id)
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
        elif message.method == "REFER":
            self._on_refer(tx, message)
        elif message.method != "ACK":
            tx.respond(200 if message.method == "OPTIONS" else 405)

    def _on_refer(self, tx: ServerTransaction, refer: SipRequest) -> None:
        """Accept the transfer (202), keep where to, and report the new call answered at once in the
        REFER's implicit subscription (RFC 3515 2.4.4-2.4.5): one NOTIFY that ends it with a sipfrag
        "200 OK"; the service then ends our call as transferred."""
        dialog = self.dialog
        try:
            if dialog is None or refer.call_id != dialog.call_id or refer.to_tag != dialog.local_tag:
                tx.respond(481)
                return
            target = str(NameAddr.parse(refer.required("Refer-To")).uri)
        except SipError:
            tx.respond(400)
            return
        tx.respond(202, headers=(("Contact", dialog.local_contact),))
        self.transferred_to = target
        notify = dialog.request("NOTIFY", body=b"SIP/2.0 200 OK\r\n", content_type="message/sipfrag")
        notify.headers.add("Event", "refer")
        notify.headers.add("Subscription-State", "terminated;reason=noresource")
        notify.headers.add("Contact", dialog.local_contact)  # RFC 6665 4.2.2: a NOTIFY carries one
        self._tasks.append(asyncio.ensure_future(self._notify(notify, dialog.next_hop())))

    async def _notify(self, notify: SipRequest, peer: Peer) -> None:
        with contextlib.suppress(TimeoutError):
            await self.layer.request(notify, peer)

    async def connect(self, timeout: float = 20.0) -> str:
        await self.endpoint.start("127.0.0.1", 0)
        self.rtp = await self._open_rtp()
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
            *self.headers.items(),
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

    async def _open_rtp(self) -> RtpStream:
        rtp = await RtpStream.open(
            "127.0.0.1", CALLER_RTP_PORTS, on_audio=self._heard, on_dtmf=lambda d: None
        )
        if self.line is not None and rtp._rtp is not None:
            # RtpStream sends every RTP datagram through its socket's transport; the line goes in there.
            rtp._rtp = _LineDatagrams(rtp._rtp, self.line)
        return rtp

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
        if self.line is not None:
            self.line.close()
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
