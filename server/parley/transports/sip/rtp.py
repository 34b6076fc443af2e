"""RTP (RFC 3550) data packets, their sequence arithmetic, and a small receive jitter buffer.

The jitter buffer serves a VAD that needs audio in order and in time, not smooth playout: it holds a
packet or two to let a late one slot in, then reports each gap it gives up on so the caller can fill
it with silence.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

RTP_VERSION = 2
HEADER_SIZE = 12
MAX_CSRC = 15
DEFAULT_DEPTH = 2  # packets held to restore order: 40 ms at 20 ms per packet
MAX_JUMP = 100  # a larger sequence step is a restarted sender, not loss (cf. RFC 3550 A.1 MAX_MISORDER)
PROBATION_WINDOW = 8  # a jumped packet is believed once another lands this close to it
RECENT_LOST = 128  # sequence numbers remembered as lost, to tell a late packet from a duplicate

_HEADER = struct.Struct("!BBHII")
_EXTENSION = struct.Struct("!HH")


def uint16_add(a: int, b: int) -> int:
    return (a + b) & 0xFFFF


def uint32_add(a: int, b: int) -> int:
    return (a + b) & 0xFFFFFFFF


def seq_diff(a: int, b: int) -> int:
    """Signed distance a - b between two 16-bit sequence numbers, in -32768..32767 (wraps round)."""
    return ((a - b + 0x8000) & 0xFFFF) - 0x8000


def seq_newer(a: int, b: int) -> bool:
    """Whether sequence number a comes after b, across the 16-bit wrap (RFC 3550 A.1)."""
    return seq_diff(a, b) > 0


def is_rtcp(data: bytes) -> bool:
    """Whether a datagram on the RTP port is RTCP (RFC 5761 4: its second octet lies in 192..223).

    That range is RTP's marker bit with payload types 64..95, which RFC 5761 forbids for RTP when
    RTCP shares the port, so the test cannot misread audio.
    """
    return len(data) >= 2 and data[0] >> 6 == RTP_VERSION and 192 <= data[1] <= 223


@dataclass(frozen=True)
class RtpPacket:
    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    marker: bool = False
    payload: bytes = b""
    csrc: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.payload_type <= 127:
            raise ValueError(f"RTP payload type {self.payload_type} is outside 0..127")
        if not 0 <= self.sequence_number <= 0xFFFF:
            raise ValueError(f"RTP sequence number {self.sequence_number} is outside 16 bits")
        if not 0 <= self.timestamp <= 0xFFFFFFFF or not 0 <= self.ssrc <= 0xFFFFFFFF:
            raise ValueError("RTP timestamp and SSRC must fit 32 bits")
        if len(self.csrc) > MAX_CSRC:
            raise ValueError(f"RTP allows at most {MAX_CSRC} CSRCs, got {len(self.csrc)}")

    def serialize(self) -> bytes:
        header = _HEADER.pack(
            (RTP_VERSION << 6) | len(self.csrc),
            (0x80 if self.marker else 0) | self.payload_type,
            self.sequence_number,
            self.timestamp,
            self.ssrc,
        )
        if self.csrc:
            header += struct.pack(f"!{len(self.csrc)}I", *self.csrc)
        return header + self.payload

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        """Parse one RTP data packet; anything malformed raises ValueError (never a struct error)."""
        if len(data) < HEADER_SIZE:
            raise ValueError(f"RTP packet of {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
        first, second, sequence_number, timestamp, ssrc = _HEADER.unpack_from(data)
        if first >> 6 != RTP_VERSION:
            raise ValueError(f"RTP version {first >> 6} is not 2")
        csrc_count = first & 0x0F
        offset = HEADER_SIZE + 4 * csrc_count
        if len(data) < offset:
            raise ValueError(f"RTP packet of {len(data)} bytes is too short for {csrc_count} CSRCs")
        csrc = struct.unpack_from(f"!{csrc_count}I", data, HEADER_SIZE)
        if first & 0x10:
            # RFC 3550 5.3.1: a profile-defined extension, 4 bytes of header then `length` words; we
            # use none, so it is only skipped.
            if len(data) < offset + _EXTENSION.size:
                raise ValueError("RTP header extension is truncated")
            _, words = _EXTENSION.unpack_from(data, offset)
            offset += _EXTENSION.size + 4 * words
            if len(data) < offset:
                raise ValueError(f"RTP header extension of {words} words runs past the packet")
        end = len(data)
        if first & 0x20:
            # RFC 3550 5.1: the last octet counts the padding octets, itself included.
            padding = data[-1]
            if padding == 0 or offset + padding > end:
                raise ValueError(f"RTP padding of {padding} bytes does not fit the packet")
            end -= padding
        return cls(
            payload_type=second & 0x7F,
            sequence_number=sequence_number,
            timestamp=timestamp,
            ssrc=ssrc,
            marker=bool(second & 0x80),
            payload=bytes(data[offset:end]),
            csrc=csrc,
        )


class Sequenced(Protocol):
    """What putting packets in order needs of one: ours, or aiortc's (transports/opus_inbound.py)."""

    @property
    def ssrc(self) -> int: ...

    @property
    def sequence_number(self) -> int: ...


