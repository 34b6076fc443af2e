"""SRTP and SRTCP (RFC 3711) for one call, keyed by SDES (sdes.py), done by libsrtp through pylibsrtp.

Each direction has its own master key and context: ours protects what we send, the peer's checks and
decrypts what arrives. A packet that fails authentication or the replay check is refused before it is
read, so no unauthenticated packet can latch the stream, keep the call alive or reach the caller's ear.
"""

from __future__ import annotations

from collections.abc import Callable

from pylibsrtp import Error, Policy, Session

from parley.transports.sip.sdes import AES_CM_128_HMAC_SHA1_32, AES_CM_128_HMAC_SHA1_80, SrtpKeys

# libsrtp's profiles for the SDES suites; for _32 it keeps SRTCP's 80-bit tag, as RFC 4568 6.2.2 asks.
_PROFILES = {
    AES_CM_128_HMAC_SHA1_80: Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    AES_CM_128_HMAC_SHA1_32: Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}


class SrtpError(ValueError):
    """A packet that failed authentication or the replay check (or could not be protected)."""


class SrtpContext:
    """The two crypto contexts of one stream (RFC 3711 3.2): ours outbound, the peer's inbound."""

    def __init__(self, keys: SrtpKeys, previous: SrtpContext | None = None) -> None:
        """`previous`, the context before a re-INVITE: a direction whose key did not change keeps its
        context, whose rollover counter and replay list a fresh one would lose (RFC 4568 7.1.4)."""
        self.keys = keys
        kept = previous if previous is not None and previous.keys.suite == keys.suite else None
        self._outbound: Session = (
            kept._outbound
            if kept is not None and kept.keys.local == keys.local
            else _session(keys.local, Policy.SSRC_ANY_OUTBOUND, keys.suite)
        )
        self._inbound: Session = (
            kept._inbound
            if kept is not None and kept.keys.remote == keys.remote
            else _session(keys.remote, Policy.SSRC_ANY_INBOUND, keys.suite)
        )

    def protect(self, rtp: bytes) -> bytes:
        return _apply(self._outbound.protect, rtp, "SRTP protect failed")

    def protect_rtcp(self, rtcp: bytes) -> bytes:
        return _apply(self._outbound.protect_rtcp, rtcp, "SRTCP protect failed")

    def unprotect(self, srtp: bytes) -> bytes:
        return _apply(self._inbound.unprotect, srtp, "SRTP packet refused")

    def unprotect_rtcp(self, srtcp: bytes) -> bytes:
        return _apply(self._inbound.unprotect_rtcp, srtcp, "SRTCP packet refused")


def srtp_context(keys: SrtpKeys | None, previous: SrtpContext | None) -> SrtpContext | None:
    """The context for a stream's new agreement: None for plain RTP, else one keeping what it can."""
    if keys is None:
        return None
    if previous is not None and previous.keys == keys:
        return previous
    return SrtpContext(keys, previous)


def _session(master_key: bytes, ssrc_type: int, suite: str) -> Session:
    return Session(Policy(master_key, ssrc_type, srtp_profile=_PROFILES[suite]))


def _apply(operation: Callable[[bytes], bytes], packet: bytes, what: str) -> bytes:
    try:
        return bytes(operation(packet))
    except (Error, ValueError) as exc:  # ValueError: a packet longer than libsrtp's buffer
        raise SrtpError(f"{what}: {exc}") from None
