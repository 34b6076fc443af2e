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
`telnyx-timestamp` (unix seconds), checked with the account's public key. The signature covers neither
the URL nor its query, so a request someone captured would pass again, on any of our webhook routes,
for as long as its timestamp is in tolerance: each signed payload is taken once (`SeenPayloads`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections import OrderedDict
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
MAX_SEEN = 100_000  # signed payloads remembered within the tolerance (Telnyx's own rate bounds them)
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


class SeenPayloads:
    """Signed payloads already taken, each kept until its timestamp leaves the tolerance (after that the
    timestamp check refuses it anyway). Used on the event loop."""

    def __init__(self, tolerance_s: float = SIGNATURE_TOLERANCE_S, max_seen: int = MAX_SEEN) -> None:
        self.tolerance_s = tolerance_s
        self.max_seen = max_seen
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # digest -> until when it could pass

    def first_time(self, timestamp: str, body: bytes, now: float) -> bool:
        """True the first time this (timestamp, body) is seen; it is remembered from then on."""
        while self._seen and next(iter(self._seen.values())) < now:
            self._seen.popitem(last=False)
        digest = hashlib.sha256(timestamp.encode() + b"|" + body).digest()
        if digest in self._seen:
            return False
        self._seen[digest] = int(timestamp) + self.tolerance_s
        while len(self._seen) > self.max_seen:
            self._seen.popitem(last=False)
        return True


class Telnyx:
    """Telnyx as the service sees it: webhook checks and the stream's message shapes."""

    name = "telnyx"
    stream_attributes: Mapping[str, str] = {"bidirectionalMode": "rtp", "bidirectionalCodec": "PCMU"}

    def __init__(self, public_key: str = "") -> None:
        self.key = load_public_key(public_key) if public_key else None
        self._seen = SeenPayloads()

    @property
    def signs_webhooks(self) -> bool:
        return self.key is not None

    def webhook_problem(
        self, url: str, headers: Mapping[str, str], body: bytes, params: Sequence[tuple[str, str]], now: float
    ) -> str | None:
        """Why this webhook request is not Telnyx's, or is a replay of one (None: it is Telnyx's, first
        seen now, or no public key is configured)."""
        if self.key is None:
            return None
        timestamp = headers.get(TIMESTAMP_HEADER, "")
        problem = signature_problem(self.key, timestamp, headers.get(SIGNATURE_HEADER, ""), body, now)
        if problem is None and not self._seen.first_time(timestamp, body, now):
            return "replayed Telnyx request: this signed payload was taken already"
        return problem

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
