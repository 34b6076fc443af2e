"""One call's RTP endpoint: two streams on loopback talking G.711 and keypad digits to each other."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from parley.audio import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from parley.transports.sip.latching import PeerSources
from parley.transports.sip.media import RtpStream
from parley.transports.sip.rtp import RtpPacket
from parley.transports.sip.sdp import Negotiated

HOST = "127.0.0.1"
PORTS = (41000, 48999)
TONE = (np.sin(2 * np.pi * 440 * np.arange(160) / 8000) * 8000).astype(np.int16)


@dataclass
class Ear:
    """What one end of the call hears."""

    audio: list[np.ndarray] = field(default_factory=list)
    digits: list[str] = field(default_factory=list)


class RawPeer(asyncio.DatagramProtocol):
    """A bare UDP socket: a stranger on the port, or a peer whose packets we inspect."""

    def __init__(self) -> None:
        self.received: list[RtpPacket] = []
        self.transport: asyncio.DatagramTransport | None = None

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.received.append(RtpPacket.parse(data))

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def send(self, packet: RtpPacket | bytes, port: int) -> None:
        assert self.transport is not None
        self.transport.sendto(packet if isinstance(packet, bytes) else packet.serialize(), (HOST, port))

    def close(self) -> None:
        assert self.transport is not None
        self.transport.close()


async def raw_peer() -> RawPeer:
    transport, peer = await asyncio.get_running_loop().create_datagram_endpoint(RawPeer, local_addr=(HOST, 0))
    peer.transport = transport
    return peer


def toward(port: int, codec: str = "PCMU", *, direction: str = "sendrecv", address: str = HOST) -> Negotiated:
    return Negotiated(
        remote_address=address,
        remote_port=port,
        codec=codec,
        payload_type={"PCMU": 0, "PCMA": 8}[codec],
        telephone_event_pt=101,
        direction=direction,
    )


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out waiting on the loopback"
        await asyncio.sleep(0.005)


async def open_stream(
    ear: Ear, clock: Callable[[], float] | None = None, sources: PeerSources | None = None
) -> RtpStream:
    extra: dict[str, Any] = {} if clock is None else {"clock": clock}
    if sources is not None:
        extra["sources"] = sources
    return await RtpStream.open(HOST, PORTS, on_audio=ear.audio.append, on_dtmf=ear.digits.append, **extra)


def connect(stream: RtpStream, negotiated: Negotiated) -> None:
    """Configure a stream as a confirmed dialog does: the SDP's address may be sent to at once."""
    stream.configure(negotiated)
    stream.trust_sdp_address()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[RtpStream, Ear, RtpStream, Ear]]:
    caller_ear, agent_ear = Ear(), Ear()
    caller, agent = await open_stream(caller_ear), await open_stream(agent_ear)
    connect(caller, toward(agent.local_port))
    connect(agent, toward(caller.local_port))
    yield caller, caller_ear, agent, agent_ear
    caller.close()
    agent.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_audio_flows_both_ways_as_g711(pair: tuple[RtpStream, Ear, RtpStream, Ear]) -> None:
    caller, caller_ear, agent, agent_ear = pair
    for _ in range(5):
        caller.send_frame(TONE)
        agent.send_frame(-TONE)
    await until(lambda: len(agent_ear.audio) == 5 and len(caller_ear.audio) == 5)
    assert all(np.array_equal(frame, ulaw_decode(ulaw_encode(TONE))) for frame in agent_ear.audio)
    assert all(np.array_equal(frame, ulaw_decode(ulaw_encode(-TONE))) for frame in caller_ear.audio)
    assert (caller.sent, agent.received, agent.lost, agent.invalid) == (5, 5, 0, 0)


async def test_a_pressed_key_arrives_once_and_replaces_audio_on_the_same_clock(
    pair: tuple[RtpStream, Ear, RtpStream, Ear],
) -> None:
    caller, _, agent, agent_ear = pair
    assert caller.send_dtmf("7")
    for _ in range(12):
        caller.send_frame(TONE)
    await until(lambda: agent.received == 12)
    assert agent_ear.digits == ["7"]
    assert len(agent_ear.audio) == 2  # ten ticks carried the event (start, updates, three ends)


