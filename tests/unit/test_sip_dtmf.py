"""Keypad digits as RFC 4733 telephone-events: each press reported once, and one press sent right."""

from __future__ import annotations

import pytest

from parley.transports.sip.dtmf import DtmfReceiver, DtmfSender, TelephoneEvent
from parley.transports.sip.rtp import RtpPacket

EVENT_PT = 101


def press(
    digit_event: int, timestamp: int, first_seq: int, *, updates: int = 7, repeat_start: int = 1
) -> list[RtpPacket]:
    """A phone's packet train for one key: the start (maybe repeated), updates, three end packets."""
    reports = [TelephoneEvent(digit_event, duration=0)] * repeat_start
    reports += [TelephoneEvent(digit_event, duration=160 * k) for k in range(1, updates + 1)]
    reports += [TelephoneEvent(digit_event, end=True, duration=160 * (updates + 1))] * 3
    return [
        RtpPacket(
            payload_type=EVENT_PT,
            sequence_number=first_seq + i,
            timestamp=timestamp,
            ssrc=77,
            marker=i < repeat_start,
            payload=report.serialize(),
        )
        for i, report in enumerate(reports)
    ]


def received(receiver: DtmfReceiver, packets: list[RtpPacket]) -> list[str]:
    return [digit for p in packets if (digit := receiver.push(p)) is not None]


def test_an_event_round_trips_through_its_four_bytes() -> None:
    event = TelephoneEvent(event=11, end=True, volume=10, duration=1280)
    assert event.serialize() == bytes([11, 0x8A, 0x05, 0x00])
    assert TelephoneEvent.parse(event.serialize()) == event
    assert event.digit == "#"
    assert TelephoneEvent(16).digit is None  # flash is an event, not a key


def test_a_short_payload_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter than 4"):
        TelephoneEvent.parse(b"\x01\x02")


def test_a_digit_repeated_in_end_packets_is_reported_once() -> None:
    assert received(DtmfReceiver(), press(5, timestamp=8000, first_seq=100)) == ["5"]


def test_a_start_sent_three_times_is_reported_once() -> None:
    assert received(DtmfReceiver(), press(1, timestamp=8000, first_seq=100, repeat_start=3)) == ["1"]


def test_the_same_key_pressed_twice_is_two_digits() -> None:
    packets = press(9, timestamp=8000, first_seq=100) + press(9, timestamp=11200, first_seq=110)
    assert received(DtmfReceiver(), packets) == ["9", "9"]


def test_a_press_whose_start_was_lost_is_still_reported_once() -> None:
    packets = press(3, timestamp=8000, first_seq=100)[2:]
    assert received(DtmfReceiver(), packets) == ["3"]


def test_a_late_end_packet_of_the_previous_press_is_not_a_new_digit() -> None:
    first = press(4, timestamp=8000, first_seq=100)
    second = press(2, timestamp=11200, first_seq=110)
    packets = first[:-1] + second[:3] + first[-1:] + second[3:]
    assert received(DtmfReceiver(), packets) == ["4", "2"]


def test_a_key_held_past_the_duration_field_is_one_press() -> None:
    # RFC 4733 2.5.1.3: the second segment starts where the first one's 65535 units end, unmarked.
    segment = [
        RtpPacket(EVENT_PT, 1, 8000, 77, marker=True, payload=TelephoneEvent(0, duration=160).serialize()),
        RtpPacket(EVENT_PT, 2, 8000, 77, payload=TelephoneEvent(0, duration=65535).serialize()),
        RtpPacket(EVENT_PT, 3, 8000 + 65535, 77, payload=TelephoneEvent(0, duration=160).serialize()),
        RtpPacket(
            EVENT_PT, 4, 8000 + 65535, 77, payload=TelephoneEvent(0, end=True, duration=800).serialize()
        ),
    ]
    assert received(DtmfReceiver(), segment) == ["0"]


def test_a_garbled_event_payload_is_counted_and_skipped() -> None:
    receiver = DtmfReceiver()
    assert receiver.push(RtpPacket(EVENT_PT, 1, 0, 77, marker=True, payload=b"\x05")) is None
    assert receiver.invalid == 1


def test_a_press_is_sent_as_marked_start_growing_updates_and_three_ends() -> None:
    sender = DtmfSender("#", payload_type=EVENT_PT, ssrc=5, timestamp=4000, duration_ms=160)
    packets = []
    seq = 500
    while (packet := sender.next_packet(seq)) is not None:
        packets.append(packet)
        seq += 1
    reports = [TelephoneEvent.parse(p.payload) for p in packets]
    assert [p.marker for p in packets] == [True] + [False] * 9
    assert {p.timestamp for p in packets} == {4000} and {p.ssrc for p in packets} == {5}
    assert [p.sequence_number for p in packets] == list(range(500, 510))
    assert [r.duration for r in reports] == [160, 320, 480, 640, 800, 960, 1120, 1280, 1280, 1280]
    assert [r.end for r in reports] == [False] * 7 + [True] * 3
    assert {r.event for r in reports} == {11}
    assert sender.done and sender.next_packet(seq) is None


def test_what_the_sender_sends_the_receiver_reports_once() -> None:
    receiver = DtmfReceiver()
    digits = []
    for n, digit in enumerate("1*1"):
        sender = DtmfSender(digit, payload_type=EVENT_PT, ssrc=5, timestamp=1600 * n)
        while (packet := sender.next_packet(n * 10)) is not None:
            if (got := receiver.push(packet)) is not None:
                digits.append(got)
    assert digits == ["1", "*", "1"]


def test_a_key_that_is_not_on_the_keypad_is_refused() -> None:
    with pytest.raises(ValueError, match="not a DTMF key"):
        DtmfSender("x", payload_type=EVENT_PT, ssrc=5, timestamp=0)
