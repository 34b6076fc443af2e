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
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

from parley import metrics
from parley.call import Call
from parley.config import SettingsError, rtp_port_range, sip_address
from parley.log import event
from parley.runtime import CallRefused, Runtime
from parley.sip_settings import SipSettings
from parley.transports.sip.admission import SipAdmission
from parley.transports.sip.dial_policy import dial_policy
from parley.transports.sip.dialog import Dialog, DialogId
from parley.transports.sip.digest import DigestAuthenticator
from parley.transports.sip.dtmf import info_digit
from parley.transports.sip.endpoint import SipEndpoint, StreamLimits
from parley.transports.sip.latching import PeerSources
from parley.transports.sip.leg import SIP_RATE, SipLeg
from parley.transports.sip.media import RtpStream
from parley.transports.sip.message import (
    SipRequest,
    SipResponse,
    fix_via_received,
    make_response,
    new_tag,
)
from parley.transports.sip.refer import EVENT_PACKAGE, SIPFRAG, sipfrag_status, subscription_terminated
from parley.transports.sip.sdes import key_if_secure
from parley.transports.sip.sdp import SdpError, answer, parse_sdp
from parley.transports.sip.tls import client_context, server_context
from parley.transports.sip.transactions import (
    Key,
    Peer,
    ServerTransaction,
    TransactionLayer,
    TransactionsFull,
    server_key,
)
from parley.transports.sip.uas import ALLOW, USER_AGENT, Setup, receive_invite, warning
from parley.transports.sip.uri import SipError, SipUri

log = logging.getLogger(__name__)

