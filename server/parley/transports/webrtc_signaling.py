"""WebRTC signalling: the checks on a browser's offer, the STUN/TURN servers, the host candidates."""

from __future__ import annotations

import aioice.ice
from aiortc import RTCIceServer


class SignalingError(ValueError):
    """The offer cannot be used: the caller gets a 400 with this message."""


def validate_offer_sdp(sdp: str) -> None:
    if not sdp.strip().startswith("v=0"):
        raise SignalingError("the SDP must start with v=0")
    media = [line for line in sdp.splitlines() if line.startswith("m=")]
    if not any(line.startswith("m=audio") for line in media):
        raise SignalingError("the offer has no audio")


def parse_ice_servers(urls: tuple[str, ...]) -> list[RTCIceServer]:
    """`stun:host:port`, `turn:host:port`, or `turn:user:secret@host:port` (credentials inline)."""
    servers = []
    for url in urls:
        scheme, _, rest = url.partition(":")
        if scheme not in ("stun", "stuns", "turn", "turns") or not rest:
            raise SignalingError(f"not a STUN/TURN URL: {url!r}")
        if "@" in rest:
            creds, _, host = rest.rpartition("@")
            username, _, credential = creds.partition(":")
            servers.append(RTCIceServer(urls=f"{scheme}:{host}", username=username, credential=credential))
        else:
            servers.append(RTCIceServer(urls=url))
    return servers


def configure_ice(addresses: tuple[str, ...]) -> None:
    """Offer only these local addresses as ICE host candidates (process-wide; aioice has no setting).

    aioice never offers 127.0.0.1 on its own, so loopback-only tests need this; so do containers and
    multi-homed hosts, whose other interfaces are unreachable for callers.
    """
    if addresses:
        chosen = list(addresses)
        aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [
            a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)
        ]
