"""Where a call's RTP is taken from and sent back to: only expected sources, and a move only on a stream."""

from __future__ import annotations

import ipaddress

from parley.transports.sip.latching import RELATCH_GAP_S, RELATCH_PACKETS, RELATCH_S, Latch, PeerSources

CALLER = ("198.51.100.7", 40000)
NAT_MOVED = ("198.51.100.7", 41234)
STRANGER = ("203.0.113.66", 5004)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def latch(sources: PeerSources | None = None, sdp: str | None = CALLER[0]) -> tuple[Latch, Clock]:
    clock = Clock()
    chosen = Latch(sources or PeerSources(), clock)
    chosen.expect_sdp_address(sdp)
    return chosen, clock


def test_the_first_packet_from_the_sdp_address_is_the_caller_and_a_stranger_never_is() -> None:
    chosen, _ = latch()
    assert not chosen.admit(STRANGER, ssrc=1)
    assert chosen.latched is None
    assert chosen.admit(CALLER, ssrc=7)
    assert chosen.latched == CALLER
    assert not chosen.admit(STRANGER, ssrc=7)


def test_a_natted_phone_is_found_at_its_signalling_address_not_its_private_sdp_one() -> None:
    chosen, _ = latch(PeerSources(signalling=CALLER[0]), sdp="10.0.0.5")
    assert chosen.admit(CALLER, ssrc=7) and chosen.latched == CALLER


def test_a_trunks_media_servers_on_the_allow_list_may_send() -> None:
    trunk = PeerSources(signalling="192.0.2.1", networks=(ipaddress.ip_network("192.0.2.0/24"),))
    chosen, _ = latch(trunk, sdp="192.0.2.1")
    assert not chosen.admit(STRANGER, ssrc=1)
    assert chosen.admit(("192.0.2.77", 30000), ssrc=1)


def test_a_hold_address_or_a_name_is_no_source() -> None:
    chosen, _ = latch(PeerSources(signalling="pbx.example.com"), sdp="0.0.0.0")
    assert not chosen.expects("0.0.0.0") and not chosen.expects("pbx.example.com")
    assert not chosen.admit(CALLER, ssrc=1)


def test_an_ipv4_peer_seen_through_a_dual_stack_socket_is_the_same_address() -> None:
    chosen, _ = latch()
    assert chosen.expects(f"::ffff:{CALLER[0]}")


def test_stray_packets_from_the_callers_own_address_never_move_the_call() -> None:
    chosen, clock = latch()
    chosen.admit(CALLER, ssrc=7)
    for _ in range(RELATCH_PACKETS * 3):  # a flood, but one packet at a time
        clock.now += 0.02
        assert not chosen.admit(NAT_MOVED, ssrc=7)
        assert chosen.admit(CALLER, ssrc=7)  # the caller still speaks between them
    assert chosen.latched == CALLER and chosen.relatched == 0


def test_a_burst_too_short_in_time_does_not_move_the_call() -> None:
    chosen, _ = latch()
    chosen.admit(CALLER, ssrc=7)
    for _ in range(RELATCH_PACKETS * 2):
        assert not chosen.admit(NAT_MOVED, ssrc=7)  # all at once: no phone sends like this
    assert chosen.latched == CALLER


def test_a_stream_that_keeps_coming_while_the_caller_is_silent_moves_the_call() -> None:
    chosen, clock = latch()
    chosen.admit(CALLER, ssrc=7)
    moved_after = None
    for count in range(1, 4 * RELATCH_PACKETS):
        clock.now += RELATCH_S / (RELATCH_PACKETS - 1)
        if chosen.admit(NAT_MOVED, ssrc=7):
            moved_after = count
            break
    assert moved_after is not None and moved_after >= RELATCH_PACKETS
    assert chosen.latched == NAT_MOVED and chosen.relatched == 1
    assert not chosen.admit(CALLER, ssrc=7)  # the old binding is now the stranger


def test_a_change_of_ssrc_within_the_new_stream_starts_the_count_again() -> None:
    chosen, clock = latch()
    chosen.admit(CALLER, ssrc=7)
    for i in range(3 * RELATCH_PACKETS):
        clock.now += 0.05
        assert not chosen.admit(NAT_MOVED, ssrc=i)  # every packet another sender
    assert chosen.latched == CALLER


def test_an_sdp_move_lets_the_next_expected_packet_latch() -> None:
    chosen, _ = latch()
    chosen.admit(CALLER, ssrc=7)
    chosen.unlatch()
    chosen.expect_sdp_address("198.51.100.9")
    assert not chosen.admit(STRANGER, ssrc=1)
    assert chosen.admit(("198.51.100.9", 6000), ssrc=8)


def test_a_trickle_of_packets_is_no_stream_however_long_it_lasts() -> None:
    chosen, clock = latch()
    chosen.admit(CALLER, ssrc=7)
    for _ in range(5 * RELATCH_PACKETS):
        clock.now += RELATCH_GAP_S + 0.1  # the caller silent throughout (on mute, DTX)
        assert not chosen.admit(NAT_MOVED, ssrc=7)
    assert chosen.latched == CALLER


def test_only_the_latched_address_or_an_expected_one_may_be_the_peer() -> None:
    chosen, _ = latch(PeerSources(signalling="192.0.2.1"))
    assert chosen.may_be_peer("192.0.2.1") and chosen.may_be_peer(CALLER[0])
    assert not chosen.may_be_peer(STRANGER[0])