KNOWN_UNSUPPORTED = frozenset({"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "REFER", "UPDATE", "PRACK"})
DTMF_TYPES = ("application/dtmf-relay", "application/dtmf")
TABLE_RETRY_AFTER = "10"  # seconds: transactions end within Timer J/H (32 s); most far sooner

# The reason phrase of an OPTIONS probe answered 503, by why a call would be refused (Runtime).
OPTIONS_REFUSING = {"draining": "Draining", "at capacity": "At Capacity", "shutting down": "Shutting Down"}


class SipUserAgent:
    def __init__(self, runtime: Runtime) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.settings: SipSettings = settings  # the SIP group is all its parts read
        self.bind_host, self.bind_port = sip_address(settings.sip)
        self.rtp_ports = rtp_port_range(settings.rtp_ports)
        self.admission = SipAdmission(
            settings.sip_allow,
            request_rate=settings.sip_request_rate,
            request_burst=settings.sip_request_burst,
            trunk_setup_rate=settings.sip_trunk_setup_rate,
            trunk_setup_burst=settings.sip_trunk_setup_burst,
        )
        self.tls_address = _tls_address(settings)
        self.endpoint = SipEndpoint(
            self._on_message,
            limits=StreamLimits(
                max_connections=settings.sip_max_connections,
                max_per_source=settings.sip_max_connections_per_source,
                idle_s=settings.sip_connection_idle_s,
            ),
            accepts=self.admission.allowed,
            keeps_open=self._carries_dialog,
            tls_server=(
                server_context(settings.sip_tls_cert_file, settings.sip_tls_key_file)
                if self.tls_address
                else None
            ),
            tls_client=_client_context(settings),
        )
        self.layer = TransactionLayer(
            self.endpoint.send,
            max_server=settings.sip_max_transactions,
            # A trunk on --sip-allow carries many callers from one address: only the cap in all holds.
            max_server_per_source=0
            if self.admission.trunks_only
            else settings.sip_max_transactions_per_source,
        )
        self.legs: dict[DialogId, SipLeg] = {}
        self.setups: dict[Key, Setup] = {}  # INVITEs being answered (uas.py), for a CANCEL
        self._tasks: set[asyncio.Task[None]] = set()
        self.allowed_networks = self.admission.allowed_networks
        self.auth = (
            DigestAuthenticator(settings.sip_realm, settings.sip_auth_user, settings.sip_auth_password)
            if settings.sip_auth_user
            else None
        )
        self.dial_policy = dial_policy(settings)  # where uac.py may dial out, and with which credentials
        self.public_host = settings.sip_public_address or _reachable_address(self.bind_host)

    # lifecycle

    async def start(self) -> None:
        await self.endpoint.start(self.bind_host, self.bind_port, self.tls_address)
        metrics.SIP_DIALOGS.set_function(lambda: len(self.legs))
        metrics.SIP_TRANSACTIONS.set_function(lambda: len(self.layer.server) + len(self.layer.client))
        event(log, "sip_listening", address=f"{self.bind_host}:{self.endpoint.port}", public=self.public_host)
        if self.tls_address is not None:
            event(log, "sip_tls_listening", address=f"{self.tls_address[0]}:{self.endpoint.tls_port}")

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

    def sent_by(self, transport: str = "UDP") -> str:
        host = f"[{self.public_host}]" if ":" in self.public_host else self.public_host
        port = self.endpoint.tls_port if transport == "TLS" else self.port
        # Dialling over TLS with no TLS listener: no port of ours to name; the peer answers on our
        # connection (RFC 3261 18.2.2).
        return f"{host}:{port}" if port else host

    def contact(self, transport: str, target: str = "") -> str:
        """Our Contact for a dialog or request over `transport`; `target` is the Request-URI that
        started it. RFC 3261 12.1.1: a SIPS target gets a SIPS Contact; a sip: one over TLS gets
        transport=tls, which more peers follow (baresip 1.0 cannot route to a sips: Contact)."""
        if transport == "TLS" and target[:5].lower() == "sips:":
            return f"<sips:{USER_AGENT}@{self.sent_by('TLS')}>"
        suffix = {"TCP": ";transport=tcp", "TLS": ";transport=tls"}.get(transport, "")
        return f"<sip:{USER_AGENT}@{self.sent_by(transport)}{suffix}>"

    # the LegOwner protocol

    def send(self, message: SipRequest | SipResponse, peer: Peer) -> None:
        self.endpoint.send(message, peer)

    async def request_in_dialog(self, dialog: Dialog, request: SipRequest) -> SipResponse:
        # Over TCP and TLS the dialog's own connection while it lasts (RFC 5923): a caller behind NAT,
        # or one with no certificate of its own, can be reached no other way.
        hop = dialog.fallback
        if not (hop.reliable and hop.transport == dialog.transport and self.endpoint.has_connection(hop)):
            hop = dialog.next_hop()
        return await self.layer.request(request, hop)

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
        if not self.admission.allowed(source.host):
            metrics.CALLS_REFUSED_TOTAL.labels(transport="sip", reason="forbidden").inc()
            if message.method != "ACK" and self._admitted(message, source):
                self.send(make_response(message, 403, "Source not allowed", to_tag=new_tag()), source)
            return
        # Responses go back where the request came from (RFC 3581: the received address and port),
        # never to a Via maddr or name: fix_via_received only records it for the hops behind us.
        fix_via_received(message, source.host, source.port)
        if message.method == "ACK":
            self.layer.absorb_ack(message)
            self._on_ack(message, source)
            return
        if self.layer.retransmission(message):
            return  # answered by its transaction
        in_dialog = self._in_dialog(message)
        if not in_dialog and not self._admitted(message, source):
            return
        try:
            tx = self.layer.new_server(message, source, in_dialog=in_dialog)
        except TransactionsFull as exc:
            metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="transactions_full").inc()
            event(
                log, "sip_transactions_full", logging.DEBUG, peer=f"{source.host}:{source.port}", why=str(exc)
            )
            # Answered without a transaction: one response per request, never retransmitted.
            busy = make_response(
                message, 503, to_tag=new_tag(), headers=(("Retry-After", TABLE_RETRY_AFTER),)
            )
            self.send(busy, source)
            return
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

    def _admitted(self, request: SipRequest, source: Peer) -> bool:
        """Count a request outside any dialog against its source's rate; False (counted): drop it.
        A new INVITE is counted by the set-up limits instead (uas.py)."""
        if request.method == "INVITE" and not request.to_tag:
            return True
        if self.admission.request_admitted(source.host):
            return True
        metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="rate_limited").inc()
        return False

    def _in_dialog(self, request: SipRequest) -> bool:
        """A request of a call we hold, or a CANCEL of an INVITE we are answering."""
        if request.method == "CANCEL":
            return self.layer.invite_transaction(request) is not None
        return bool(request.to_tag) and self._leg_for(request) is not None

    def _carries_dialog(self, peer: Peer) -> bool:
        """Whether a stream connection is a call's signalling path (kept open however quiet)."""
        return any(leg.dialog.fallback == peer for leg in self.legs.values())

    def check_setup(self, source: Peer) -> None:
        """Count a new call's set-up; CallRefused (counted) past the limit that applies. A trunk on
        --sip-allow brings many callers from one address: it is spared the limit per source, but the
        trunks share one, since a UDP source address is easily forged."""
        if not self.admission.trunks_only:
            self.runtime.check_source("sip", source.host)
            return
        wait_s = self.admission.trunk_setup_wait()
        if wait_s > 0:
            metrics.CALLS_REFUSED_TOTAL.labels(transport="sip", reason="rate_limited").inc()
            raise CallRefused(
                "rate_limited", "too many calls set up through the trunks, try again later", wait_s
            )

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
        elif self.settings.sip_require_encryption and source.transport != "TLS":
            metrics.CALLS_REFUSED_TOTAL.labels(transport="sip", reason="unencrypted").inc()
            fix = f"calls are taken over TLS only: sips:{_request_user(request)}@{self.sent_by('TLS')}"
            tx.respond(403, "Encryption Required", headers=(warning(fix),))
        else:
            receive_invite(self, tx, request, source)  # a new call (uas.py)

    def rtp_host(self) -> str:
        return self.bind_host

    async def open_rtp(self, call: Call, signalling: str | None) -> RtpStream:
        """A call's RTP port pair, its audio and digits going to the call; RTP is taken from the SDP's
        address, the `signalling` peer's and the trunk networks on --sip-allow (latching.py)."""
        return await RtpStream.open(
            self.rtp_host(),
            self.rtp_ports,
            on_audio=functools.partial(call.push_audio, rate=SIP_RATE),
            on_dtmf=call.dtmf_received,
            sources=PeerSources(signalling, tuple(self.allowed_networks)),
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
                    srtp_key=key_if_secure(leg.rtp.master_key, leg.dialog.transport),
                    require_srtp=self.settings.sip_require_encryption,
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
        contact = leg.dialog.local_contact
        ok = make_response(
            request,
            200,
            headers=(("Contact", contact), ("Allow", ALLOW)),
            body=body.encode(),
            content_type="application/sdp",
        )
        tx.send_response(ok)
        leg.await_ack(ok, tx.peer)

    def _on_ack(self, request: SipRequest, source: Peer) -> None:
        leg = self._leg_for(request)
        if leg is not None:
            leg.on_ack(request.cseq[0], source)

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
            ("Contact", self.contact(source.transport, request.uri)),
        )
        # Out of any dialog, OPTIONS is a proxy's health probe (Kamailio's dispatcher pings its
        # destinations): an instance that would refuse a call now (draining, at capacity, loading) says
        # so, and the proxy sends new calls elsewhere until it answers 200 again.
        refusing = None if request.to_tag else self.runtime.not_ready_reason()
        if refusing is not None:
            tx.respond(503, OPTIONS_REFUSING.get(refusing, "Service Unavailable"), headers=headers)
            return
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


def _tls_address(settings: SipSettings) -> tuple[str, int] | None:
    """Where --sip-tls listens (port 0: a free one), or None."""
    if settings.sip_require_encryption and not settings.sip_tls:
        raise SettingsError("--sip-require-encryption needs --sip-tls (HOST:PORT, e.g. 0.0.0.0:5061)")
    if not settings.sip_tls:
        return None
    host, _, port = settings.sip_tls.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SettingsError(f"--sip-tls must be HOST:PORT (5061 is usual), not {settings.sip_tls!r}")
    return host.strip("[]"), int(port)


def _client_context(settings: SipSettings) -> Callable[[], ssl.SSLContext]:
    """The context of outbound TLS connections, made at the first one (it reads the system's CAs)."""
    make = functools.cache(
        functools.partial(
            client_context, settings.sip_tls_ca_file, settings.sip_tls_cert_file, settings.sip_tls_key_file
        )
    )
    if settings.sip_tls_ca_file:
        make()  # a wrong file fails the start, not the first call
    return make


def _request_user(request: SipRequest) -> str:
    try:
        return SipUri.parse(request.uri).user or USER_AGENT
    except SipError:
        return USER_AGENT
