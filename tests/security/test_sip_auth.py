"""Digest over real sockets (issue 42, item 6).

Inbound: what a caller proves to us. A captured Authorization is worth nothing a second time, nor from
another address, nor without qop (no nonce count, so no replay check). Outbound: what we prove to a
trunk. Dial-out answers a challenge only with credentials of its own, only for the trunk they belong to
and only in their realm; the inbound credentials never leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from parley.http_api import SIP
from parley.transports.sip.digest import DigestAuthenticator, Verdict, authorization_for, parse_auth
from parley.transports.sip.message import SipResponse, parse_message
from parley.transports.sip.uri import SipError
from tests.security.conftest import Service, Start, eventually, rtp_packet, sdp_audio_port
from tests.sip_wire import LOCAL, SipWire, offer, token

USER, PASSWORD = "caller", "inbound secret"
TRUNK_USER, TRUNK_PASSWORD, TRUNK_REALM = "parley-out", "trunk secret", "carrier.example"


async def challenged(service: Service, wire: SipWire) -> str:
    """An INVITE without credentials from `wire`: the challenge its 401 carries (the 401 is ACKed)."""
    d = service.dialogue(wire)
    wire.send(d.invite(offer(4000)))
    final = await wire.final(method="INVITE", call_id=d.call_id)
    assert final.status == 401, final.status
    wire.send(d.ack(branch_id=d.invite_branch, to_tag=final.to_tag))
    return final.headers.get("WWW-Authenticate") or ""


async def invite_with(service: Service, wire: SipWire, credentials: str) -> SipResponse:
    """A new call's INVITE carrying `credentials`: its final response (a 200 is ACKed, then BYEd)."""
    d = service.dialogue(wire)
    wire.send(d.invite(offer(4000), headers=[f"Authorization: {credentials}"]))
    final = await wire.final(method="INVITE", call_id=d.call_id)
    if final.status == 200:
        d.learn(final)
        wire.send(d.ack())
        wire.send(d.request("BYE"))
        assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    else:
        wire.send(d.ack(branch_id=d.invite_branch, to_tag=final.to_tag))
    return final


async def still_serves_the_password(service: Service) -> None:
    """`still_serves` for a service that wants digest: OPTIONS, then a call that proves the password."""
    assert await service.options() == 200
    challenge = await challenged(service, await service.wire())
    credentials = authorization_for(challenge, "INVITE", service.target, USER, PASSWORD)
    await service.call_completes(headers=(f"Authorization: {credentials}",))


async def test_a_replayed_authorization_is_challenged_again(start: Start) -> None:
    service = await start(sip_auth_user=USER, sip_auth_password=PASSWORD)
    wire = await service.wire()
    credentials = authorization_for(await challenged(service, wire), "INVITE", service.target, USER, PASSWORD)
    assert (await invite_with(service, wire, credentials)).status == 200
    replayed = await invite_with(service, wire, credentials)  # the same nonce and nc, on a new call
    assert replayed.status == 401
    assert parse_auth(replayed.headers.get("WWW-Authenticate") or "")[1].get("stale") == "true"
    await still_serves_the_password(service)


async def test_credentials_without_qop_are_challenged_again(start: Start) -> None:
    service = await start(sip_auth_user=USER, sip_auth_password=PASSWORD)
    wire = await service.wire()
    challenge = (await challenged(service, wire)).replace(', qop="auth"', "")
    credentials = authorization_for(challenge, "INVITE", service.target, USER, PASSWORD)  # RFC 2069 style
    assert "qop=" not in credentials
    refused = await invite_with(service, wire, credentials)
    assert refused.status == 401
    assert "stale" not in parse_auth(refused.headers.get("WWW-Authenticate") or "")[1]
    await still_serves_the_password(service)


class Datagrams(asyncio.DatagramProtocol):
    """A UDP peer on another loopback address (127.0.0.2): what it receives, parsed."""

    def __init__(self) -> None:
        self.received: list[SipResponse] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        with contextlib.suppress(SipError):
            message = parse_message(data)
            if isinstance(message, SipResponse):
                self.received.append(message)


