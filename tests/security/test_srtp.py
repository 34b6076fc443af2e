"""SDES-SRTP (issue 42, item 7, the media half): a call over TLS carries its voice encrypted and takes only
authenticated packets; keys never travel over plain signalling; the setting that requires encryption
refuses a plain offer.

The caller's SRTP is libsrtp driven directly (pylibsrtp), not the service's wrapper of it.
"""

from __future__ import annotations

import base64
import re
import secrets

from pylibsrtp import Policy, Session

from parley.app import SIP
from tests.security.conftest import (
    LOCAL,
    Service,
    Start,
    dialled_over_tls,
    eventually,
    rtp_packet,
    sdp_audio_port,
)
from tests.security.tls_peer import Certificate, start_tls, tls_wire
from tests.sip_wire import Dialogue, RtpPeer, SipWire, offer

SUITE = "AES_CM_128_HMAC_SHA1_80"


def savp_offer(rtp_port: int, key: bytes) -> str:
    """The caller's offer as a phone writes it: RTP/SAVP with one inline key (RFC 4568 9.1)."""
    text = offer(rtp_port).replace("RTP/AVP", "RTP/SAVP")
    return text + f"a=crypto:1 {SUITE} inline:{base64.b64encode(key).decode()}\r\n"


def answered_key(body: bytes) -> bytes:
    match = re.search(
        rb"^a=crypto:1 " + SUITE.encode() + rb" inline:([A-Za-z0-9+/=]+)\r$", body, re.MULTILINE
    )
    assert match, body
    return base64.b64decode(match.group(1))


async def invite(service: Service, wire: SipWire, target: str, sdp: str) -> tuple[Dialogue, int]:
    d = service.dialogue(wire)
    d.target = target
    wire.send(d.invite(sdp))
    final = await wire.final(method="INVITE", call_id=d.call_id, timeout=10.0)
    return d, final.status


