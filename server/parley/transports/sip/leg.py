"""One SIP call's transport: its dialog and RTP stream, carrying audio for a Call both ways.

The agent's voice is pulled from the call's Outbound every 20 ms and sent as RTP (silence included, so
the peer's jitter buffer and the RTP clock run on); caller audio and RFC 4733 digits go to the Call.
The leg ends the call when the peer hangs up, when no RTP arrives for --rtp-timeout-s, or when our 2xx
is never acknowledged; when the call ends from our side, it says BYE.

For the agent it transfers the caller with REFER (RFC 3515, see refer.py) and sends keypad digits as
RFC 4733 events on the RTP stream, or as SIP INFO (application/dtmf-relay) to a peer that negotiated no
telephone-event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from parley import metrics
from parley.call import Call
from parley.log import event
from parley.transports.base import HangUp, LineActionFailed, send_paced
from parley.transports.line import keypad_digits, transfer_destination
from parley.transports.sip.dialog import Dialog
from parley.transports.sip.media import RtpStream
from parley.transports.sip.message import SipRequest, SipResponse
from parley.transports.sip.refer import ReferSubscription, refer_request, refer_to
from parley.transports.sip.transactions import T1, T2, TIMEOUT, Peer
from parley.transports.sip.uri import SipError, SipUri

log = logging.getLogger(__name__)

SIP_RATE = 8000
WATCH_INTERVAL_S = 1.0
BYE_TIMEOUT_S = 5.0
REFER_OUTCOME_S = 30.0  # how long the transferee's new call may take to be answered (or refused)
DIGIT_S = 0.26  # one RFC 4733 key press on the stream: 160 ms of tone, the end repeats, the pause
INFO_DIGIT_S = 0.22  # between INFO digits: the 160 ms the body announces, and a pause


class LegOwner(Protocol):
    """What a leg needs from its user agent."""

    def send(self, message: SipRequest | SipResponse, peer: Peer) -> None: ...

    async def request_in_dialog(self, dialog: Dialog, request: SipRequest) -> SipResponse: ...

    def forget(self, leg: SipLeg) -> None: ...


class SipLeg:
    def __init__(
        self,
        owner: LegOwner,
        call: Call,
        dialog: Dialog,
        rtp: RtpStream,
        hang_up: HangUp,
        rtp_timeout_s: float,
    ) -> None:
        self.owner = owner
        self.call = call
        self.dialog = dialog
        self.rtp = rtp
        self.hang_up = hang_up
        self.rtp_timeout_s = rtp_timeout_s
        self.local_sdp = ""  # our last offer or answer, offered again to a re-INVITE without SDP
        self.sdp_session = int(time.time())
        self.sdp_version = 1
        self.remote_ended = False
        self._unacked: tuple[SipResponse, Peer, int] | None = None  # our 2xx, retransmitted until ACK
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.refer: ReferSubscription | None = None  # our transfer under way, whose NOTIFYs we await

    @property
    def call_id(self) -> str:
        return self.call.call_id

    # the Transport protocol

    def deliver_event(self, payload: dict[str, Any]) -> None:
        """A phone has no page: the events reach operators through the logs and the call's record."""

    def audio_flushed(self) -> None:
        """Nothing to do: the next frame the sender pulls is already silence."""

    async def close(self) -> None:
        """End the leg (idempotent): stop the media, and say BYE unless the peer already hung up."""
        if self._closed:
            return
        self._closed = True
        if self.refer is not None:
            self.refer.end("the call ended during the transfer")
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.rtp.close()
        if not self.remote_ended and (self.dialog.confirmed or self._unacked is not None):
            await self._say_bye()
        self.owner.forget(self)

    async def _say_bye(self) -> None:
        try:
            response = await asyncio.wait_for(
                self.owner.request_in_dialog(self.dialog, self.dialog.request("BYE")), BYE_TIMEOUT_S
            )
            event(log, "sip_bye_sent", call_id=self.call_id, status=response.status)
        except (TimeoutError, asyncio.CancelledError, OSError):
            event(log, "sip_bye_unanswered", logging.WARNING, call_id=self.call_id)

    # what the agent does to the line

    async def transfer(self, destination: str) -> None:
        """REFER the peer to `destination` and wait for the NOTIFY with the new call's final status: a 2xx
        ends this call as "transferred" (our BYE follows, RFC 3515 example flows); anything else raises
        LineActionFailed and the call goes on."""
        target = refer_to(transfer_destination(destination), self.dialog)
        try:
            SipUri.parse(target)
        except SipError as exc:
            raise LineActionFailed(f"cannot transfer to {destination!r}: {exc}") from None
        if self._closed or not self.dialog.confirmed:
            raise LineActionFailed("the call is not connected")
        if self.refer is not None:
            raise LineActionFailed("a transfer is already under way")
        subscription = self.refer = ReferSubscription()
        try:
            response = await self.owner.request_in_dialog(self.dialog, refer_request(self.dialog, target))
            if response.status >= 300:
                raise LineActionFailed(f"the transfer was refused: {response.status} {response.reason}")
            try:
                status, reason = await asyncio.wait_for(asyncio.shield(subscription.outcome), REFER_OUTCOME_S)
            except TimeoutError:
                raise LineActionFailed(f"the transfer had no outcome within {REFER_OUTCOME_S:g} s") from None
        finally:
            self.refer = None
        event(
            log,
            "sip_transfer",
            call_id=self.call_id,
            to=target,
            status=status,
            progress=",".join(map(str, subscription.progress)),
        )
        if not 200 <= status < 300:
            raise LineActionFailed(f"the transfer failed: {status} {reason}" if status else reason)
        self.hang_up("transferred")

    async def send_dtmf(self, digits: str) -> None:
        """Play `digits` to the peer: RFC 4733 events paced by the RTP clock, or one INFO per digit to a
        peer without telephone-event; returns once they have been sent."""
        keys = keypad_digits(digits)
        if self._closed:
            raise LineActionFailed("the call has ended")
        if not self.rtp.telephone_events:
            await self._send_info_digits(keys)
            return
        if self.rtp.remote is None:
            raise LineActionFailed("the call is on hold: no audio goes to the far end")
        for key in keys:
            if not self.rtp.send_dtmf(key):
                raise LineActionFailed("too many digits are waiting to be sent")
        deadline = time.monotonic() + len(keys) * DIGIT_S + 2.0
        while self.rtp.dtmf_pending:
            if self._closed or time.monotonic() > deadline:
                raise LineActionFailed("the digits could not all be sent")
            await asyncio.sleep(0.02)

    async def _send_info_digits(self, keys: str) -> None:
        for key in keys:
            info = self.dialog.request(
                "INFO",
                body=f"Signal={key}\r\nDuration=160\r\n".encode(),
                content_type="application/dtmf-relay",
            )
            response = await self.owner.request_in_dialog(self.dialog, info)
            if response.status >= 300:
                raise LineActionFailed(f"the far end refused the digits: {response.status} {response.reason}")
            await asyncio.sleep(INFO_DIGIT_S)

    # media

    def start_media(self) -> None:
        self._spawn(self._send_media())
        if self.rtp_timeout_s > 0:
            self._spawn(self._watch_rtp())

    async def _send_media(self) -> None:
        # The agent's first words wait until media may leave (the ACK, or the caller's RTP), rather
        # than being pulled into a stream that sends them nowhere.
        await self.rtp.wait_reachable()
        await send_paced(self.call.outbound.pull_frame, self.rtp.send_frame, call_id=self.call_id)

    async def _watch_rtp(self) -> None:
        # Counted while nothing may be sent too: a peer that never confirms nor sends is let go.
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            silent_s = time.monotonic() - self.rtp.last_received
            if silent_s > self.rtp_timeout_s and not self.rtp.on_hold:
                metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="rtp_timeout").inc()
                event(log, "rtp_timeout", logging.WARNING, call_id=self.call_id, silent_s=round(silent_s, 1))
                self.hang_up("rtp_timeout")
                return

    # the 2xx until its ACK (RFC 3261 13.3.1.4)

    def await_ack(self, response: SipResponse, peer: Peer) -> None:
        """Our 2xx went out (by its transaction): send it again until its ACK comes, or give up."""
        self._unacked = (response, peer, response.cseq[0])
        if not peer.reliable:
            self._spawn(self._retransmit_2xx(response, peer))
        else:
            self._spawn(self._await_ack())

    @property
    def has_pending_2xx(self) -> bool:
        return self._unacked is not None

    def on_ack(self, cseq: int, source: Peer) -> bool:
        """An ACK arrived from `source`; True when it acknowledged our pending 2xx.

        Only an ACK from where the INVITE came lets media go to the SDP's address: it carries the To-tag
        our 2xx took back to that source, so that source is a real peer and not a spoofed one, and the
        SDP is its own wish. An ACK from elsewhere (a proxy not on the route) confirms the dialog, and
        media waits for the caller's RTP.
        """
        if self._unacked is None or self._unacked[2] != cseq:
            return False
        self._unacked = None
        self.dialog.confirmed = True
        if _same_source(source, self.dialog.fallback):
            self.rtp.trust_sdp_address()
        else:
            event(log, "sip_ack_from_elsewhere", call_id=self.call_id, source=f"{source.host}:{source.port}")
        return True

    async def _retransmit_2xx(self, response: SipResponse, peer: Peer) -> None:
        interval, waited = T1, 0.0
        while waited < TIMEOUT:
            await asyncio.sleep(interval)
            waited += interval
            if self._unacked is None or self._unacked[0] is not response:
                return
            self.owner.send(response, peer)
            interval = min(2 * interval, T2)
        self._no_ack(response)

    async def _await_ack(self) -> None:
        pending = self._unacked
        await asyncio.sleep(TIMEOUT)
        if pending is not None and self._unacked is pending:
            self._no_ack(pending[0])

    def _no_ack(self, response: SipResponse) -> None:
        if self._unacked is None or self._unacked[0] is not response:
            return
        metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="no_ack").inc()
        event(log, "sip_no_ack", logging.WARNING, call_id=self.call_id)
        self.dialog.confirmed = True  # 13.3.1.4: the dialog is then ended with a BYE
        self.hang_up("no_ack")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _same_source(source: Peer, signalling: Peer) -> bool:
    """Whether a request came from the dialog's signalling source: the same address, and over UDP the
    same port (a connection-oriented peer may open a new connection for it)."""
    if source.transport != signalling.transport or source.host != signalling.host:
        return False
    return source.reliable or source.port == signalling.port
