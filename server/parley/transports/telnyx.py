"""Telnyx: its dialect of the media-stream protocol, TeXML, and webhook signatures.

Telnyx's TeXML takes Twilio's verbs, so a number on a TeXML application reaches our voice webhook like a
Twilio one (`CallSid`, `From`, `To`, form-encoded) and gets the same `<Connect><Stream>`, with
`bidirectionalMode="rtp"` and `bidirectionalCodec="PCMU"` so that Telnyx plays the raw mu-law we send.
TeXML's `<Connect>` takes no `action`, but runs the verbs after it once the stream stops; a `<Redirect>`
there asks our action URL what next, as Twilio's `<Connect action>` does. TeXML's `CallSid` is the
call's `call_control_id`, the id the stream's `start` carries.
Its WebSocket messages follow Twilio's events with snake_case fields: `start.call_control_id`,
`stream_id`, `start.from` / `start.to`, `start.custom_parameters`, `start.media_format.encoding`
(PCMU or PCMA); we send `media`, `mark` and `clear` without a stream id.

Webhooks carry `telnyx-signature-ed25519` (base64 Ed25519 signature of `<telnyx-timestamp>|<body>`) and
`telnyx-timestamp` (unix seconds), checked with the account's public key.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from parley.transports.twilio import (
    ALAW,
    MULAW,
    StreamError,
    StreamStart,
    required_str,
    stream_markup,
    string_map,
)

SIGNATURE_HEADER = "telnyx-signature-ed25519"
TIMESTAMP_HEADER = "telnyx-timestamp"
SIGNATURE_TOLERANCE_S = 300  # an older signed request is a replay
_ENCODINGS = {"PCMU": MULAW, "PCMA": ALAW}


def load_public_key(text: str) -> Ed25519PublicKey:
    """The public key as the Telnyx portal shows it: base64 of the 32 raw bytes. ValueError if not."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("telnyx_public_key must be the base64 of a 32-byte Ed25519 public key") from exc


def signature_problem(
    key: Ed25519PublicKey, timestamp: str, signature: str, body: bytes, now: float
) -> str | None:
    """Why a webhook request is not signed by Telnyx now (None: it is)."""
    if not timestamp or not signature:
        return f"missing {SIGNATURE_HEADER} or {TIMESTAMP_HEADER}"
    try:
        sent_at = int(timestamp)
        raw = base64.b64decode(signature, validate=True)
    except (ValueError, binascii.Error):
        return "malformed Telnyx signature"
    if abs(now - sent_at) > SIGNATURE_TOLERANCE_S:
        return "Telnyx signature timestamp out of tolerance"
    try:
        key.verify(raw, timestamp.encode() + b"|" + body)
    except InvalidSignature:
        return "invalid Telnyx signature"
    return None


class Telnyx:
    """Telnyx as the service sees it: webhook checks and the stream's message shapes."""

    name = "telnyx"
    stream_attributes: Mapping[str, str] = {"bidirectionalMode": "rtp", "bidirectionalCodec": "PCMU"}

    def __init__(self, public_key: str = "") -> None:
        self.key = load_public_key(public_key) if public_key else None

    def webhook_problem(
        self, url: str, headers: Mapping[str, str], body: bytes, params: Sequence[tuple[str, str]], now: float
    ) -> str | None:
        """Why this webhook request is not Telnyx's (None: it is, or no public key is configured)."""
        if self.key is None:
            return None
        return signature_problem(
            self.key, headers.get(TIMESTAMP_HEADER, ""), headers.get(SIGNATURE_HEADER, ""), body, now
        )

    def connect_markup(self, stream_url: str, parameters: Mapping[str, str], action_url: str) -> str:
        return stream_markup(stream_url, parameters, self.stream_attributes, redirect=action_url)

    def parse_start(self, message: Mapping[str, Any]) -> StreamStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise StreamError("bad_start", "the start message has no start object")
        media_format = start.get("media_format") or {}
        if not isinstance(media_format, dict):
            raise StreamError("bad_start", "media_format must be an object")
        encoding = _ENCODINGS.get(_text(media_format.get("encoding", "PCMU")))
        if encoding is None or media_format.get("sample_rate", 8000) not in (8000, "8000"):
            raise StreamError("bad_start", "Telnyx streams must be PCMU or PCMA at 8 kHz")
        parameters = string_map(start.get("custom_parameters"), "custom_parameters")
        stream_id = message.get("stream_id") or start.get("stream_id")
        if not isinstance(stream_id, str) or not stream_id:
            raise StreamError("bad_start", "the start message has no stream_id")
        return StreamStart(
            call_id=required_str(start, "call_control_id"),
            stream_id=stream_id,
            parameters=parameters,
            caller=_text(start.get("from")) or parameters.get("caller", ""),
            called=_text(start.get("to")) or parameters.get("called", ""),
            encoding=encoding,
        )

    def media(self, stream_id: str, payload: str) -> dict[str, Any]:
        return {"event": "media", "media": {"payload": payload}}

    def mark(self, stream_id: str, name: str) -> dict[str, Any]:
        return {"event": "mark", "mark": {"name": name}}

    def clear(self, stream_id: str) -> dict[str, Any]:
        return {"event": "clear"}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