async def test_a_call_over_tls_speaks_srtp_and_takes_only_authenticated_packets(
    start: Start, certificate: Certificate
) -> None:
    service, tls_port = await start_tls(start, certificate)
    wire = await tls_wire(service, tls_port, certificate)
    caller: RtpPeer = await service.rtp()
    our_key = secrets.token_bytes(30)
    d = service.dialogue(wire)
    d.target = f"sips:agent@{LOCAL}:{tls_port}"
    wire.send(d.invite(savp_offer(caller.port, our_key)))
    ok = await wire.response(200, call_id=d.call_id, timeout=10.0)
    assert re.search(rb"^m=audio \d+ RTP/SAVP 0 101\r$", ok.body, re.MULTILINE), ok.body
    agent_key = answered_key(ok.body)
    assert agent_key != our_key
    d.learn(ok)
    wire.send(d.ack())
    agent_port = sdp_audio_port(ok.body)

    forged = await service.counter(
        "parley_transport_errors_total", transport="sip", reason="srtp_unauthenticated"
    )
    for sequence in range(3):
        caller.send(rtp_packet(sequence), agent_port)  # plain RTP, as anyone without the key could send
    sending = Session(
        Policy(our_key, Policy.SSRC_ANY_OUTBOUND, srtp_profile=Policy.SRTP_PROFILE_AES128_CM_SHA1_80)
    )
    for sequence in range(3, 13):
        caller.send(sending.protect(rtp_packet(sequence)), agent_port)

    async def refused() -> bool:
        now = await service.counter(
            "parley_transport_errors_total", transport="sip", reason="srtp_unauthenticated"
        )
        return now - forged >= 3

    await eventually(refused, what="the plain packets counted as unauthenticated")
    (leg,) = service.client.app[SIP].legs.values()

    async def heard() -> bool:
        return leg.rtp.received == 10 and leg.rtp.encrypted

    await eventually(heard, what="the caller's SRTP, and only it, heard by the agent")
    await eventually(lambda: _arrived(caller), what="the agent's SRTP")
    receiving = Session(
        Policy(agent_key, Policy.SSRC_ANY_INBOUND, srtp_profile=Policy.SRTP_PROFILE_AES128_CM_SHA1_80)
    )
    data, source, _ = caller.packets[0]
    assert source == (LOCAL, agent_port)
    plain = receiving.unprotect(data)  # raises unless the agent's key authenticates it
    assert len(data) == len(plain) + 10 and plain[1] & 0x7F == 0  # an 80-bit tag; PCMU inside
    assert data[12:] != plain[12:]
    wire.send(d.request("BYE"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    await service.still_serves()


async def test_keys_offered_over_plain_signalling_are_refused_with_488(start: Start) -> None:
    # RFC 4568 8.3: whoever reads an INVITE over UDP or TCP would read the call's keys in it.
    service = await start()
    before = await service.counter("parley_calls_refused_total", transport="sip", reason="unencrypted")
    for transport in ("UDP", "TCP"):
        wire = await service.wire(transport)
        d = service.dialogue(wire)
        wire.send(d.invite(savp_offer(4000, secrets.token_bytes(30))))
        refused = await wire.final(method="INVITE", call_id=d.call_id, timeout=10.0)
        assert refused.status == 488
        assert "only over TLS" in (refused.headers.get("Warning") or "")
        wire.send(d.ack(branch_id=d.invite_branch, to_tag=refused.to_tag))
    # An operator sees the phones turned away for their media.
    refused = await service.counter("parley_calls_refused_total", transport="sip", reason="unencrypted")
    assert refused - before == 2  # the counters are the process's, shared by every test
    await service.still_serves()


async def test_required_encryption_refuses_a_plain_offer_even_over_tls(
    start: Start, certificate: Certificate
) -> None:
    service, tls_port = await start_tls(start, certificate, sip_require_encryption=True)
    wire = await tls_wire(service, tls_port, certificate)
    caller = await service.rtp()
    before = await service.counter("parley_calls_refused_total", transport="sip", reason="unencrypted")
    d, status = await invite(service, wire, f"sips:agent@{LOCAL}:{tls_port}", offer(caller.port))
    assert status == 488
    refusals = await service.counter("parley_calls_refused_total", transport="sip", reason="unencrypted")
    assert refusals - before == 1  # an operator sees the phones turned away for their media
    refused = wire.responses(488, call_id=d.call_id)[0]
    assert "encrypted media is required" in (refused.headers.get("Warning") or "")
    wire.send(d.ack(branch_id=d.invite_branch, to_tag=refused.to_tag))
    d, status = await invite(
        service, wire, f"sips:agent@{LOCAL}:{tls_port}", savp_offer(caller.port, secrets.token_bytes(30))
    )
    assert status == 200
    d.learn(wire.responses(200, call_id=d.call_id)[0])
    wire.send(d.ack())
    wire.send(d.request("BYE"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    assert await service.options() == 200  # health checks stay plain


async def test_a_call_dialled_over_tls_offers_srtp_and_speaks_it(
    start: Start, certificate: Certificate
) -> None:
    async with dialled_over_tls(start, certificate) as (service, wire, invite, port):
        phone = await service.rtp()
        assert re.search(rb"^m=audio \d+ RTP/SAVP ", invite.body, re.MULTILINE), invite.body
        agent_key = answered_key(invite.body)  # our offer's line 1: the suite the phone picks
        wire.reply(
            invite,
            200,
            to_tag="callee",
            headers=[f"Contact: <sips:bob@{LOCAL}:{port}>"],
            body=savp_offer(phone.port, secrets.token_bytes(30)),  # one line, tag 1, the phone's key
            content_type="application/sdp",
        )
        await wire.request("ACK")
        await eventually(lambda: _arrived(phone), what="the agent's SRTP at the phone")
        receiving = Session(
            Policy(agent_key, Policy.SSRC_ANY_INBOUND, srtp_profile=Policy.SRTP_PROFILE_AES128_CM_SHA1_80)
        )
        receiving.unprotect(phone.packets[0][0])  # raises unless our offered key protects it
        await service.still_serves()


async def _arrived(peer: RtpPeer) -> bool:
    return bool(peer.packets)
