"""Symmetric RTP (RFC 4961) and comedia latching: which source a call's RTP is taken from and sent back to.

A peer behind NAT advertises an address it cannot be reached on, so media goes back to where its RTP
comes from. But an RTP port is reachable by anyone, so the first packet from anywhere must not become the
caller: only a source on an address the call expects (the SDP's, the signalling source's, a trunk network
on --sip-allow) is latched to, and a latched call moves to another such source only when a stream from it
keeps coming while the latched one has fallen silent (a NAT binding that changed, media that moved).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

# A re-latch needs a stream, not a packet: one SSRC from one new source, this many packets in a row with
# nothing from the latched source between them, spread over at least this long, none further apart than
# the gap. A stray or injected packet, a short burst or a trickle never moves the call; a real NAT
# rebinding costs the caller this much audio.
RELATCH_PACKETS = 10
RELATCH_S = 0.3
RELATCH_GAP_S = 0.5  # a phone sends every 20-60 ms; far longer pauses are no stream

Address = tuple[str, int]
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PeerSources:
    """Where a call's peer may send RTP from besides its SDP's address: the address its signalling came
    from (a NATed phone's public address), and the networks of the trunks on --sip-allow."""

    signalling: str | None = None
    networks: tuple[IpNetwork, ...] = ()


@dataclass
class _Candidate:
    source: Address
    ssrc: int
    first_at: float
    last_at: float
    packets: int = 1


class Latch:
    """The peer's RTP source: chosen among the expected addresses, kept until a stream replaces it."""

    def __init__(self, sources: PeerSources, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._networks = sources.networks
        self._signalling = _ip(sources.signalling)
        self._sdp: IpAddress | None = None
        self._candidate: _Candidate | None = None
        self.latched: Address | None = None
        self.relatched = 0

    def expect_sdp_address(self, host: str | None) -> None:
        """The address the peer's SDP names (None, or a hold address, adds none)."""
        address = _ip(host)
        self._sdp = None if address is None or address.is_unspecified else address

    def unlatch(self) -> None:
        """The peer said its media moved (a new SDP address): latch afresh to the next expected source."""
        self.latched = None
        self._candidate = None

    def expects(self, host: str) -> bool:
        """Whether RTP from `host` may be the peer's."""
        address = _ip(host)
        if address is None:
            return False
        return address in (self._sdp, self._signalling) or any(address in net for net in self._networks)

    def may_be_peer(self, host: str) -> bool:
        """Whether anything from `host` may be the peer's (RTP or RTCP): the latched source's address
        once there is one, else an expected one. A cheap check, made before any parsing or crypto."""
        if self.latched is not None and host == self.latched[0]:
            return True
        return self.expects(host)

    def admit(self, source: Address, ssrc: int) -> bool:
        """Whether a valid packet from `source` is the peer's media; latches or re-latches as it goes."""
        if source == self.latched:
            self._candidate = None  # the latched source is alive: whoever else sends is not its successor
            return True
        if not self.expects(source[0]):
            return False
        if self.latched is None:
            self.latched = source
            return True
        return self._stream_from(source, ssrc)

    def _stream_from(self, source: Address, ssrc: int) -> bool:
        now = self._clock()
        candidate = self._candidate
        if (
            candidate is None
            or candidate.source != source
            or candidate.ssrc != ssrc
            or now - candidate.last_at > RELATCH_GAP_S
        ):
            self._candidate = _Candidate(source, ssrc, now, now)
            return False
        candidate.packets += 1
        candidate.last_at = now
        if candidate.packets < RELATCH_PACKETS or now - candidate.first_at < RELATCH_S:
            return False
        self.latched, self._candidate = source, None
        self.relatched += 1
        return True


def _ip(host: str | None) -> IpAddress | None:
    if not host:
        return None
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None  # a name (an outbound call's URI host) is no source address to compare with
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d
    return address
