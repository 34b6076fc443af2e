"""The SIP user agent of the service: a trunk endpoint that answers calls into the agent (UAS).

Requests are matched to transactions (retransmissions absorbed there), then handled by method:
a new INVITE is answered into a Call by `uas.py` (100, 180, then 200 with the SDP answer, retransmitted
until the ACK), CANCEL ends a call still ringing (200, then 487), BYE ends a call, a re-INVITE changes its
media (hold, a new address or codec), INFO carries DTMF, OPTIONS answers health checks, NOTIFY reports
on a transfer we asked for with REFER (RFC 3515; refer.py). Other methods get 405 (known) or 501.
Outbound calls are dialled by `parley.transports.sip.uac`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Coroutine
from typing import Any

from parley import metrics
from parley.call import Call
from parley.config import rtp_port_range, sip_address
from parley.log import event
from parley.runtime import Runtime
from parley.transports.sip.dialog import Dialog, DialogId
from parley.transports.sip.digest import DigestAuthenticator
from parley.transports.sip.dtmf import info_digit
from parley.transports.sip.endpoint import SipEndpoint
from parley.transports.sip.leg import SIP_RATE, SipLeg
from parley.transports.sip.media import RtpStream
from parley.transports.sip.message import (
    SipRequest,
    SipResponse,
    fix_via_received,
    make_response,
    new_tag,
    response_destination,
)
from parley.transports.sip.refer import EVENT_PACKAGE, SIPFRAG, sipfrag_status, subscription_terminated
from parley.transports.sip.sdp import SdpError, answer, parse_sdp
from parley.transports.sip.transactions import Key, Peer, ServerTransaction, TransactionLayer, server_key
from parley.transports.sip.uas import ALLOW, USER_AGENT, Setup, receive_invite, warning

log = logging.getLogger(__name__)

KNOWN_UNSUPPORTED = frozenset({"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "REFER", "UPDATE", "PRACK"})
DTMF_TYPES = ("application/dtmf-relay", "application/dtmf")


class SipUserAgent:
    def __init__(self, runtime: Runtime) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.settings = settings
        self.bind_host, self.bind_port = sip_address(settings.sip)
        self.rtp_ports = rtp_port_range(settings.rtp_ports)
        self.endpoint = SipEndpoint(self._on_message)
        self.layer = TransactionLayer(self.endpoint.send)
        self.legs: dict[DialogId, SipLeg] = {}
        self.setups: dict[Key, Setup] = {}  # INVITEs being answered (uas.py), for a CANCEL
        self._tasks: set[asyncio.Task[None]] = set()
        self.allowed_networks = [ipaddress.ip_network(net, strict=False) for net in settings.sip_allow]
        self.auth = (
            DigestAuthenticator(settings.sip_realm, settings.sip_auth_user, settings.sip_auth_password)
            if settings.sip_auth_user
            else None
        )
        self.public_host = settings.sip_public_address or _reachable_address(self.bind_host)

    # lifecycle

    async def start(self) -> None:
        await self.endpoint.start(self.bind_host, self.bind_port)
        metrics.SIP_DIALOGS.set_function(lambda: len(self.legs))
        metrics.SIP_TRANSACTIONS.set_function(lambda: len(self.layer.server) + len(self.layer.client))
        event(log, "sip_listening", address=f"{self.bind_host}:{self.endpoint.port}", public=self.public_host)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.layer.close()
        await self.endpoint.close()

    @property
    def port(self) -> int:
        return self.endpoint.port

    # addresses we put in messages

    def sent_by(self) -> str:
        host = f"[{self.public_host}]" if ":" in self.public_host else self.public_host
        return f"{host}:{self.port}"

    def contact(self, transport: str) -> str:
        suffix = ";transport=tcp" if transport == "TCP" else ""
        return f"<sip:{USER_AGENT}@{self.sent_by()}{suffix}>"

    # the LegOwner protocol

    def send(self, message: SipRequest | SipResponse, peer: Peer) -> None:
        self.endpoint.send(message, peer)

    async def request_in_dialog(self, dialog: Dialog, request: SipRequest) -> SipResponse:
        return await self.layer.request(request, dialog.next_hop())

    def forget(self, leg: SipLeg) -> None:
        if self.legs.get(leg.dialog.id) is leg:
            del self.legs[leg.dialog.id]

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # receiving

    def _on_message(self, message: SipRequest | SipResponse, source: Peer) -> None:
        if isinstance(message, SipResponse):
            self.layer.on_response(message)
            return
        if not self._allowed(source.host):
            metrics.CALLS_REFUSED_TOTAL.labels(transport="sip", reason="forbidden").inc()
            if message.method != "ACK":
                self.send(make_response(message, 403, "Source not allowed", to_tag=new_tag()), source)
            return
        via = fix_via_received(message, source.host, source.port)
        reply_to = source if source.reliable else Peer("UDP", *response_destination(via, "UDP"))
        tx = self.layer.server_transaction(message, reply_to)
        if message.method == "ACK":
            self._on_ack(message)
            return
        if tx is None:
            return  # a retransmission, answered by its transaction
        handler = {
            "INVITE": self._on_invite,
            "CANCEL": self._on_cancel,
            "BYE": self._on_bye,
            "OPTIONS": self._on_options,
            "INFO": self._on_info,
            "NOTIFY": self._on_notify,
        }.get(message.method)
        if handler is not None:
            handler(tx, message, source)
        elif message.method in KNOWN_UNSUPPORTED:
            tx.respond(405, headers=(("Allow", ALLOW),))
        else:
            tx.respond(501, headers=(("Allow", ALLOW),))

    def _allowed(self, host: str) -> bool:
        if not self.allowed_networks:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.allowed_networks)

    def _dialog_leg(self, tx: ServerTransaction, request: SipRequest) -> SipLeg | None:
        """The call an in-dialog request belongs to; None, answered, when there is none (481) or the
        request is out of order (500, RFC 3261 12.2.2)."""
        leg = self._leg_for(request) if request.to_tag else None
        if leg is None:
            tx.respond(481)
            return None
        if not leg.dialog.accepts(request):
            tx.respond(500, "CSeq out of order")
            return None
        return leg

    def _leg_for(self, request: SipRequest) -> SipLeg | None:
        return self.legs.get((request.call_id, request.to_tag or "", request.from_tag or ""))

    # INVITE: a new call

    def _on_invite(self, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
        if request.to_tag:
            self._on_reinvite(tx, request)
        else:
            receive_invite(self, tx, request, source)  # a new call (uas.py)

    def rtp_host(self) -> str:
        return self.bind_host

    async def open_rtp(self, call: Call) -> RtpStream:
        """A call's RTP port pair, its audio and digits going to the call."""
        return await RtpStream.open(
            self.rtp_host(),
            self.rtp_ports,
            on_audio=functools.partial(call.push_audio, rate=SIP_RATE),
            on_dtmf=call.dtmf_received,
        )

    # in-dialog requests

    def _on_reinvite(self, tx: ServerTransaction, request: SipRequest) -> None:
        leg = self._dialog_leg(tx, request)
        if leg is None:
            return
        if leg.has_pending_2xx:
            tx.respond(491)  # 14.2: our previous answer still waits for its ACK
            return
        body = leg.local_sdp
        if request.body:
            try:
                offer = parse_sdp(request.body.decode("utf-8", errors="replace"))
                leg.sdp_version += 1
                body, negotiated = answer(
                    offer,
                    address=self.public_host,
                    port=leg.rtp.local_port,
                    session_id=leg.sdp_session,
                    session_version=leg.sdp_version,
                )
            except SdpError as exc:
                tx.respond(488, headers=(warning(str(exc)),))
                return
            leg.rtp.configure(negotiated)
            leg.local_sdp = body
            event(
                log,
                "sip_media_changed",
                call_id=leg.call_id,
                direction=negotiated.direction,
                held=not negotiated.sends,
                rtp=f"{negotiated.remote_address}:{negotiated.remote_port}",
            )
        contact = self.contact(leg.dialog.transport)
        ok = make_response(
            request,
            200,
            headers=(("Contact", contact), ("Allow", ALLOW)),
            body=body.encode(),
            content_type="application/sdp",
        )
        tx.send_response(ok)
        leg.await_ack(ok, tx.peer)

    def _on_ack(self, request: SipRequest) -> None:
        leg = self._leg_for(request)
        if leg is not None:
            leg.on_ack(request.cseq[0])

    def _on_cancel(self, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
        invite = self.layer.invite_transaction(request)
        if invite is None:
            tx.respond(481)
            return
        tx.respond(200, to_tag=invite.local_tag)  # 9.2: the To-tag of the INVITE's responses
        if invite.final_sent:
            return  # too late: the call was answered (or refused) already
        invite.respond(487)
        setup = self.setups.get(server_key(request, "INVITE"))
        if setup is not None:
            setup.cancelled.set()
        event(log, "sip_cancelled", sip_call_id=request.call_id)

    def _on_bye(self, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
        leg = self._dialog_leg(tx, request)
        if leg is None:
            return
        tx.respond(200)
        leg.remote_ended = True
        leg.hang_up("hangup")

    def _on_options(self, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
        if request.to_tag and self._dialog_leg(tx, request) is None:
            return
        headers = (
            ("Allow", ALLOW),
            ("Accept", "application/sdp"),
            ("Contact", self.contact(source.transport)),
        )
        tx.respond(200, headers=headers)

    def _on_info(self, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
        leg = self._dialog_leg(tx, request)
        if leg is None:
            return
        content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type not in DTMF_TYPES:
            tx.respond(415, headers=(("Accept", ", ".join(DTMF_TYPES)),))
            return
        digit = info_digit(content_type, request.body.decode("utf-8", errors="replace"))
        if digit is None:
            tx.respond(400, "No DTMF signal in the body")
            return
        tx.respond(200)
        leg.call.dtmf_received(digit)

    def _on_notify(self, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
        """A NOTIFY of the subscription our REFER made (RFC 3515 2.4.4); any other matches no subscription
        here: 481, as RFC 6665 asks of a subscriber."""
        leg = self._dialog_leg(tx, request)
        if leg is None:
            return
        if (request.headers.get("Event") or "").split(";")[0].strip().lower() != EVENT_PACKAGE:
            tx.respond(489)  # Bad Event (RFC 6665): a package we did not subscribe to
            return
        subscription = leg.refer
        if subscription is None:
            tx.respond(481)
            return
        content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        status, reason = None, ""
        if request.body and content_type == SIPFRAG:
            try:
                status, reason = sipfrag_status(request.body)
            except ValueError as exc:
                tx.respond(400, "Bad sipfrag", headers=(warning(str(exc)),))
                return
        tx.respond(200)
        subscription.notified(
            status, reason, subscription_terminated(request.headers.get("Subscription-State"))
        )


def _reachable_address(host: str) -> str:
    """A concrete local address for a wildcard bind: the one the default route leaves from."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    family = socket.AF_INET6 if host == "::" else socket.AF_INET
    probe = "2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1"  # documentation address
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((probe, 9))  # UDP connect sends nothing; it only picks the route
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1" if family == socket.AF_INET else "::1"
