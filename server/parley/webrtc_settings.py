"""The WebRTC settings: ICE for browser calls, and the bounds on a page's offer, messages and media.
A group of `Settings` (config.py), which inherits it; app.py, limits.py and transports/webrtc*.py read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt


@dataclass(frozen=True)
class WebRtcSettings:
    """Browser calls: ICE, and the limits on a page's offer, messages and media."""

    ice_addresses: tuple[str, ...] = field(
        default=(), metadata=_opt("local addresses offered as ICE host candidates (comma list)", "webrtc")
    )
    ice_servers: tuple[str, ...] = field(
        default=(), metadata=_opt("STUN/TURN URLs (comma list; turn:user:pass@host:port)", "webrtc")
    )
    # limits on a page's offer, its messages and its media
    max_sdp_bytes: int = field(default=16384, metadata=_opt("largest SDP offer accepted (bytes)", "limits"))
    max_m_lines: int = field(
        default=4, metadata=_opt("media sections (m= lines) an offer may have", "limits")
    )
    max_ice_candidates: int = field(default=64, metadata=_opt("ICE candidates an offer may carry", "limits"))
    max_dc_message_bytes: int = field(
        default=4096, metadata=_opt("largest data-channel message taken from the page (bytes)", "limits")
    )
    max_dc_messages_per_s: float = field(
        default=20.0, metadata=_opt("data-channel messages per second taken from the page", "limits")
    )
    connect_timeout_s: float = field(
        default=15.0, metadata=_opt("a WebRTC call whose media does not connect within this ends", "limits")
    )
    media_timeout_s: float = field(
        default=20.0,
        metadata=_opt("a WebRTC caller that sends no audio for this long has vanished (0: never)", "limits"),
    )
