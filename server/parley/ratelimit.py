"""Per-source limits on call set-up: a token bucket per source address, shared by every transport.

A flood of offers, INVITEs or carrier streams from one address must not take every line, nor the CPU
that answering them costs (an answer runs DTLS and ICE set-up; a refusal costs almost nothing). Each
source gets `burst` set-ups at once and `rate` more per second after that; beyond, the transport refuses
with its own "try again" (HTTP 429 + Retry-After, SIP 503 + Retry-After, a WebSocket close 1013).

IPv6 sources are counted per /64: one subscriber usually holds a whole /64, and counting single addresses
would give them 2^64 buckets. Only the most recently seen `max_sources` are remembered; a source that
was forgotten starts with a full bucket again, which costs at most one burst.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from parley.log import event

log = logging.getLogger(__name__)

MAX_SOURCES = 50_000
MAX_WARNED = 16  # proxies nobody named, each logged once
FORWARDING_HEADERS = ("X-Forwarded-For", "Forwarded", "X-Real-IP")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TokenBucket:
    """`burst` tokens at most, refilled at `rate` per second."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float) -> float:
        """Take a token: 0.0 when there was one, else the seconds until there will be one."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def networks(values: Iterable[str]) -> list[Network]:
    return [ipaddress.ip_network(value, strict=False) for value in values]


def _in(address: str, nets: list[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in nets)


def _near(address: str) -> bool:
    """A loopback or private address: this host, or a network of the operator's."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private


def source_key(address: str) -> str:
    """What a source is counted as: its IPv4 address, its IPv6 /64, or (unparseable) the text itself."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class SourceLimiter:
    """Token buckets per source. `rate` 0 turns the limit off. Used on the event loop only."""

    def __init__(
        self, rate: float, burst: int, exempt: Iterable[str] = (), max_sources: int = MAX_SOURCES
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.exempt = networks(exempt)
        self.max_sources = max_sources
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def spares(self, address: str) -> bool:
        return _in(address, self.exempt)

    def check(self, address: str, now: float, *, spare: bool = True) -> float:
        """Count one set-up from `address`: 0.0 when allowed, else the seconds to wait before the next.
        `spare=False`: counted even from an exempt address (it forwarded someone else's request)."""
        if self.rate <= 0 or (spare and self.spares(address)):
            return 0.0
        key = source_key(address)
        bucket = self._buckets.pop(key, None) or TokenBucket(self.rate, self.burst, now)
        self._buckets[key] = bucket  # most recently seen last
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return bucket.take(now)


def retry_after(seconds: float) -> str:
    """A Retry-After value (whole seconds, at least 1)."""
    return str(max(1, math.ceil(seconds)))


def forwarded_source(remote: str, headers: Mapping[str, str], trusted: list[Network]) -> str:
    """The caller's address: the peer's, or when the peer is a trusted proxy, the nearest address in
    X-Forwarded-For that is not one (each proxy appends the address it got the request from)."""
    if not trusted or not _in(remote, trusted):
        return remote
    hops = [hop.strip() for hop in headers.get("X-Forwarded-For", "").split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _in(hop, trusted):
            return hop
    return remote


@dataclass(frozen=True)
class Source:
    """Who sets a call up, as the per-source limits count it. `spareable` is False for a request that
    a proxy nobody named forwarded: its peer (say loopback) may be exempt, the callers behind it are not."""

    address: str
    spareable: bool = True


class Proxies:
    """The proxies in front of the service (--trusted-proxies): only their X-Forwarded-* headers count."""

    def __init__(self, trusted: Iterable[str]) -> None:
        self.trusted = networks(trusted)
        self._warned: set[str] = set()

    def trusts(self, remote: str) -> bool:
        return _in(remote, self.trusted)

    def source(self, remote: str, headers: Mapping[str, str]) -> Source:
        """Who a request comes from. A forwarded request from a peer that is not a trusted proxy counts
        as that peer, never spared: otherwise a local proxy would make every caller behind it exempt."""
        if self.trusts(remote):
            return Source(forwarded_source(remote, headers, self.trusted))
        if not any(name in headers for name in FORWARDING_HEADERS):
            return Source(remote)
        # An operator's proxy sits on this host or its network; anyone else's headers are only ignored.
        if _near(remote) and remote not in self._warned and len(self._warned) < MAX_WARNED:
            self._warned.add(remote)
            event(
                log,
                "untrusted_proxy",
                logging.WARNING,
                proxy=remote,
                hint="name it in --trusted-proxies so that the callers behind it are told apart",
            )
        return Source(remote, spareable=False)

    def forwarded(self, remote: str, headers: Mapping[str, str], name: str) -> str | None:
        """A trusted proxy's X-Forwarded-<name> (its first value), else None."""
        if not self.trusts(remote):
            return None
        value = headers.get(f"X-Forwarded-{name}", "").split(",")[0].strip()
        return value or None