async def test_the_stream_latches_to_its_peer_and_ignores_a_third_sender(
    pair: tuple[RtpStream, Ear, RtpStream, Ear],
) -> None:
    caller, _, agent, agent_ear = pair
    caller.send_frame(TONE)
    await until(lambda: len(agent_ear.audio) == 1)
    stranger = await raw_peer()
    try:
        for seq in range(3):
            stranger.send(RtpPacket(0, seq, seq * 160, 999, payload=ulaw_encode(TONE)), agent.local_port)
        caller.send_frame(TONE)
        await until(lambda: agent.received == 2 and agent.foreign == 3)
        assert len(agent_ear.audio) == 2
    finally:
        stranger.close()


async def test_replies_go_where_the_peer_sends_from_not_where_its_sdp_said() -> None:
    # Comedia / RFC 4961: a peer behind NAT advertises an address it cannot be reached on.
    ear = Ear()
    agent = await open_stream(ear, sources=PeerSources(signalling=HOST))
    peer = await raw_peer()
    try:
        agent.configure(toward(9, address="127.0.0.2"))
        agent.send_frame(TONE)  # nothing goes to an SDP address before the dialog is confirmed
        peer.send(RtpPacket(0, 1, 160, 42, payload=ulaw_encode(TONE)), agent.local_port)
        await until(lambda: len(ear.audio) == 1)
        agent.send_frame(TONE)
        await until(lambda: len(peer.received) == 1)
        assert agent.remote == (HOST, peer.port)
    finally:
        agent.close()
        peer.close()


async def test_a_reinvite_to_pcma_switches_both_directions(
    pair: tuple[RtpStream, Ear, RtpStream, Ear],
) -> None:
    caller, caller_ear, agent, agent_ear = pair
    caller.send_frame(TONE)
    await until(lambda: len(agent_ear.audio) == 1)
    caller.configure(toward(agent.local_port, "PCMA"))
    agent.configure(toward(caller.local_port, "PCMA"))
    caller.send_frame(TONE)
    agent.send_frame(TONE)
    await until(lambda: len(agent_ear.audio) == 2 and len(caller_ear.audio) == 1)
    assert np.array_equal(agent_ear.audio[1], alaw_decode(alaw_encode(TONE)))
    assert np.array_equal(caller_ear.audio[0], alaw_decode(alaw_encode(TONE)))


async def test_a_lost_packet_is_heard_as_a_frame_of_silence() -> None:
    ear = Ear()
    agent = await open_stream(ear)
    peer = await raw_peer()
    try:
        agent.configure(toward(peer.port))
        # 2 is lost: the buffer holds two packets (40 ms) behind the gap, and gives up at the third.
        for seq in (1, 3, 4, 5):
            peer.send(RtpPacket(0, seq, seq * 160, 42, payload=ulaw_encode(TONE)), agent.local_port)
        await until(lambda: len(ear.audio) == 5)
        assert not ear.audio[1].any() and ear.audio[1].size == 160
        assert agent.lost == 1
    finally:
        agent.close()
        peer.close()


async def test_timestamps_run_on_through_a_pause_and_the_next_talkspurt_is_marked() -> None:
    clock = FakeClock()
    agent = await open_stream(Ear(), clock)
    peer = await raw_peer()
    try:
        connect(agent, toward(peer.port))
        for _ in range(3):
            agent.send_frame(TONE)
            clock.now += 0.02
        clock.now += 0.5  # the agent fell silent without sending silence
        agent.send_frame(TONE)
        await until(lambda: len(peer.received) == 4)
        got = peer.received
        assert [p.marker for p in got] == [True, False, False, True]
        assert [p.sequence_number - got[0].sequence_number for p in got] == [0, 1, 2, 3]
        assert [(p.timestamp - got[0].timestamp) % 2**32 for p in got] == [0, 160, 320, 480 + 25 * 160]
        assert {p.ssrc for p in got} == {agent.ssrc}
    finally:
        agent.close()
        peer.close()


