"""One call's RTP endpoint on asyncio: G.711 audio and RFC 4733 keypad digits, both ways.

Receiving puts packets back in order, decodes them to 8 kHz int16 and hands each frame on; sending
encodes one 20 ms frame per call of `send_frame`, which the call makes from its own 20 ms clock (this
class does not pace itself). RTCP is read and ignored, but counts as a sign of life.

With SRTP negotiated (sdes.py) every packet is protected and checked with srtp.py, and one that fails
the check is dropped before anything else looks at it.

Media is taken only from the peer's latched source (latching.py) and sent back there. Before anything
is latched it goes to the SDP's address only once the signalling has shown that address is the peer's
wish (`trust_sdp_address`, at the ACK from the INVITE's source): an SDP can name anyone.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from parley import metrics
from parley.audio import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from parley.transports.sip.dtmf import DtmfReceiver, DtmfSender, event_for_digit
from parley.transports.sip.latching import Latch, PeerSources
from parley.transports.sip.rtp import JitterBuffer, RtpPacket, is_rtcp, uint16_add, uint32_add
from parley.transports.sip.sdes import new_master_key
from parley.transports.sip.sdp import Negotiated
from parley.transports.sip.srtp import SrtpContext, SrtpError, srtp_context

FRAME_SAMPLES = 160  # 20 ms at 8 kHz
FRAME_S = 0.02
TALKSPURT_GAP_S = 0.1  # a pause in send_frame calls this long is silence, not a late clock tick
INTER_DIGIT_FRAMES = 3  # 60 ms between queued digits, which some gateways need to tell them apart
MAX_QUEUED_DIGITS = 64

_ENCODERS: dict[str, Callable[[np.ndarray], bytes]] = {"PCMU": ulaw_encode, "PCMA": alaw_encode}
_DECODERS: dict[str, Callable[[bytes], np.ndarray]] = {"PCMU": ulaw_decode, "PCMA": alaw_decode}

Address = tuple[str, int]

_FOREIGN = metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="rtp_foreign")
_UNAUTHENTICATED = metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="srtp_unauthenticated")
# Counted apart: some phones (baresip 1.0) send their first RTCP report and their RTCP BYE unprotected on
# every SRTP call, which must not look like an attack on the media.
_UNAUTHENTICATED_RTCP = metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="srtcp_unauthenticated")


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, Address], None]) -> None:
        self._on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self._on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (a peer not listening yet) say nothing RTP must act on: media is best effort.
        pass


class RtpStream:
    """The RTP/RTCP port pair of one call. Build it with `open`; `configure` it from the SDP."""

    def __init__(
        self,
        rtp: socket.socket,
        rtcp: socket.socket,
        *,
        on_audio: Callable[[np.ndarray], None],
        on_dtmf: Callable[[str], None],
        clock: Callable[[], float],
        sources: PeerSources,
    ) -> None:
        self._rtp_socket, self._rtcp_socket = rtp, rtcp
        self._rtp: asyncio.DatagramTransport | None = None
        self._rtcp: asyncio.DatagramTransport | None = None
        self._on_audio, self._on_dtmf, self._clock = on_audio, on_dtmf, clock
        self._negotiated: Negotiated | None = None
        self._srtp: SrtpContext | None = None
        # Ours for the life of the stream, answered or offered again on a re-INVITE, so that our
        # outbound SRTP context (its rollover counter) runs on.
        self.master_key = new_master_key()
        self._decoders: dict[int, Callable[[bytes], np.ndarray]] = {}
        self._latch = Latch(sources, clock)
        self._sdp_trusted = False
        self._reachable = asyncio.Event()
        self._buffer: JitterBuffer[RtpPacket] = JitterBuffer()
        self._dtmf_in = DtmfReceiver()
        self._frame_samples = FRAME_SAMPLES
        self._closed = False
        # RFC 3550 5.1: random initial sequence number and timestamp, and a random SSRC (8.1).
        self.ssrc = secrets.randbits(32)
        self._sequence_number = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self._last_tick: float | None = None
        self._talkspurt = True
        self._digits: deque[str] = deque()
        self._dtmf_out: DtmfSender | None = None
        self._digit_gap = 0
        self.last_received = clock()
        self.received = 0
        self.sent = 0
        self.invalid = 0
        self.foreign = 0
        self.unauthenticated = 0
        self.rtcp_received = 0

    @classmethod
    async def open(
        cls,
        host: str,
        port_range: tuple[int, int],
        *,
        on_audio: Callable[[np.ndarray], None],
        on_dtmf: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        sources: PeerSources | None = None,
    ) -> RtpStream:
        """Bind an even RTP port and the odd RTCP port above it (RFC 3550 11) on an IP literal.

        The pair is drawn at random from the inclusive `port_range`, so concurrent calls rarely race
        for one; OSError when every pair is taken. RTP is accepted from the SDP's address and `sources`.
        """
        rtp, rtcp = _bind_pair(host, port_range)
        stream = cls(
            rtp, rtcp, on_audio=on_audio, on_dtmf=on_dtmf, clock=clock, sources=sources or PeerSources()
        )
        loop = asyncio.get_running_loop()
        try:
            stream._rtp, _ = await loop.create_datagram_endpoint(
                lambda: _Endpoint(stream._datagram_received), sock=rtp
            )
            stream._rtcp, _ = await loop.create_datagram_endpoint(
                lambda: _Endpoint(stream._rtcp_received), sock=rtcp
            )
        except BaseException:
            stream.close()
            raise
        return stream

    @property
    def local_port(self) -> int:
        return int(self._rtp_socket.getsockname()[1])

    @property
    def remote(self) -> Address | None:
        """Where audio goes now: the latched source, else the SDP address once trusted; None before
        either, before SDP, or on hold."""
        negotiated = self._negotiated
        if negotiated is None or not negotiated.sends:
            return None
        if self._latch.latched is not None:
            return self._latch.latched
        if self._sdp_trusted:
            return (negotiated.remote_address, negotiated.remote_port)
        return None

    @property
    def on_hold(self) -> bool:
        """Whether the peer's SDP parked the call (RFC 3264 8.4): it may then send nothing at all."""
        return self._negotiated is not None and not self._negotiated.sends

    @property
    def relatched(self) -> int:
        return self._latch.relatched

    def trust_sdp_address(self) -> None:
        """The signalling proved the SDP is the peer's own (the dialog was confirmed from where the offer
        came, or we dialled the peer): media may go to the SDP's address before any RTP arrives."""
        self._sdp_trusted = True
        self._reachable.set()

    async def wait_reachable(self) -> None:
        """Until media may leave: the SDP's address is trusted, or the peer's RTP latched."""
        await self._reachable.wait()

    @property
    def lost(self) -> int:
        return self._buffer.lost

    @property
    def late(self) -> int:
        return self._buffer.late

    @property
    def duplicates(self) -> int:
        return self._buffer.duplicates

    @property
    def negotiated(self) -> Negotiated | None:
        """The SDP agreement in force (None before the first)."""
        return self._negotiated

    @property
    def encrypted(self) -> bool:
        """Whether the stream speaks SRTP."""
        return self._srtp is not None

    @property
    def telephone_events(self) -> bool:
        """Whether the peer takes RFC 4733 telephone-events (it offered or answered them)."""
        return self._negotiated is not None and self._negotiated.telephone_event_pt is not None

    @property
    def dtmf_pending(self) -> bool:
        """Key presses still queued or being sent (the pause after the last one included)."""
        return bool(self._digits) or self._dtmf_out is not None or self._digit_gap > 0

    def configure(self, negotiated: Negotiated) -> None:
        """Apply the SDP agreement; again on each re-INVITE (new address, codec, or hold)."""
        if negotiated.codec not in _DECODERS:
            raise ValueError(f"RTP streams speak {', '.join(_DECODERS)}, not {negotiated.codec}")
        previous = self._negotiated
        if previous is not None and (previous.remote_address, previous.remote_port) != (
            negotiated.remote_address,
            negotiated.remote_port,
        ):
            self._latch.unlatch()  # the peer moved (RFC 3264 8.3.1): latch afresh to its new stream
        self._latch.expect_sdp_address(negotiated.remote_address)
        if previous is not None and previous.telephone_event_pt != negotiated.telephone_event_pt:
            self._dtmf_out = None
            if negotiated.telephone_event_pt is None:
                self._digits.clear()
        self._srtp = srtp_context(negotiated.srtp, self._srtp)
        self._negotiated = negotiated
        self._decoders = {negotiated.payload_type: _DECODERS[negotiated.codec]}

    def send_frame(self, pcm8k: np.ndarray) -> None:
        """Send one 20 ms frame (160 samples), or the keypad packet due in its place."""
        if self._closed:
            return
        now = self._clock()
        if self._last_tick is not None and now - self._last_tick > TALKSPURT_GAP_S:
            # RFC 3550 5.1: the clock runs on through a pause, and the marker opens the talkspurt after it.
            skipped = round((now - self._last_tick) / FRAME_S) - 1
            self._timestamp = uint32_add(self._timestamp, skipped * FRAME_SAMPLES)
            self._talkspurt = True
        self._last_tick = now
        packet, destination = self._packet_for(pcm8k), self.remote
        self._timestamp = uint32_add(self._timestamp, pcm8k.size)
        if packet is not None and destination is not None and self._rtp is not None:
            data = packet.serialize()
            self._rtp.sendto(data if self._srtp is None else self._srtp.protect(data), destination)
            self.sent += 1

    def send_dtmf(self, digit: str) -> bool:
        """Queue one key press (RFC 4733) to replace audio on the next ticks; False if the peer takes none."""
        event_for_digit(digit)  # a bad key is the caller's bug: ValueError now, not mid-call
        negotiated = self._negotiated
        if (
            negotiated is None
            or negotiated.telephone_event_pt is None
            or len(self._digits) >= MAX_QUEUED_DIGITS
        ):
            return False
        self._digits.append(digit)
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for transport, sock in ((self._rtp, self._rtp_socket), (self._rtcp, self._rtcp_socket)):
            if transport is not None:
                transport.close()
            else:
                sock.close()

    def _packet_for(self, pcm8k: np.ndarray) -> RtpPacket | None:
        negotiated = self._negotiated
        if negotiated is None or self.remote is None:
            self._talkspurt = True
            return None
        packet = self._dtmf_packet(negotiated)
        if packet is None:
            packet = RtpPacket(
                payload_type=negotiated.payload_type,
                sequence_number=self._sequence_number,
                timestamp=self._timestamp,
                ssrc=self.ssrc,
                marker=self._talkspurt,
                payload=_ENCODERS[negotiated.codec](pcm8k),
            )
            self._talkspurt = False
        self._sequence_number = uint16_add(self._sequence_number, 1)
        return packet

    def _dtmf_packet(self, negotiated: Negotiated) -> RtpPacket | None:
        if self._dtmf_out is None:
            if self._digit_gap > 0:
                self._digit_gap -= 1
                return None
            if not self._digits or negotiated.telephone_event_pt is None:
                return None
            self._dtmf_out = DtmfSender(
                self._digits.popleft(),
                payload_type=negotiated.telephone_event_pt,
                ssrc=self.ssrc,
                timestamp=self._timestamp,
            )
        packet = self._dtmf_out.next_packet(self._sequence_number)
        if self._dtmf_out.done:
            self._dtmf_out = None
            self._digit_gap = INTER_DIGIT_FRAMES
        return packet

    def _datagram_received(self, data: bytes, source: Address) -> None:
        if self._closed:
            return
        if not self._latch.may_be_peer(source[0]):
            self._foreign()
            return
        if is_rtcp(data):
            self._rtcp_received(data, source)
            return
        if self._srtp is not None:
            try:
                data = self._srtp.unprotect(data)
            except SrtpError:
                self._unauthenticated()
                return
        try:
            packet = RtpPacket.parse(data)
        except ValueError:
            self.invalid += 1
            return
        negotiated = self._negotiated
        if negotiated is None or (
            packet.payload_type not in self._decoders and packet.payload_type != negotiated.telephone_event_pt
        ):
            self.invalid += 1
            return
        if not self._latch.admit(source, packet.ssrc):
            self._foreign()
            return
        self._reachable.set()
        self.received += 1
        self.last_received = self._clock()
        for due in self._buffer.push(packet):
            self._deliver(due, negotiated)

    def _deliver(self, packet: RtpPacket | None, negotiated: Negotiated) -> None:
        if packet is None:
            self._on_audio(np.zeros(self._frame_samples, dtype=np.int16))
            return
        if packet.payload_type == negotiated.telephone_event_pt:
            digit = self._dtmf_in.push(packet)
            if digit is not None:
                self._on_dtmf(digit)
            return
        decode = self._decoders.get(packet.payload_type)
        if decode is None or not packet.payload:
            return
        pcm = decode(packet.payload)
        self._frame_samples = pcm.size  # a loss is filled with as much as the peer's packets carry
        self._on_audio(pcm)

    def _rtcp_received(self, data: bytes, source: Address) -> None:
        # A peer that holds the call sends only RTCP (RFC 3550 6.2), so it keeps the call alive.
        if self._closed:
            return
        if not self._latch.may_be_peer(source[0]):
            self._foreign()
            return
        if self._srtp is not None:
            try:
                self._srtp.unprotect_rtcp(data)
            except SrtpError:
                self.unauthenticated += 1
                _UNAUTHENTICATED_RTCP.inc()
                return
        self.rtcp_received += 1
        self.last_received = self._clock()

    def _foreign(self) -> None:
        self.foreign += 1
        _FOREIGN.inc()

    def _unauthenticated(self) -> None:
        self.unauthenticated += 1
        _UNAUTHENTICATED.inc()


def _bind_pair(host: str, port_range: tuple[int, int]) -> tuple[socket.socket, socket.socket]:
    low, high = port_range
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    even_ports = range(low + low % 2, high, 2)  # each with port + 1 still in range
    if not even_ports:
        raise ValueError(f"RTP port range {low}-{high} holds no even/odd pair")
    start = random.randrange(len(even_ports))
    for i in range(len(even_ports)):
        port = even_ports[(start + i) % len(even_ports)]
        rtp = _bind_or_none(family, host, port)
        if rtp is None:
            continue
        rtcp = _bind_or_none(family, host, port + 1)
        if rtcp is not None:
            return rtp, rtcp
        rtp.close()
    raise OSError(errno.EADDRINUSE, f"no free RTP/RTCP port pair in {low}-{high} on {host}")


def _bind_or_none(family: socket.AddressFamily, host: str, port: int) -> socket.socket | None:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            return None
        raise
    return sock
