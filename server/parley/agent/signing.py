"""Signatures on what parley sends to a team's backend (tool webhooks, events).

`X-Parley-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, keyed by --webhook-secret.
The timestamp inside the signed text lets a receiver refuse replays older than a few minutes.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "X-Parley-Signature"
DEFAULT_TOLERANCE_S = 300


def sign(body: bytes, secret: str, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(header: str, body: bytes, secret: str, tolerance_s: int = DEFAULT_TOLERANCE_S) -> bool:
    """What a receiver does: the signature matches and is recent."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        t = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - t) > tolerance_s:
        return False
    expected = sign(body, secret, t).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))
