"""Outbound SIP calls (UAC): the agent dials a number or a SIP address and speaks first when answered.

`dial` returns the new call's id as soon as the call exists; the INVITE goes on in the background.
Busy, no answer (within --sip-ring-timeout-s, then CANCEL), and refusals end the call with that outcome,
which its record and `parley_calls_total{transport="sip",outcome}` keep. Every dial-out passes the
destination policy first (dial_policy.py: the trunks, the number prefixes, the hourly budget). A 401/407
is answered once, with the outbound credentials, and only when the call went to their trunk and the
challenge is in their realm; any other challenge ends the call as rejected.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
import time
from collections.abc import Mapping

from parley.call import Call
from parley.call_origin import Origin
from parley.log import event
from parley.transports.base import CallSetupFailed, HangUp, open_call
from parley.transports.sip.dial_policy import DialPolicy, Withheld
from parley.transports.sip.dialog import Dialog
from parley.transports.sip.leg import SIP_RATE, SipLeg
from parley.transports.sip.media import RtpStream
from parley.transports.sip.message import SipRequest, SipResponse, new_branch, new_call_id, new_tag
from parley.transports.sip.sdes import key_if_secure
from parley.transports.sip.sdp import SdpError, negotiated_from_answer, offer, parse_sdp
from parley.transports.sip.transactions import ClientTransaction, Peer
from parley.transports.sip.uas import ALLOW
from parley.transports.sip.uri import SipError, SipUri, bare_host, default_port, uri_transport
from parley.transports.sip.useragent import SipUserAgent

log = logging.getLogger(__name__)

CANCEL_WAIT_S = 5.0
RESOLVE_TIMEOUT_S = 5.0


class DialError(ValueError):
    """The destination cannot be dialled (the API answers 400)."""


def parse_destination(to: str) -> SipUri:
    try:
        uri = SipUri.parse(to)
    except SipError as exc:
        raise DialError(f"not a SIP URI: {exc}") from None
    if uri.scheme not in ("sip", "sips") or not uri.host:
        raise DialError(
            "the destination must be a sip: or sips: URI with a host, e.g. sip:alice@192.0.2.10:5060"
        )
    try:
        transport = uri_transport(uri)
    except SipError as exc:
        raise DialError(str(exc)) from None
    if transport not in ("UDP", "TCP", "TLS"):
        raise DialError("only UDP, TCP and TLS (sips: or ;transport=tls) are supported")
    return uri


async def dial(ua: SipUserAgent, to: str, context: Mapping[str, str] | None = None) -> Call:
    """Start an outbound call; returns once the call exists (dialling). `context`: the call's variables,
    the dialler's word as a call token's is (its agent's templates read them: the voicemail message's
    `{name}`). Raises DialError, DialRefused (the destination policy) or CallRefused."""
    uri = parse_destination(to)
    ua.dial_policy.admit(uri)
    created: asyncio.Future[Call] = asyncio.get_running_loop().create_future()

    async def connect(call: Call, hang_up: HangUp) -> SipLeg:
        created.set_result(call)
        call.set_state("dialing")
        family = socket.AF_INET6 if ":" in ua.bind_host else socket.AF_INET
        address = await _resolved(bare_host(uri.host), family)
        rtp = await ua.open_rtp(call, address)
        try:
            return await _invite(ua, call, hang_up, uri, address, rtp)
        except BaseException:
            rtp.close()
            raise

    async def run() -> None:
        try:
            caller = f"sip:{ua.settings.sip_caller_id}@{ua.sent_by()}"
            origin = Origin(caller, str(uri), token_context=dict(context or {}), outbound=True)
            await open_call(ua.runtime, "sip", SIP_RATE, connect, origin=origin)
        except CallSetupFailed as exc:
            event(log, "sip_dial_failed", call_id=created.result().call_id, outcome=exc.outcome, why=str(exc))
        except Exception as exc:
            if not created.done():
                created.set_exception(exc)
                return
            log.exception("sip_dial_error", extra={"call_id": created.result().call_id})

    ua.spawn(run())
    return await created


async def _invite(
    ua: SipUserAgent, call: Call, hang_up: HangUp, uri: SipUri, address: str, rtp: RtpStream
) -> SipLeg:
    transport = uri_transport(uri)
    # Over TLS the certificate must name the host dialled, not the address it resolved to.
    peer = Peer(transport, address, uri.port or default_port(transport), name=bare_host(uri.host))
    contact = ua.contact(transport, str(uri))
    session = int(time.time())
    srtp_key = key_if_secure(rtp.master_key, transport)  # SDES keys go only over TLS (RFC 4568 8.3)
    if srtp_key is None and ua.settings.sip_require_encryption:
        raise CallSetupFailed("failed", "encrypted media is required: dial a sips: or ;transport=tls address")
    sdp = offer(
        address=ua.public_host, port=rtp.local_port, session_id=session, session_version=1, srtp_key=srtp_key
    )
    invite = _initial_invite(ua, uri, transport, contact, sdp)
    settings = ua.settings
    for attempt in range(2):
        tx = ua.layer.start_client(invite, peer, functools.partial(_provisional, call))
        response = await _final_or_cancel(ua, tx, peer, settings.sip_ring_timeout_s)
        if response.status not in (401, 407) or attempt == 1:
            break
        try:
            invite = _with_credentials(ua.dial_policy, uri, invite, response)
        except (Withheld, SipError) as exc:
            event(log, "sip_dial_challenge_unanswered", logging.WARNING, call_id=call.call_id, why=str(exc))
            break
    if response.status >= 300:
        raise CallSetupFailed(_outcome(response.status), f"{response.status} {response.reason}")
    dialog = Dialog.as_uac(invite, response, contact, ua.sent_by(transport), peer)
    tx.ack = dialog.ack(invite.cseq[0])
    ua.send(tx.ack, dialog.next_hop())
    leg = SipLeg(ua, call, dialog, rtp, hang_up, settings.rtp_timeout_s)
    leg.local_sdp, leg.sdp_session = sdp, session
    ua.legs[dialog.id] = leg
    try:
        negotiated = negotiated_from_answer(sdp, parse_sdp(response.body.decode("utf-8", errors="replace")))
    except SdpError as exc:
        await leg.close()  # says BYE: the peer answered with media we cannot use
        raise CallSetupFailed("failed", f"unusable SDP answer: {exc}") from None
    rtp.configure(negotiated)
    rtp.trust_sdp_address()  # we chose this peer and dialled it, and our ACK is sent: its SDP is its own
    leg.start_media()
    event(log, "sip_dial_answered", call_id=call.call_id, to=str(uri), codec=negotiated.codec)
    return leg


def _initial_invite(ua: SipUserAgent, uri: SipUri, transport: str, contact: str, sdp: str) -> SipRequest:
    invite = SipRequest("INVITE", str(uri))
    invite.headers.add("Via", f"SIP/2.0/{transport} {ua.sent_by(transport)};branch={new_branch()};rport")
    invite.headers.add("Max-Forwards", "70")
    invite.headers.add("From", f"<sip:{ua.settings.sip_caller_id}@{ua.sent_by()}>;tag={new_tag()}")
    to = SipUri(uri.host, uri.user, uri.port)  # the address of record, without URI parameters
    invite.headers.add("To", f"<{to}>")
    invite.headers.add("Call-ID", new_call_id(ua.public_host))
    invite.headers.add("CSeq", "1 INVITE")
    invite.headers.add("Contact", contact)
    invite.headers.add("Allow", ALLOW)
    invite.headers.add("Content-Type", "application/sdp")
    invite.body = sdp.encode()
    return invite


async def _resolved(host: str, family: socket.AddressFamily) -> str:
    """An address for `host`: a literal as it is, a name looked up off the event loop (a socket's own
    lookup inside sendto would stall every call while DNS answers)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        found = await asyncio.wait_for(
            loop.getaddrinfo(host, None, family=family, type=socket.SOCK_DGRAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        raise CallSetupFailed("failed", f"cannot resolve {host}: {exc or 'timed out'}") from None
    return str(found[0][4][0])


def _with_credentials(
    policy: DialPolicy, uri: SipUri, invite: SipRequest, challenge: SipResponse
) -> SipRequest:
    """The INVITE again with credentials (22.2): a new branch and the next CSeq. Withheld or SipError
    say why the challenge is not answered."""
    credentials = policy.credentials_for(uri)
    header = "WWW-Authenticate" if challenge.status == 401 else "Proxy-Authenticate"
    value = credentials.answer(challenge.headers.get_all(header), "INVITE", invite.uri)
    again = SipRequest("INVITE", invite.uri, invite.headers.copy(), invite.body)
    via = again.headers.get_all("Via")[0]
    again.headers.set("Via", via.split(";branch=")[0] + f";branch={new_branch()};rport")
    again.headers.set("CSeq", f"{invite.cseq[0] + 1} INVITE")
    answer_header = "Authorization" if challenge.status == 401 else "Proxy-Authorization"
    again.headers.set(answer_header, value)
    return again


async def _final_or_cancel(ua: SipUserAgent, tx: ClientTransaction, peer: Peer, ring_s: float) -> SipResponse:
    """The INVITE's final response; after `ring_s` without one, CANCEL (9.1) and wait for the 487."""
    try:
        return await asyncio.wait_for(asyncio.shield(tx.final), ring_s)
    except TimeoutError:
        pass
    cancel = SipRequest("CANCEL", tx.request.uri)
    cancel.headers.add("Via", tx.request.headers.get_all("Via")[0])
    for name in ("Max-Forwards", "From", "To", "Call-ID"):
        cancel.headers.add(name, tx.request.required(name))
    cancel.headers.add("CSeq", f"{tx.request.cseq[0]} CANCEL")
    ua.spawn(_send_cancel(ua, cancel, peer))
    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
        response = await asyncio.wait_for(asyncio.shield(tx.final), CANCEL_WAIT_S)
        if response.status < 300:
            return response  # answered while the CANCEL crossed it: the call goes ahead
    raise CallSetupFailed("no_answer", f"no answer within {ring_s:g} s")


async def _send_cancel(ua: SipUserAgent, cancel: SipRequest, peer: Peer) -> None:
    await ua.layer.request(cancel, peer)


def _provisional(call: Call, response: SipResponse) -> None:
    if response.status in (180, 183):
        call.set_state("ringing")


def _outcome(status: int) -> str:
    if status in (486, 600):
        return "busy"
    if status in (408, 480):
        return "no_answer"
    if status == 487:
        return "cancelled"
    return "rejected"