async def test_a_nonce_issued_to_one_address_is_refused_from_another(start: Start) -> None:
    service = await start(sip_auth_user=USER, sip_auth_password=PASSWORD)
    wire = await service.wire()  # 127.0.0.1
    credentials = authorization_for(await challenged(service, wire), "INVITE", service.target, USER, PASSWORD)
    loop = asyncio.get_running_loop()
    elsewhere = Datagrams()
    transport, _ = await loop.create_datagram_endpoint(lambda: elsewhere, local_addr=("127.0.0.2", 0))
    try:
        d = service.dialogue(wire)  # written as the wire would, sent from 127.0.0.2
        transport.sendto(d.invite(offer(4000), headers=[f"Authorization: {credentials}"]).encode(),
                         (LOCAL, service.sip_port))  # fmt: skip
        deadline = time.monotonic() + 5
        while not [r for r in elsewhere.received if r.status >= 200]:
            assert time.monotonic() < deadline, "no final response at 127.0.0.2"
            await asyncio.sleep(0.02)
        final = next(r for r in elsewhere.received if r.status >= 200)
        assert (
            final.status == 401 and "stale" not in parse_auth(final.headers.get("WWW-Authenticate") or "")[1]
        )
        transport.sendto(
            d.ack(branch_id=d.invite_branch, to_tag=final.to_tag).encode(), (LOCAL, service.sip_port)
        )
    finally:
        transport.close()
    # Refused there, still good where it was issued: the nonce was not spent by the attempt.
    assert (await invite_with(service, wire, credentials)).status == 200
    await still_serves_the_password(service)


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_the_right_password_with_an_expired_nonce_gets_stale_true_and_a_fresh_nonce(
    start: Start,
) -> None:
    service = await start(sip_auth_user=USER, sip_auth_password=PASSWORD)
    clock = Clock()
    ua = service.client.app[SIP]
    ua.auth = DigestAuthenticator(ua.auth.realm, USER, PASSWORD, clock=clock)
    wire = await service.wire()
    credentials = authorization_for(await challenged(service, wire), "INVITE", service.target, USER, PASSWORD)
    clock.now += ua.auth.nonce_ttl_s + 1
    stale = await invite_with(service, wire, credentials)
    assert stale.status == 401
    fresh = stale.headers.get("WWW-Authenticate") or ""
    assert parse_auth(fresh)[1].get("stale") == "true"
    again = authorization_for(fresh, "INVITE", service.target, USER, PASSWORD)
    assert (await invite_with(service, wire, again)).status == 200
    await still_serves_the_password(service)


# Outbound: the raw peers below stand for trunks; the agent dials them through the API. A peer is opened
# before the service, which names its address in --dial-trunks, and is told the service's port after.


async def trunk(service_port: int = 0) -> SipWire:
    return await SipWire.open(service_port)


def attach(service: Service, *peers: SipWire) -> None:
    """The service's port for the peers' replies; closed with the service, after its BYEs."""
    for peer in peers:
        peer.server_port = service.sip_port
        service.wires.append(peer)


async def dial(service: Service, to: str) -> str:
    response = await service.client.post("/api/calls/sip", json={"to": to}, headers=service.auth)
    assert response.status == 202, await response.text()
    return str((await response.json())["call_id"])


async def call_state(service: Service, call_id: str) -> dict[str, object]:
    details: dict[str, object] = await (
        await service.client.get(f"/api/calls/{call_id}", headers=service.auth)
    ).json()
    return details


async def ended_as(service: Service, call_id: str, outcome: str) -> None:
    async def ended() -> bool:
        details = await call_state(service, call_id)
        return details.get("state") == "ended" and details.get("ended_reason") == outcome

    await eventually(ended, what=f"the call ends {outcome}")


async def challenges_once(peer: SipWire, challenge: str) -> None:
    """The peer answers our INVITE 401 with `challenge`, and sees the ACK of it."""
    invite = await peer.request("INVITE")
    peer.reply(invite, 401, "Unauthorized", to_tag=token(), headers=[f"WWW-Authenticate: {challenge}"])
    await peer.wait_for(lambda: list(peer.requests("ACK", call_id=invite.call_id)), 5)


