"""Keypad digits as RFC 4733 telephone-events: parsing, once-only reporting, and sending one press.

A sender repeats each event: a first packet with the marker bit, updates with a growing duration, and
the end packet three times (RFC 4733 2.5.1). All of them carry the event's start as RTP timestamp, so
the timestamp is what tells one press from the next, even of the same key.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

from parley.transports.sip.rtp import RtpPacket, uint32_add

DIGITS = "0123456789*#ABCD"  # events 0-15 (RFC 4733 3.2)
CLOCK_RATE = 8000
PACKET_MS = 20
DEFAULT_DURATION_MS = 160
DEFAULT_VOLUME = 10  # -10 dBm0, the level telephone networks send digits at
END_REPEATS = 3  # RFC 4733 2.5.1.4: the end packet is sent three times against loss
MAX_DURATION = 0xFFFF  # the 16-bit duration field, in timestamp units (8.2 s at 8 kHz)
RECENT_EVENTS = 16  # events remembered, so a repeat arriving after a newer event is not reported again

_PAYLOAD = struct.Struct("!BBH")


@dataclass(frozen=True)
class TelephoneEvent:
    event: int
    end: bool = False
    volume: int = DEFAULT_VOLUME
    duration: int = 0  # in RTP timestamp units since the event's start

    def __post_init__(self) -> None:
        if not 0 <= self.event <= 255:
            raise ValueError(f"telephone-event code {self.event} is outside 0..255")
        if not 0 <= self.volume <= 63:
            raise ValueError(f"telephone-event volume {self.volume} is outside 0..63")
        if not 0 <= self.duration <= MAX_DURATION:
            raise ValueError(f"telephone-event duration {self.duration} is outside 16 bits")

    @property
    def digit(self) -> str | None:
        """The key for DTMF events 0-15; None for other events (flash, tones)."""
        return DIGITS[self.event] if self.event < len(DIGITS) else None

    @classmethod
    def parse(cls, payload: bytes) -> TelephoneEvent:
        # RFC 4733 2.3; a payload may stack several 4-byte reports, of which the first is the one the
        # RTP timestamp belongs to.
        if len(payload) < _PAYLOAD.size:
            raise ValueError(f"telephone-event payload of {len(payload)} bytes is shorter than 4")
        event, flags, duration = _PAYLOAD.unpack_from(payload)
        return cls(event=event, end=bool(flags & 0x80), volume=flags & 0x3F, duration=duration)

    def serialize(self) -> bytes:
        return _PAYLOAD.pack(self.event, (0x80 if self.end else 0) | self.volume, self.duration)


def event_for_digit(digit: str) -> int:
    code = DIGITS.find(digit.upper()) if len(digit) == 1 else -1
    if code < 0:
        raise ValueError(f"{digit!r} is not a DTMF key; keys are {DIGITS}")
    return code


@dataclass
class _Seen:
    event: int
    duration: int
    ended: bool


class DtmfReceiver:
    """Turns a stream of telephone-event packets into each pressed key, reported exactly once."""

    def __init__(self) -> None:
        self.invalid = 0
        self._seen: OrderedDict[tuple[int, int], _Seen] = OrderedDict()

    def push(self, packet: RtpPacket) -> str | None:
        """The key a packet starts, or None for a repeat, an update, an end, or a non-key event."""
        try:
            report = TelephoneEvent.parse(packet.payload)
        except ValueError:
            self.invalid += 1
            return None
        key = (packet.ssrc, packet.timestamp)
        seen = self._seen.get(key)
        if seen is not None:
            seen.duration = max(seen.duration, report.duration)
            seen.ended = seen.ended or report.end
            return None
        new_press = packet.marker or not self._continues(packet, report)
        self._seen[key] = _Seen(report.event, report.duration, report.end)
        if len(self._seen) > RECENT_EVENTS:
            self._seen.popitem(last=False)
        # Reported on the first packet seen of an event, start or not, so a lost start costs nothing.
        return report.digit if new_press else None

    def _continues(self, packet: RtpPacket, report: TelephoneEvent) -> bool:
        # RFC 4733 2.5.1.3: an event longer than the duration field is cut into segments, each with a
        # new timestamp where the previous ended and no marker bit; that is one press, not several.
        for (ssrc, timestamp), seen in reversed(self._seen.items()):
            if ssrc == packet.ssrc:
                return (
                    not seen.ended
                    and seen.event == report.event
                    and uint32_add(timestamp, seen.duration) == packet.timestamp
                )
        return False


class DtmfSender:
    """The RFC 4733 packets for one key press, one per tick of the RTP sender's 20 ms clock.

    The sender owns its sequence numbers and builds each packet from `next_packet(sequence_number)`
    in place of that tick's audio; the event's timestamp is the clock's timestamp at its first tick.
    """

    def __init__(
        self,
        digit: str,
        *,
        payload_type: int,
        ssrc: int,
        timestamp: int,
        duration_ms: int = DEFAULT_DURATION_MS,
        volume: int = DEFAULT_VOLUME,
    ) -> None:
        if not PACKET_MS <= duration_ms <= MAX_DURATION * 1000 // CLOCK_RATE:
            raise ValueError(f"a key press of {duration_ms} ms does not fit one telephone-event")
        self.digit = digit
        self.event = event_for_digit(digit)
        self.payload_type = payload_type
        self.ssrc = ssrc
        self.timestamp = timestamp
        self.volume = volume
        self._step = CLOCK_RATE * PACKET_MS // 1000
        self._updates = -(-duration_ms // PACKET_MS)  # ticks until the tone ends, rounded up
        self._tick = 0

    @property
    def done(self) -> bool:
        return self._tick >= self._updates + END_REPEATS - 1

    def next_packet(self, sequence_number: int) -> RtpPacket | None:
        """The packet for this tick, or None once the press is fully sent."""
        if self.done:
            return None
        self._tick += 1
        ended = self._tick >= self._updates
        report = TelephoneEvent(
            event=self.event,
            end=ended,
            volume=self.volume,
            duration=min(self._tick, self._updates) * self._step,
        )
        return RtpPacket(
            payload_type=self.payload_type,
            sequence_number=sequence_number,
            timestamp=self.timestamp,
            ssrc=self.ssrc,
            marker=self._tick == 1,
            payload=report.serialize(),
        )


def info_digit(content_type: str, body: str) -> str | None:
    """The key in an INFO body: `Signal=5` (application/dtmf-relay) or `5` (application/dtmf)."""
    value = body.strip()
    if content_type == "application/dtmf-relay":
        value = ""
        for line in body.splitlines():
            name, _, rest = line.partition("=")
            if name.strip().lower() == "signal":
                value = rest.strip()
    digit = {"10": "*", "11": "#"}.get(value, value).upper()
    return digit if len(digit) == 1 and digit in "0123456789*#ABCD" else None
