"""Issue 42 items 2 and 3: an SDP cannot aim the agent's audio at a third party, and a stray RTP packet
cannot take the call's media over.

The caller and its signalling are on 127.0.0.1; a victim or a stranger is another loopback address
(127.0.0.2, 127.0.0.3), which Linux routes to this host like 127.0.0.1.
"""

from __future__ import annotations

import asyncio

from tests.security.conftest import LOCAL, Service, Start, eventually, rtp_packet, sdp_audio_port
from tests.sip_wire import Dialogue, RtpPeer, SipWire, offer

VICTIM = "127.0.0.3"
STRANGER = "127.0.0.2"
QUIET_S = 1.5  # before the fix the agent's audio reached the victim within a frame or two of the 200


async def socket_on(service: Service, host: str) -> RtpPeer:
    """A UDP socket on another loopback address, closed with the service."""
    peer = RtpPeer()
    loop = asyncio.get_running_loop()
    peer.transport, _ = await loop.create_datagram_endpoint(lambda: peer, local_addr=(host, 0))
    peer.port = int(peer.transport.get_extra_info("sockname")[1])
    service.rtp_peers.append(peer)
    return peer


def offer_at(address: str, port: int) -> str:
    return offer(port).replace(f"c=IN IP4 {LOCAL}", f"c=IN IP4 {address}")


async def answered(service: Service, wire: SipWire, sdp: str) -> tuple[Dialogue, int]:
    """An INVITE with `sdp`, its 200 (not yet acknowledged), and the agent's RTP port."""
    d = service.dialogue(wire)
    wire.send(d.invite(sdp))
    ok = await wire.response(200, call_id=d.call_id, timeout=10.0)
    d.learn(ok)
    return d, sdp_audio_port(ok.body)


async def stream(peer: RtpPeer, port: int, *, first: int, count: int, ssrc: int) -> None:
    """`count` packets of one SSRC, 20 ms apart, as a phone sends them."""
    for sequence in range(first, first + count):
        peer.send(rtp_packet(sequence, ssrc=ssrc), port)
        await asyncio.sleep(0.02)


async def test_an_sdp_that_names_a_host_instead_of_an_address_gets_488(start: Start) -> None:
    service = await start()
    wire = await service.wire()
    for name in ("media.example.com", "bücher.example", "127.0.0.1.nip.io"):
        d = service.dialogue(wire)
        wire.send(d.invite(offer_at(name, 4000)))
        refused = await wire.final(method="INVITE", call_id=d.call_id)
        assert refused.status == 488, (name, refused.status)
        assert "not an IP address" in (refused.headers.get("Warning") or "")
        wire.send(d.ack(branch_id=d.invite_branch, to_tag=refused.to_tag))
    await service.still_serves()


async def test_a_reinvite_that_names_a_host_gets_488_and_the_call_goes_on(start: Start) -> None:
    service = await start()
    wire, caller = await service.wire(), await service.rtp()
    d, agent_port = await answered(service, wire, offer(caller.port))
    wire.send(d.ack())
    wire.send(d.invite(offer_at("media.example.com", caller.port).replace("4242 1", "4242 2")))
    refused = await wire.final(method="INVITE", call_id=d.call_id, cseq=d.invite_cseq)
    assert refused.status == 488
    wire.send(d.ack(branch_id=d.invite_branch))
    caller.packets.clear()
    caller.send(rtp_packet(0), agent_port)
    await eventually(lambda: _arrived(caller), what="the agent's audio after the refused re-INVITE")
    await service.still_serves()