def outbound(*trunks: SipWire, pinned_to: SipWire | None = None) -> dict[str, object]:
    settings: dict[str, object] = {
        "dial_trunks": tuple(peer.here for peer in trunks),
        "sip_outbound_user": TRUNK_USER,
        "sip_outbound_password": TRUNK_PASSWORD,
        "sip_outbound_realm": TRUNK_REALM,
    }
    if pinned_to is not None:
        settings["sip_outbound_trunk"] = pinned_to.here
    return settings


def unanswered(peer: SipWire) -> bool:
    """The peer got one INVITE, and it carried no credentials."""
    invites = peer.requests("INVITE")
    return len(invites) == 1 and not invites[0].headers.get("Authorization")


async def test_a_trunk_the_credentials_do_not_belong_to_gets_no_answer_to_its_challenge(start: Start) -> None:
    carrier, other = await trunk(), await trunk()
    service = await start(**outbound(carrier, other, pinned_to=carrier))
    attach(service, carrier, other)
    call_id = await dial(service, f"sip:+15550100@{other.here}")
    # It relays a challenge in the carrier's own realm: answered, it would place a call on our account.
    carrier_auth = DigestAuthenticator(TRUNK_REALM, TRUNK_USER, TRUNK_PASSWORD)
    await challenges_once(other, carrier_auth.challenge(LOCAL))
    await ended_as(service, call_id, "rejected")
    assert unanswered(other)
    await service.still_serves()


async def test_the_trunk_challenging_in_another_realm_gets_no_answer(start: Start) -> None:
    carrier = await trunk()
    service = await start(**outbound(carrier))
    attach(service, carrier)
    call_id = await dial(service, f"sip:+15550100@{carrier.here}")
    elsewhere = DigestAuthenticator("elsewhere.example", TRUNK_USER, TRUNK_PASSWORD)
    await challenges_once(carrier, elsewhere.challenge(LOCAL))
    await ended_as(service, call_id, "rejected")
    assert unanswered(carrier)
    await service.still_serves()


async def test_the_inbound_credentials_never_answer_a_dial_out_challenge(start: Start) -> None:
    carrier = await trunk()
    service = await start(dial_trunks=(carrier.here,), sip_auth_user=USER, sip_auth_password=PASSWORD)
    attach(service, carrier)
    call_id = await dial(service, f"sip:+15550100@{carrier.here}")
    await challenges_once(carrier, DigestAuthenticator("parley", USER, PASSWORD).challenge(LOCAL))
    await ended_as(service, call_id, "rejected")
    assert unanswered(carrier)
    await still_serves_the_password(service)


async def test_the_trunk_in_its_realm_gets_the_credentials_and_the_call_connects(start: Start) -> None:
    carrier, spare = await trunk(), await trunk()
    service = await start(**outbound(carrier, spare, pinned_to=carrier))
    attach(service, carrier, spare)
    rtp = await service.rtp()
    call_id = await dial(service, f"sip:+15550100@{carrier.here}")
    carrier_auth = DigestAuthenticator(TRUNK_REALM, TRUNK_USER, TRUNK_PASSWORD)
    await challenges_once(carrier, carrier_auth.challenge(LOCAL))
    await carrier.wait_for(lambda: list(carrier.requests("INVITE")), 5, count=2)
    invite = carrier.requests("INVITE")[1]
    credentials = invite.headers.get("Authorization") or ""
    assert carrier_auth.verify(credentials, "INVITE", invite.uri, LOCAL) is Verdict.OK
    tag = token()
    carrier.reply(invite, 200, to_tag=tag, headers=[f"Contact: {carrier.contact}"],
                  body=offer(rtp.port), content_type="application/sdp")  # fmt: skip
    await carrier.request("ACK", call_id=invite.call_id)

    async def answered() -> bool:
        return (await call_state(service, call_id)).get("state") not in ("dialing", "ringing", "ended")

    await eventually(answered, what="the dialled call is answered")
    their_port = sdp_audio_port(invite.body)
    for sequence in range(5):
        rtp.send(rtp_packet(sequence), their_port)

    async def heard() -> bool:
        return bool(rtp.packets)

    await eventually(heard, what="RTP to the trunk")
    await service.still_serves()
