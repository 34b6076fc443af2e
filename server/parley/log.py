"""Structured logs: one line per event, `key=value` pairs, always with `call_id` when there is a call."""

from __future__ import annotations

import logging
import sys
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None)))


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}
        parts = [
            self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            record.levelname.lower(),
            record.name,
            f"event={_quote(record.getMessage())}",
        ]
        parts.extend(f"{key}={_quote(value)}" for key, value in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _quote(value: Any) -> str:
    text = f"{value:.4f}" if isinstance(value, float) else str(value)
    if not text or any(c in text for c in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aioice/aiortc log every STUN check at info level.
    for noisy in ("aioice", "aiortc", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with fields, e.g. event(log, "call_started", call_id=..., transport="webrtc")."""
    logger.log(level, name, extra=fields)
