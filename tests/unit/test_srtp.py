"""SDES-SRTP (RFC 4568, RFC 3711): two RTP streams keyed from an offer and answer, talking over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np
import pytest

from parley.audio import ulaw_decode, ulaw_encode
from parley.transports.sip.media import RtpStream
from parley.transports.sip.rtp import RtpPacket
from parley.transports.sip.sdes import AES_CM_128_HMAC_SHA1_32, SrtpKeys, new_master_key
from parley.transports.sip.sdp import Negotiated, answer, negotiated_from_answer, offer, parse_sdp
from parley.transports.sip.srtp import SrtpContext, SrtpError
from tests.unit.test_rtp_stream import HOST, TONE, Ear, connect, open_stream, until

Pair = tuple[RtpStream, Ear, RtpStream, Ear]


async def keyed_pair(suite: str | None = None) -> Pair:
    """A caller and an agent stream, keyed by the agent's RTP/SAVP offer and the caller's answer."""
    caller_ear, agent_ear = Ear(), Ear()
    caller, agent = await open_stream(caller_ear), await open_stream(agent_ear)
    ours = offer(
        address=HOST, port=agent.local_port, session_id=1, session_version=1, srtp_key=agent.master_key
    )
    if suite is not None:  # a caller that speaks only this suite: the offer's other line is not for it
        ours = "".join(line for line in ours.splitlines(True) if "crypto" not in line or suite in line)
    their_answer, caller_side = answer(
        parse_sdp(ours),
        address=HOST,
        port=caller.local_port,
        session_id=2,
        session_version=1,
        srtp_key=caller.master_key,
    )
    connect(caller, caller_side)
    connect(agent, negotiated_from_answer(ours, parse_sdp(their_answer)))
    return caller, caller_ear, agent, agent_ear


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    caller, caller_ear, agent, agent_ear = await keyed_pair()
    yield caller, caller_ear, agent, agent_ear
    caller.close()
    agent.close()


class Tap(asyncio.DatagramProtocol):
    """A socket on the loopback that keeps datagrams as they came (SRTP is not RtpPacket.parse's)."""

    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self.transport: asyncio.DatagramTransport | None = None

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.datagrams.append(data)

    def send(self, data: bytes, port: int) -> None:
        assert self.transport is not None
        self.transport.sendto(data, (HOST, port))

    def close(self) -> None:
        assert self.transport is not None
        self.transport.close()


@pytest.fixture
async def tap() -> AsyncIterator[Tap]:
    transport, peer = await asyncio.get_running_loop().create_datagram_endpoint(Tap, local_addr=(HOST, 0))
    peer.transport = transport
    yield peer
    peer.close()


def agreement(stream: RtpStream) -> Negotiated:
    assert stream.negotiated is not None
    return stream.negotiated


async def sent_by(stream: RtpStream, tap: Tap, frames: int) -> list[bytes]:
    """`frames` packets as `stream` puts them on the wire, caught by `tap` on the peer's address."""
    negotiated = agreement(stream)
    stream.configure(replace(negotiated, remote_port=tap.port))
    for _ in range(frames):
        stream.send_frame(TONE)
    await until(lambda: len(tap.datagrams) == frames)
    stream.configure(negotiated)
    return list(tap.datagrams)


async def test_srtp_audio_flows_both_ways_and_the_wire_carries_no_g711(pair: Pair, tap: Tap) -> None:
    caller, caller_ear, agent, agent_ear = pair
    assert caller.encrypted and agent.encrypted
    for _ in range(5):
        caller.send_frame(TONE)
        agent.send_frame(-TONE)
    await until(lambda: len(agent_ear.audio) == 5 and len(caller_ear.audio) == 5)
    assert all(np.array_equal(frame, ulaw_decode(ulaw_encode(TONE))) for frame in agent_ear.audio)
    assert all(np.array_equal(frame, ulaw_decode(ulaw_encode(-TONE))) for frame in caller_ear.audio)
    (datagram,) = await sent_by(caller, tap, 1)
    header = RtpPacket.parse(datagram[:-10])  # the header stays clear (RFC 3711 3.1), a tag follows
    assert header.ssrc == caller.ssrc and len(datagram) == 12 + 160 + 10  # the 80-bit tag
    assert header.payload != ulaw_encode(TONE)


async def test_a_tampered_a_plain_and_a_replayed_packet_are_all_refused(pair: Pair, tap: Tap) -> None:
    caller, _, agent, agent_ear = pair
    first, second = await sent_by(caller, tap, 2)
    tampered = bytearray(first)
    tampered[20] ^= 0x01  # one bit of the encrypted audio
    tap.send(bytes(tampered), agent.local_port)
    tap.send(RtpPacket(0, 7, 0, caller.ssrc, payload=ulaw_encode(TONE)).serialize(), agent.local_port)
    await until(lambda: agent.unauthenticated == 2)
    assert agent_ear.audio == [] and agent.received == 0
    tap.send(second, agent.local_port)  # genuine: heard
    await until(lambda: agent.received == 1)
    tap.send(second, agent.local_port)  # the same packet again: a replay (RFC 3711 3.3.2)
    await until(lambda: agent.unauthenticated == 3)
    assert agent.received == 1


async def test_only_authenticated_srtcp_keeps_the_call_alive(pair: Pair, tap: Tap) -> None:
    caller, _, agent, _ = pair
    keys = agreement(caller).srtp
    assert keys is not None
    report = bytes([0x81, 201, 0, 7]) + caller.ssrc.to_bytes(4, "big") + bytes(24)  # a receiver report
    tap.send(SrtpContext(keys).protect_rtcp(report), agent.local_port + 1)
    await until(lambda: agent.rtcp_received == 1)
    tap.send(report, agent.local_port + 1)  # plain RTCP to an SRTP stream
    await until(lambda: agent.unauthenticated == 1)
    assert agent.rtcp_received == 1


async def test_the_32_bit_tag_suite_works_too() -> None:
    caller, _, agent, agent_ear = await keyed_pair(AES_CM_128_HMAC_SHA1_32)
    try:
        caller.send_frame(TONE)
        await until(lambda: len(agent_ear.audio) == 1)
        keys = agreement(agent).srtp
        assert keys is not None and keys.suite == AES_CM_128_HMAC_SHA1_32
    finally:
        caller.close()
        agent.close()


async def test_a_reoffer_with_the_same_keys_keeps_the_replay_list(pair: Pair, tap: Tap) -> None:
    caller, _, agent, _ = pair
    (packet,) = await sent_by(caller, tap, 1)
    tap.send(packet, agent.local_port)
    await until(lambda: agent.received == 1)
    agent.configure(replace(agreement(agent)))  # a re-INVITE that changes nothing (RFC 4568 7.1.4)
    tap.send(packet, agent.local_port)
    await until(lambda: agent.unauthenticated == 1)


async def test_new_keys_from_a_reinvite_take_over_at_once(pair: Pair) -> None:
    caller, _, agent, agent_ear = pair
    keys = agreement(caller).srtp
    assert keys is not None
    fresh = new_master_key()
    caller.configure(replace(agreement(caller), srtp=replace(keys, local=fresh)))
    caller.send_frame(TONE)  # under a key the agent has not heard of yet
    await until(lambda: agent.unauthenticated == 1)
    agent.configure(replace(agreement(agent), srtp=replace(agreement(agent).srtp, remote=fresh)))
    caller.send_frame(TONE)
    await until(lambda: len(agent_ear.audio) == 1)


def test_keys_never_show_in_a_repr() -> None:
    keys = SrtpKeys(AES_CM_128_HMAC_SHA1_32, local=b"L" * 30, remote=b"R" * 30)
    assert "LLLL" not in repr(keys) and "RRRR" not in repr(keys)


def test_a_packet_longer_than_libsrtps_buffer_is_refused_not_raised() -> None:
    keys = SrtpKeys(AES_CM_128_HMAC_SHA1_32, local=new_master_key(), remote=new_master_key())
    with pytest.raises(SrtpError):
        SrtpContext(keys).unprotect(b"\x80" + bytes(4000))