async def test_nothing_is_sent_on_hold_and_resuming_starts_a_talkspurt() -> None:
    agent = await open_stream(Ear())
    peer = await raw_peer()
    try:
        agent.send_frame(TONE)  # no SDP yet
        connect(agent, toward(peer.port, direction="recvonly"))  # the peer put us on hold
        agent.send_frame(TONE)
        agent.configure(toward(peer.port, address="0.0.0.0"))  # the old way of holding
        agent.send_frame(TONE)
        assert agent.sent == 0
        agent.configure(toward(peer.port))
        agent.send_frame(TONE)
        agent.send_frame(TONE)
        await until(lambda: len(peer.received) == 2)
        assert [p.marker for p in peer.received] == [True, False]
    finally:
        agent.close()
        peer.close()


async def test_garbage_rtcp_and_unnegotiated_payloads_are_counted_not_heard() -> None:
    ear = Ear()
    clock = FakeClock()
    agent = await open_stream(ear, clock)
    peer = await raw_peer()
    try:
        agent.configure(toward(peer.port))
        clock.now += 30
        peer.send(b"hello there", agent.local_port)
        peer.send(RtpPacket(96, 1, 0, 42, payload=b"\x00" * 20), agent.local_port)
        peer.send(bytes([0x81, 201]) + b"\x00" * 30, agent.local_port)  # RTCP muxed on the RTP port
        await until(lambda: agent.invalid == 2 and agent.rtcp_received == 1)
        assert ear.audio == [] and agent.last_received == clock.now  # RTCP is a sign of life
    finally:
        agent.close()
        peer.close()


async def test_digits_go_through_the_full_path_in_order() -> None:
    caller_ear, agent_ear = Ear(), Ear()
    caller, agent = await open_stream(caller_ear), await open_stream(agent_ear)
    try:
        connect(caller, toward(agent.local_port))
        connect(agent, toward(caller.local_port))
        for digit in "1#1":
            assert caller.send_dtmf(digit)
        for _ in range(40):
            caller.send_frame(TONE)
        # The last digit can be recognised while the frames after it still wait in the socket (read one
        # datagram per loop turn): wait for all 40, then check that no packet more came.
        await until(lambda: agent_ear.digits == ["1", "#", "1"] and agent.received >= 40)
        packets = agent.received
        assert packets == 40
        caller.configure(replace(toward(agent.local_port), telephone_event_pt=None))
        assert not caller.send_dtmf("2")
        with pytest.raises(ValueError):
            caller.send_dtmf("Z")
    finally:
        caller.close()
        agent.close()


async def test_ports_come_in_even_odd_pairs_and_a_full_range_is_an_error() -> None:
    ear = Ear()
    stream = await RtpStream.open(HOST, PORTS, on_audio=ear.audio.append, on_dtmf=ear.digits.append)
    try:
        port = stream.local_port
        assert port % 2 == 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, pytest.raises(OSError) as taken:
            probe.bind((HOST, port + 1))
        assert taken.value.errno == errno.EADDRINUSE
        with pytest.raises(OSError, match="no free RTP/RTCP port pair"):
            await RtpStream.open(HOST, (port, port + 1), on_audio=ear.audio.append, on_dtmf=ear.digits.append)
    finally:
        stream.close()
        stream.close()  # idempotent
    stream.send_frame(TONE)  # a closed stream sends nothing and does not raise
    assert stream.sent == 0


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
async def test_audio_flows_over_ipv6() -> None:
    caller_ear, agent_ear = Ear(), Ear()
    caller = await RtpStream.open(
        "::1", PORTS, on_audio=caller_ear.audio.append, on_dtmf=caller_ear.digits.append
    )
    agent = await RtpStream.open(
        "::1", PORTS, on_audio=agent_ear.audio.append, on_dtmf=agent_ear.digits.append
    )
    try:
        connect(caller, toward(agent.local_port, address="::1"))
        connect(agent, toward(caller.local_port, address="::1"))
        caller.send_frame(TONE)
        agent.send_frame(TONE)
        await until(lambda: len(agent_ear.audio) == 1 and len(caller_ear.audio) == 1)
        assert agent.remote == ("::1", caller.local_port)
    finally:
        caller.close()
        agent.close()
