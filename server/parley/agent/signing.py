"""Signatures on what parley sends to a team's backend (tool webhooks, events).

`X-Parley-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, keyed by --webhook-secret.
The timestamp inside the signed text lets a receiver refuse replays older than a few minutes.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time

HEADER = "X-Parley-Signature"
DEFAULT_TOLERANCE_S = 300
MAX_HEADER_CHARS = 1024  # one timestamp and a few signatures; anything longer is not ours
MAX_TIMESTAMP_DIGITS = 12  # unix seconds for the next 30,000 years
_HEX = re.compile(r"[0-9a-fA-F]{64}")


def sign(body: bytes, secret: str, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(header: str, body: bytes, secret: str, tolerance_s: int = DEFAULT_TOLERANCE_S) -> bool:
    """What a receiver does: the signature matches and is recent. Anything else, however malformed (no
    `t=`, a `t` that is not an integer or too large for a float, a `v1` that is not hex, no header at
    all), is False, never an exception: a receiver's handler must not crash on what a stranger sent."""
    if not isinstance(header, str) or len(header) > MAX_HEADER_CHARS:
        return False
    parts: dict[str, str] = {}
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if sep and name not in parts:
            parts[name] = value.strip()
    t_text, given = parts.get("t", ""), parts.get("v1", "")
    if not t_text.isascii() or not t_text.isdigit() or len(t_text) > MAX_TIMESTAMP_DIGITS:
        return False
    if not _HEX.fullmatch(given):
        return False
    t = int(t_text)
    if abs(time.time() - t) > tolerance_s:
        return False
    expected = sign(body, secret, t).split("v1=", 1)[1]
    return hmac.compare_digest(expected.encode(), given.lower().encode())
