"""Structured logs: one line per event, `key=value` pairs or JSON, always with `call_id` when there is a call.

A line logged without an explicit `call_id` still gets one when it belongs to a call: from the call's
stage threads (named `<call_id>:<stage>`) or from the asyncio tasks a transport started while setting
the call up (`CALL_ID`, a context variable that those tasks inherit). What callers and the agent said
(the `text`, `digit`, `digits` and `heard` fields) is logged only when running at debug level, or with
--log-transcripts. Phone numbers are masked to their last digits (`sip:+*********567@trunk`) in every
URI and in the fields that name a party, unless --log-numbers: a log line is kept and shipped further
than the records are.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
CALL_ID: contextvars.ContextVar[str] = contextvars.ContextVar("call_id", default="")
TRANSCRIPT_FIELDS = ("text", "digit", "digits", "heard")
NUMBER_FIELDS = ("caller", "called", "to", "from", "dial", "destination", "number", "transferred_to")
NUMBER_DIGITS_KEPT = 3
# The user part of a SIP URI (before its '@'), a tel: URI, and, in a field that names a party, a number
# on its own (E.164 or national, with the usual separators).
_SIP_USER = re.compile(r"(?<![\w+.-])(sips?:)([^@\s;>\"',/]+)(?=@)", re.IGNORECASE)
_TEL = re.compile(r"(?<![\w+.-])(tel:)(\+?[0-9][0-9().-]*)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])\+?[0-9][0-9 ()-]{3,}[0-9](?![\w.])")
# Credentials inside URLs (https://user:secret@host, postgresql://user:secret@db, turn:user:secret@host):
# whatever logs a URL or an error that quotes one, the line keeps the URL without them.
_URL_CREDENTIALS = re.compile(r"\b((?:[a-zA-Z][a-zA-Z0-9+.-]*://)|(?:turns?|stuns?):)[^\s/?#@\"']+@")


def redact_credentials(text: str) -> str:
    """`text` with the user and password of every URL in it replaced by `***`."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


def mask_number(text: str) -> str:
    """`text` with every digit but the last few replaced by `*`, when it holds enough digits to be a
    phone number (an extension like "500" or a name like "alice" stays as it is)."""
    total = sum(c.isdigit() for c in text)
    if total < 5:
        return text
    seen = 0
    masked = []
    for c in text:
        if c.isdigit():
            seen += 1
            masked.append(c if seen > total - NUMBER_DIGITS_KEPT else "*")
        else:
            masked.append(c)
    return "".join(masked)


def mask_numbers(text: str, *, alone: bool = False) -> str:
    """`text` with the numbers in its SIP and tel: URIs masked; with `alone`, numbers standing on their
    own too (a field that names a party: `+15551234567`)."""
    text = _SIP_USER.sub(lambda m: m.group(1) + mask_number(m.group(2)), text)
    text = _TEL.sub(lambda m: m.group(1) + mask_number(m.group(2)), text)
    if alone:
        text = _NUMBER.sub(lambda m: mask_number(m.group(0)), text)
    return text


CALL_THREAD_PREFIX = "c-"  # stage threads are named after their call: "c-1a2b3c4d5e6f:vad"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class CallContext(logging.Filter):
    """Adds the call's id to lines logged on its behalf without one, keeps what was said out of lines
    above debug level unless transcripts are asked for, and masks phone numbers unless asked not to."""

    def __init__(self, transcripts: bool = False, numbers: bool = False) -> None:
        super().__init__()
        self.transcripts = transcripts
        self.numbers = numbers

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "call_id", ""):
            call_id = CALL_ID.get() or _call_of_thread(record.threadName or "")
            if call_id:
                record.call_id = call_id
        debugging = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
        if not (self.transcripts or debugging) and record.levelno > logging.DEBUG:
            for name in TRANSCRIPT_FIELDS:
                if name in record.__dict__:
                    delattr(record, name)
        if not self.numbers:
            _mask_record(record)
        return True


def _mask_record(record: logging.LogRecord) -> None:
    for key, value in _fields(record).items():
        if isinstance(value, str):
            setattr(record, key, mask_numbers(value, alone=key in NUMBER_FIELDS))
    if isinstance(record.msg, str) and not record.args:
        record.msg = mask_numbers(record.msg)


def _call_of_thread(name: str) -> str:
    call_id, sep, _ = name.partition(":")
    return call_id if sep and call_id.startswith(CALL_THREAD_PREFIX) else ""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in _fields(record).items():
            line[key] = value if isinstance(value, int | float | bool | str | None) else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return redact_credentials(json.dumps(line, ensure_ascii=False))


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
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
        return redact_credentials(line)


def _quote(value: Any) -> str:
    text = f"{value:.4f}" if isinstance(value, float) else str(value)
    if not text or any(c in text for c in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


def setup_logging(
    level: str = "info", log_format: str = "text", transcripts: bool = False, numbers: bool = False
) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else KeyValueFormatter())
    handler.addFilter(CallContext(transcripts, numbers))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aioice/aiortc log every STUN check at info level.
    for noisy in ("aioice", "aiortc", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with fields, e.g. event(log, "call_started", call_id=..., transport="webrtc")."""
    logger.log(level, name, extra=fields)
