"""Limits on what a peer may send: SDP offers, JSON bodies, data-channel messages.

Each check is cheap and runs before the expensive work it guards: an offer's size, media sections and
ICE candidates are counted before aiortc parses it (every receiving m-line becomes a transceiver with a
decoder; every candidate an ICE check), and a JSON body is parsed with its nesting bounded (Python's
parser raises RecursionError, not ValueError, on deep nesting).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from parley.ratelimit import TokenBucket
from parley.webrtc_settings import WebRtcSettings


class LimitExceeded(ValueError):
    """Over a limit: `status` is the HTTP status that says so (413 too large, 400 otherwise)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class BadJson(ValueError):
    """Not JSON, not UTF-8, or nested too deeply to parse."""


def parse_json(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise BadJson("the JSON is nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadJson("the body must be JSON") from exc


@dataclass(frozen=True)
class SdpLimits:
    max_bytes: int = 16384
    max_m_lines: int = 4
    max_candidates: int = 64

    @classmethod
    def of(cls, settings: WebRtcSettings) -> SdpLimits:
        return cls(settings.max_sdp_bytes, settings.max_m_lines, settings.max_ice_candidates)


def check_offer_size(sdp: str, limits: SdpLimits) -> None:
    """Raise LimitExceeded when an offer is larger, or has more media sections or candidates, than allowed.

    One audio section only: every audio m-line gets a receiving transceiver and its decoder, and a call has
    one caller to hear.
    """
    if len(sdp.encode("utf-8", "replace")) > limits.max_bytes:
        raise LimitExceeded(f"the SDP is too large (limit {limits.max_bytes} bytes)", 413)
    m_lines = audio = candidates = 0
    for line in sdp.splitlines():
        if line.startswith("m="):
            m_lines += 1
            audio += line.startswith("m=audio")
        elif line.startswith("a=candidate"):
            candidates += 1
    if m_lines > limits.max_m_lines:
        raise LimitExceeded(f"the offer has {m_lines} media sections (limit {limits.max_m_lines})")
    if audio > 1:
        raise LimitExceeded(f"the offer has {audio} audio sections (one is allowed)")
    if candidates > limits.max_candidates:
        raise LimitExceeded(f"the offer has {candidates} ICE candidates (limit {limits.max_candidates})")


class MessageGuard:
    """Size and rate limits on a stream of messages from one peer (a data channel).

    `admit` answers None for a message to handle, or why it is refused ("too_big", "rate"). A peer that
    keeps sending over the limit is `flooding`: its channel is worth closing, not just ignoring. Refusals
    are counted over a window, not in a row: a peer sending 100 messages a second against a limit of 10
    has one admitted every tenth of a second, and would never be refused 200 times in a row.
    """

    FLOOD_AFTER = 200  # refusals within FLOOD_WINDOW_S
    FLOOD_WINDOW_S = 10.0

    def __init__(self, max_bytes: int, per_s: float, now: float) -> None:
        self.max_bytes = max_bytes
        self._bucket = TokenBucket(per_s, max(1, int(2 * per_s)), now)
        self._refusals: deque[float] = deque(maxlen=self.FLOOD_AFTER)  # when the last ones were

    def admit(self, size: int, now: float) -> str | None:
        if size > self.max_bytes:
            reason: str | None = "too_big"
        else:
            reason = "rate" if self._bucket.take(now) > 0 else None
        if reason:
            self._refusals.append(now)
        return reason

    @property
    def flooding(self) -> bool:
        """The last FLOOD_AFTER refusals came within FLOOD_WINDOW_S (asked right after a refusal)."""
        refusals = self._refusals
        return len(refusals) == self.FLOOD_AFTER and refusals[-1] - refusals[0] <= self.FLOOD_WINDOW_S
