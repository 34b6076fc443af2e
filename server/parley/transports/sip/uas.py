"""Inbound SIP calls (UAS): a new INVITE answered into a Call.

The user agent (`useragent.py`) receives the INVITE and hands it here once it is sure it is no re-INVITE.
Here: the source's flood limit (503), Max-Forwards (483), digest authentication (401), the offer's body
(488, 415), which agent answers the number (404), then the Call opens: 180 Ringing for
`--sip-ring-ms`, 200 OK with the SDP answer, retransmitted until the ACK (the leg, `leg.py`). A CANCEL
that comes while it rings (`SipUserAgent._on_cancel`) sets its `Setup.cancelled`, and the call is
recorded as cancelled, never answered. Outbound calls are dialled by `uac.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from parley import metrics
from parley.agent.agentfile import Agent, header_variable
from parley.agent.templates import MAX_VALUE_CHARS
from parley.call import Call
from parley.call_origin import Origin
from parley.log import event
from parley.ratelimit import Source
from parley.runtime import CallRefused, Runtime
from parley.sip_settings import SipSettings
from parley.transports.base import CallSetupFailed, HangUp, open_call
from parley.transports.sip.admission import SipAdmission
from parley.transports.sip.dialog import Dialog, DialogId
from parley.transports.sip.digest import DigestAuthenticator, Verdict
from parley.transports.sip.leg import SIP_RATE, LegOwner, SipLeg
from parley.transports.sip.media import RtpStream
from parley.transports.sip.message import SipRequest, make_response
from parley.transports.sip.sdes import key_if_secure
from parley.transports.sip.sdp import MediaNotEncrypted, SdpError, answer, parse_sdp
from parley.transports.sip.transactions import Key, Peer, ServerTransaction
from parley.transports.sip.uri import SipError, SipUri

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY"
USER_AGENT = "parley"


@dataclass
class Setup:
    """An INVITE being answered: what a CANCEL needs to stop it."""

    tx: ServerTransaction
    to_tag: str
    cancelled: asyncio.Event


class Answerer(LegOwner, Protocol):
    """What answering an INVITE needs of the user agent (useragent.py's `SipUserAgent`)."""

    settings: SipSettings
    runtime: Runtime
    admission: SipAdmission
    auth: DigestAuthenticator | None
    public_host: str
    legs: dict[DialogId, SipLeg]
    setups: dict[Key, Setup]  # INVITEs being answered, for a CANCEL

    def check_setup(self, source: Peer) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def open_rtp(self, call: Call, signalling: str | None) -> RtpStream: ...

    def contact(self, transport: str, target: str = "") -> str: ...

    def sent_by(self, transport: str = "UDP") -> str: ...


def receive_invite(ua: Answerer, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
    """A new call's INVITE (no To-tag): refused at once, or answered in a task of the user agent."""
    try:
        ua.check_setup(source)  # per source, or for --sip-allow trunks one limit they share
    except CallRefused as exc:  # a flood of INVITEs: refused before any work
        tx.respond(503, "Too Many Calls", headers=(("Retry-After", str(exc.retry_after_s)),))
        return
    tx.respond(100)
    if request.headers.get("Max-Forwards") == "0":
        tx.respond(483)
        return
    if not _authorised(ua, tx, request, source):
        return
    ua.spawn(_answer(ua, tx, request, source))


def _authorised(ua: Answerer, tx: ServerTransaction, request: SipRequest, source: Peer) -> bool:
    """Digest (22.4): the nonce is issued to the request's source address, and only answers from there."""
    if ua.auth is None:
        return True
    credentials = request.headers.get("Authorization")
    verdict = Verdict.BAD
    if credentials:
        verdict = ua.auth.verify(credentials, request.method, request.uri, source.host)
    if verdict is Verdict.OK:
        return True
    if credentials and verdict is Verdict.BAD:
        metrics.CALLS_REFUSED_TOTAL.labels(transport="sip", reason="unauthorised").inc()
    challenge = ua.auth.challenge(source.host, stale=verdict is Verdict.STALE)
    tx.respond(401, headers=(("WWW-Authenticate", challenge),))
    return False


async def _answer(ua: Answerer, tx: ServerTransaction, request: SipRequest, source: Peer) -> None:
    content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if not request.body:
        tx.respond(488, headers=(warning("an SDP offer in the INVITE is required"),))
        return
    if content_type != "application/sdp":
        tx.respond(415, headers=(("Accept", "application/sdp"),))
        return
    agent = ua.runtime.agent_for_sip_user(_request_user(request))
    if agent is None:
        tx.respond(404, headers=(warning("no agent answers this number"),))
        return
    setup = Setup(tx, tx.local_tag, asyncio.Event())
    if tx.final_sent:
        # A CANCEL handled before this task ran (both in one TCP read) got its 487 already: the
        # call must not be answered after that (9.2), only recorded as cancelled.
        setup.cancelled.set()
    ua.setups[tx.key] = setup
    try:
        offer = parse_sdp(request.body.decode("utf-8", errors="replace"))
        await open_call(
            ua.runtime,
            "sip",
            SIP_RATE,
            _answering(ua, setup, request, offer, source),
            origin=_origin(request, agent),
            agent=agent,
            source=None if ua.admission.trunks_only else Source(source.host),
        )
    except CallRefused as exc:
        tx.respond(503, to_tag=setup.to_tag, headers=(("Retry-After", str(exc.retry_after_s)),))
    except SdpError as exc:
        # Counted and logged: a phone turned away for its media would otherwise leave no trace.
        reason = "unencrypted" if isinstance(exc, MediaNotEncrypted) else "unusable_offer"
        metrics.CALLS_REFUSED_TOTAL.labels(transport="sip", reason=reason).inc()
        event(log, "sip_offer_refused", reason=reason, source=source.host, why=str(exc)[:200])
        tx.respond(488, to_tag=setup.to_tag, headers=(warning(str(exc)),))
    except CallSetupFailed:
        pass  # cancelled: the 487 went out with the CANCEL's 200
    except OSError as exc:
        event(log, "rtp_ports_exhausted", logging.ERROR, error=str(exc))
        tx.respond(503, to_tag=setup.to_tag, headers=(("Retry-After", "5"),))
    finally:
        ua.setups.pop(tx.key, None)


def _origin(request: SipRequest, agent: Agent) -> Origin:
    """From and To, and the SIP headers the agent file names as variables (X-Customer-Id ->
    x_customer_id): all the caller's word (agent/variables.py)."""
    headers = {header: request.headers.get(header) for header in agent.sip_headers}
    return Origin(
        str(request.from_addr.uri),
        str(request.to_addr.uri),
        caller_context={header_variable(h): v[:MAX_VALUE_CHARS] for h, v in headers.items() if v is not None},
    )


def _answering(ua: Answerer, setup: Setup, request: SipRequest, offer: Any, source: Peer) -> Any:
    async def connect(call: Call, hang_up: HangUp) -> SipLeg:
        call.set_state("ringing")
        rtp = await ua.open_rtp(call, source.host)
        try:
            return await _connect_answered(ua, call, hang_up, setup, request, offer, source, rtp)
        except BaseException:
            rtp.close()
            raise

    return connect


async def _connect_answered(
    ua: Answerer,
    call: Call,
    hang_up: HangUp,
    setup: Setup,
    request: SipRequest,
    offer: Any,
    source: Peer,
    rtp: RtpStream,
) -> SipLeg:
    session = int(time.time())
    sdp, negotiated = answer(
        offer,
        address=ua.public_host,
        port=rtp.local_port,
        session_id=session,
        session_version=1,
        srtp_key=key_if_secure(rtp.master_key, source.transport),
        require_srtp=ua.settings.sip_require_encryption,
    )
    rtp.configure(negotiated)
    contact = ua.contact(source.transport, request.uri)
    setup.tx.respond(180, to_tag=setup.to_tag, headers=(("Contact", contact),))
    ring_s = ua.settings.sip_ring_ms / 1000
    if ring_s > 0 and not setup.cancelled.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(setup.cancelled.wait(), ring_s)
    if setup.cancelled.is_set():
        raise CallSetupFailed("cancelled", "the caller cancelled before the answer")
    dialog = Dialog.as_uas(request, setup.to_tag, contact, ua.sent_by(source.transport), source)
    leg = SipLeg(ua, call, dialog, rtp, hang_up, ua.settings.rtp_timeout_s)
    leg.local_sdp, leg.sdp_session = sdp, session
    headers = [("Contact", contact), ("Allow", ALLOW), ("X-Parley-Call-Id", call.call_id)]
    headers += [("Record-Route", value) for value in request.headers.get_all("Record-Route")]
    ok = make_response(
        request,
        200,
        to_tag=setup.to_tag,
        headers=headers,
        body=sdp.encode(),
        content_type="application/sdp",
    )
    setup.tx.send_response(ok)
    ua.legs[dialog.id] = leg
    leg.await_ack(ok, setup.tx.peer)
    leg.start_media()
    event(
        log,
        "sip_answered",
        call_id=call.call_id,
        caller=call.origin.caller,
        codec=negotiated.codec,
        rtp=f"{negotiated.remote_address}:{negotiated.remote_port}",
    )
    return leg


def _request_user(request: SipRequest) -> str:
    """The request-URI's user (a number, an extension, an agent's name); '' when it has none."""
    try:
        return SipUri.parse(request.uri).user or ""
    except SipError:
        return ""


def warning(text: str) -> tuple[str, str]:
    """A Warning header (RFC 3261 20.43) carrying our reason; 399 is the miscellaneous code."""
    clean = text.replace('"', "'").replace("\r", " ").replace("\n", " ")[:200]
    return ("Warning", f'399 {USER_AGENT} "{clean}"')