async def test_no_audio_goes_to_an_sdp_address_until_the_caller_acknowledges(start: Start) -> None:
    service = await start()
    wire = await service.wire()
    victim = await socket_on(service, VICTIM)
    d, _ = await answered(service, wire, offer_at(VICTIM, victim.port))
    await asyncio.sleep(QUIET_S)  # the 200 is retransmitted meanwhile, unacknowledged
    assert victim.packets == [], "RTP went to an address named only in the SDP"
    wire.send(d.ack())  # from the INVITE's own source: the SDP is the caller's wish
    await eventually(lambda: _arrived(victim), what="RTP to the SDP address after the ACK")
    wire.send(d.request("BYE"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    await service.still_serves()


async def test_an_ack_from_another_source_does_not_open_the_sdp_address(start: Start) -> None:
    service = await start()
    wire, elsewhere = await service.wire(), await service.wire()
    victim = await socket_on(service, VICTIM)
    d, _ = await answered(service, wire, offer_at(VICTIM, victim.port))
    elsewhere.send(d.ack())  # the dialog's tags, but not from where the INVITE came
    await asyncio.sleep(QUIET_S)
    assert victim.packets == []
    await service.still_serves()


async def test_a_call_that_never_acknowledges_nor_sends_rtp_ends_at_the_rtp_timeout(start: Start) -> None:
    service = await start(rtp_timeout_s=1.0)
    wire = await service.wire()
    victim = await socket_on(service, VICTIM)
    d, _ = await answered(service, wire, offer_at(VICTIM, victim.port))
    await wire.request("BYE", call_id=d.call_id, timeout=5.0)  # long before the 2xx's 32 s give-up
    assert victim.packets == []
    assert await service.counter("parley_transport_errors_total", transport="sip", reason="rtp_timeout") >= 1
    await service.still_serves()


async def test_a_natted_caller_is_answered_where_its_rtp_comes_from(start: Start) -> None:
    # Not an attack, the case latching is for: the SDP names a private address nobody can reach, and
    # the caller's RTP comes from its public one, where its signalling came from too.
    service = await start()
    wire, caller = await service.wire(), await service.rtp()
    d, agent_port = await answered(service, wire, offer_at("10.0.0.5", caller.port))
    wire.send(d.ack())
    await stream(caller, agent_port, first=0, count=5, ssrc=0x1234)
    await eventually(lambda: _arrived(caller), what="the agent's audio at the caller's public address")
    wire.send(d.request("BYE"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    await service.still_serves()


async def test_a_stray_packet_neither_becomes_the_caller_nor_takes_its_audio(start: Start) -> None:
    service = await start()
    wire, caller = await service.wire(), await service.rtp()
    stranger = await socket_on(service, STRANGER)
    d, agent_port = await answered(service, wire, offer(caller.port))
    stranger.send(rtp_packet(0, ssrc=0xBAD), agent_port)  # first, before the caller's own RTP
    wire.send(d.ack())
    await stream(caller, agent_port, first=0, count=5, ssrc=0x1234)
    await eventually(lambda: _arrived(caller), what="the agent's audio at the caller")
    await stream(stranger, agent_port, first=1, count=40, ssrc=0xBAD)  # even a stream, mid-call
    caller.packets.clear()
    await stream(caller, agent_port, first=5, count=3, ssrc=0x1234)
    await eventually(lambda: _arrived(caller), what="the agent's audio still at the caller")
    assert stranger.packets == [], "the agent's audio went to a stranger"
    assert await service.counter("parley_transport_errors_total", transport="sip", reason="rtp_foreign") >= 41
    wire.send(d.request("BYE"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    await service.still_serves()


async def test_only_a_stream_that_keeps_coming_moves_the_call_to_a_new_source(start: Start) -> None:
    # The caller's NAT binding changes: its RTP now comes from another port of the same address.
    service = await start()
    wire, caller, moved = await service.wire(), await service.rtp(), await service.rtp()
    d, agent_port = await answered(service, wire, offer(caller.port))
    wire.send(d.ack())
    await stream(caller, agent_port, first=0, count=5, ssrc=0x1234)
    await eventually(lambda: _arrived(caller), what="the agent's audio at the caller")
    moved.send(rtp_packet(5, ssrc=0x1234), agent_port)  # one packet is a stray, not a move
    await asyncio.sleep(0.3)
    assert moved.packets == []
    await stream(moved, agent_port, first=6, count=25, ssrc=0x1234)
    await eventually(lambda: _arrived(moved), what="the agent's audio following the moved stream")
    wire.send(d.request("BYE"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    await service.still_serves()


async def _arrived(peer: RtpPeer) -> bool:
    return bool(peer.packets)
