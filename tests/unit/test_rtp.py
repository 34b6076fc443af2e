"""RTP packets (RFC 3550) and the receive jitter buffer that puts them back in order."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.transports.sip.rtp import (
    JitterBuffer,
    RtpPacket,
    is_rtcp,
    seq_diff,
    seq_newer,
    uint16_add,
    uint32_add,
)


def packet(seq: int, *, ssrc: int = 0x1234, payload: bytes = b"\xff" * 160) -> RtpPacket:
    return RtpPacket(
        payload_type=0,
        sequence_number=seq & 0xFFFF,
        timestamp=(seq * 160) & 0xFFFFFFFF,
        ssrc=ssrc,
        payload=payload,
    )


def sequence(due: list[RtpPacket | None]) -> list[int | None]:
    return [p.sequence_number if p is not None else None for p in due]


def feed(buffer: JitterBuffer, seqs: list[int], ssrc: int = 0x1234) -> list[int | None]:
    out: list[int | None] = []
    for seq in seqs:
        out += sequence(buffer.push(packet(seq, ssrc=ssrc)))
    return out


# Packets


def test_a_packet_round_trips_with_marker_and_csrcs() -> None:
    original = RtpPacket(
        payload_type=8,
        sequence_number=65535,
        timestamp=0xFFFFFFFF,
        ssrc=0xDEADBEEF,
        marker=True,
        payload=b"abc",
        csrc=(1, 2, 3),
    )
    data = original.serialize()
    assert len(data) == 12 + 12 + 3
    assert RtpPacket.parse(data) == original


def test_a_header_extension_is_skipped_and_padding_removed() -> None:
    header = bytes([0x80 | 0x20 | 0x10 | 1, 0x80 | 101]) + struct.pack("!HII", 7, 1000, 42)
    csrc = struct.pack("!I", 99)
    extension = struct.pack("!HH", 0xBEDE, 2) + b"\x00" * 8
    data = header + csrc + extension + b"\x01\x02\x03\x04" + b"\x00\x00\x03"
    parsed = RtpPacket.parse(data)
    assert parsed.payload == b"\x01\x02\x03\x04"
    assert (parsed.payload_type, parsed.marker, parsed.sequence_number, parsed.timestamp, parsed.ssrc) == (
        101,
        True,
        7,
        1000,
        42,
    )
    assert parsed.csrc == (99,)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x80\x00\x00", "shorter than the 12-byte header"),
        (b"\x40" + b"\x00" * 11, "version 1"),
        (b"\x83" + b"\x00" * 11 + b"\x00" * 8, "3 CSRCs"),
        (b"\x90" + b"\x00" * 11 + b"\x00\x00", "extension is truncated"),
        (b"\x90" + b"\x00" * 11 + b"\x00\x00\x00\x05", "runs past the packet"),
        (b"\xa0" + b"\x00" * 11 + b"\x00", "padding of 0 bytes"),
        (b"\xa0" + b"\x00" * 11 + b"\x01\x09", "padding of 9 bytes"),
    ],
)
def test_a_malformed_packet_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        RtpPacket.parse(data)


@given(st.binary(max_size=80))
def test_arbitrary_bytes_raise_only_value_error(data: bytes) -> None:
    try:
        parsed = RtpPacket.parse(data)
    except ValueError:
        return
    assert RtpPacket.parse(parsed.serialize()) == parsed


def test_fields_outside_their_bits_are_refused() -> None:
    with pytest.raises(ValueError, match="payload type"):
        RtpPacket(payload_type=128, sequence_number=0, timestamp=0, ssrc=0)
    with pytest.raises(ValueError, match="sequence number"):
        RtpPacket(payload_type=0, sequence_number=65536, timestamp=0, ssrc=0)


def test_rtcp_on_the_rtp_port_is_told_apart_from_audio() -> None:
    sender_report = bytes([0x80, 200]) + b"\x00" * 26
    receiver_report = bytes([0x81, 201]) + b"\x00" * 30
    assert is_rtcp(sender_report) and is_rtcp(receiver_report)
    assert not is_rtcp(packet(1).serialize())
    marked_audio = RtpPacket(payload_type=8, sequence_number=1, timestamp=0, ssrc=1, marker=True).serialize()
    assert not is_rtcp(marked_audio) and not is_rtcp(b"") and not is_rtcp(b"\x00\xc8")


def test_sequence_arithmetic_wraps_round() -> None:
    assert uint16_add(65535, 2) == 1
    assert uint32_add(0xFFFFFFFF, 160) == 159
    assert seq_newer(0, 65535) and not seq_newer(65535, 0) and not seq_newer(5, 5)
    assert seq_diff(2, 65534) == 4 and seq_diff(65534, 2) == -4


# Jitter buffer


def test_packets_in_order_pass_straight_through() -> None:
    assert feed(JitterBuffer(), [10, 11, 12, 13]) == [10, 11, 12, 13]


def test_a_swapped_pair_comes_out_in_order() -> None:
    buffer = JitterBuffer()
    assert feed(buffer, [10, 12, 11, 13]) == [10, 11, 12, 13]
    assert (buffer.lost, buffer.late, buffer.duplicates) == (0, 0, 0)


def test_a_lost_packet_becomes_none_once_depth_packets_wait_behind_it() -> None:
    buffer = JitterBuffer(depth=2)
    assert feed(buffer, [10, 12, 13]) == [10]  # 11 may still come: 40 ms held
    assert feed(buffer, [14]) == [None, 12, 13, 14]
    assert buffer.lost == 1


def test_a_burst_loss_is_one_none_per_missing_packet() -> None:
    buffer = JitterBuffer()
    assert feed(buffer, [1, 6, 7, 8]) == [1, None, None, None, None, 6, 7, 8]
    assert buffer.lost == 4


def test_a_packet_arriving_after_its_gap_was_given_up_is_late() -> None:
    buffer = JitterBuffer()
    feed(buffer, [10, 12, 13, 14])
    assert feed(buffer, [11]) == []
    assert (buffer.late, buffer.lost, buffer.duplicates) == (1, 1, 0)


def test_duplicates_are_dropped_whether_held_or_delivered() -> None:
    buffer = JitterBuffer()
    assert feed(buffer, [10, 11, 13, 13, 11]) == [10, 11]
    assert buffer.duplicates == 2
    assert feed(buffer, [12]) == [12, 13]


def test_the_sequence_wraps_without_a_gap() -> None:
    assert feed(JitterBuffer(), [65534, 0, 65535, 1]) == [65534, 65535, 0, 1]


def test_a_new_ssrc_starts_over_and_releases_what_the_old_one_held() -> None:
    buffer = JitterBuffer()
    out = feed(buffer, [10, 12], ssrc=1) + feed(buffer, [5000, 5001], ssrc=2)
    assert out == [10, None, 12, 5000, 5001]


def test_a_jump_of_over_a_hundred_resyncs_once_a_second_packet_confirms_it() -> None:
    buffer = JitterBuffer()
    assert feed(buffer, [10, 11]) == [10, 11]
    assert feed(buffer, [30000]) == []  # could be a stray
    assert feed(buffer, [30001, 30002]) == [30000, 30001, 30002]
    assert buffer.lost == 0


def test_a_single_stray_far_packet_is_dropped_and_the_stream_goes_on() -> None:
    buffer = JitterBuffer()
    assert feed(buffer, [10, 11, 40000, 12, 13]) == [10, 11, 12, 13]
    assert feed(buffer, [14]) == [14]
    assert (buffer.late, buffer.lost) == (1, 0)


def test_flush_hands_out_what_is_held_with_gaps() -> None:
    buffer = JitterBuffer()
    feed(buffer, [1, 3])
    assert sequence(buffer.flush()) == [None, 3]
    assert buffer.flush() == []


@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=60))
def test_whatever_the_arrival_order_each_number_comes_out_once_in_its_slot(offsets: list[int]) -> None:
    buffer = JitterBuffer()
    out = feed(buffer, [1000 + offset for offset in offsets]) + sequence(buffer.flush())
    # Time stays whole: from the first packet to the newest, one slot per sequence number, a packet
    # or None, in order (packets older than the first are dropped).
    first = 1000 + offsets[0]
    assert len(out) == 1000 + max(offsets) - first + 1
    assert all(seq is None or seq == first + slot for slot, seq in enumerate(out))
    assert buffer.lost == out.count(None)