P = TypeVar("P", bound=Sequenced)


class JitterBuffer(Generic[P]):
    """Puts one source's packets back in sequence order, holding at most `depth` of them.

    `push` returns the packets now due, oldest first, with None for each missing packet given up on
    (the caller plays 20 ms of silence for it, so time stays whole). A packet older than what was
    already handed out is dropped: a duplicate if it was delivered, late if it had been given up on
    (or far out of place). A new SSRC, or a jump of more than MAX_JUMP confirmed by a second packet
    close to it, starts over.
    """

    def __init__(self, depth: int = DEFAULT_DEPTH) -> None:
        assert depth >= 0
        self.depth = depth
        self.lost = 0
        self.late = 0
        self.duplicates = 0
        self._ssrc: int | None = None
        self._next = 0
        self._held: dict[int, P] = {}
        self._recent_lost: deque[int] = deque(maxlen=RECENT_LOST)
        self._probation: P | None = None

    def push(self, packet: P) -> list[P | None]:
        due: list[P | None] = []
        if packet.ssrc != self._ssrc:
            due = self.flush()
            self._restart(packet)
        distance = seq_diff(packet.sequence_number, self._next)
        if abs(distance) > MAX_JUMP:
            return due + self._probe(packet)
        if self._probation is not None:
            self.late += 1  # the far packet had no follower: a stray, most likely delayed beyond use
            self._probation = None
        if distance < 0:
            self._drop_old(packet.sequence_number)
            return due
        if packet.sequence_number in self._held:
            self.duplicates += 1
            return due
        self._held[packet.sequence_number] = packet
        while self._held and (self._next in self._held or len(self._held) > self.depth):
            due.append(self._take_next())
        return due

    def flush(self) -> list[P | None]:
        """Everything held, in order, with None for the gaps between (at the end of a stream)."""
        due: list[P | None] = []
        while self._held:
            due.append(self._take_next())
        return due

    def _take_next(self) -> P | None:
        packet = self._held.pop(self._next, None)
        if packet is None:
            self.lost += 1
            self._recent_lost.append(self._next)
        self._next = uint16_add(self._next, 1)
        return packet

    def _drop_old(self, sequence_number: int) -> None:
        if sequence_number in self._recent_lost:
            self._recent_lost.remove(sequence_number)
            self.late += 1
        else:
            self.duplicates += 1

    def _probe(self, packet: P) -> list[P | None]:
        # RFC 3550 A.1: one packet far from the expected sequence may be a stray; a second one near it
        # means the sender restarted its sequence, so both are kept and the old stream is let go.
        probation, self._probation = self._probation, packet
        if probation is None:
            return []
        gap = seq_diff(packet.sequence_number, probation.sequence_number)
        if gap == 0:
            self.duplicates += 1
            return []
        if abs(gap) > PROBATION_WINDOW:
            self.late += 1  # the earlier one was a stray too
            return []
        first, second = (probation, packet) if gap > 0 else (packet, probation)
        due = self.flush()
        self._restart(first)
        return due + self.push(first) + self.push(second)

    def _restart(self, packet: P) -> None:
        self._ssrc = packet.ssrc
        self._next = packet.sequence_number
        self._held.clear()
        self._recent_lost.clear()
        self._probation = None
