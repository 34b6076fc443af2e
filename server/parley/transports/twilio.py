"""Twilio: Media Streams messages, TwiML and request signatures.

Twilio's bidirectional Media Streams protocol is the reference for carrier streams (Telnyx speaks a
dialect of it, see telnyx.py). A call reaches us in two steps: Twilio POSTs the call to our voice
webhook, which answers TwiML `<Connect><Stream url="wss://...">` with `<Parameter>`s; Twilio then opens
the WebSocket and sends JSON text messages (field names as Twilio documents them):

- `connected`, then `start` (`start.callSid`, `start.streamSid`, `start.customParameters`,
  `start.mediaFormat`), then `media` (`media.payload`: base64 mu-law, 8 kHz, 20 ms), `dtmf`
  (`dtmf.digit`), `mark` (`mark.name`, echoed when the audio sent before it has played, or at once
  for every pending mark after a `clear`) and finally `stop`;
- we send `media`, `mark` and `clear`, each with the `streamSid` (nothing else: no digit events).

`<Connect action="...">` makes Twilio request that URL when the stream ends, and run the TwiML it
answers: `<Dial>` to transfer the caller, `<Hangup/>` to end the call.

Webhook requests carry `X-Twilio-Signature`: base64 HMAC-SHA1, keyed with the account's auth token, over
the full URL Twilio requested followed by the POST parameters sorted by name, each name then its value.
The stream token our webhook mints (`StreamTokens`) travels as one of the markup's custom parameters.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from xml.etree import ElementTree

CALL_ID_PARAM = "CallSid"  # webhook parameters (TwiML and TeXML alike)
CALLER_PARAM = "From"
CALLED_PARAM = "To"
SIGNATURE_HEADER = "X-Twilio-Signature"
MULAW = "PCMU"
ALAW = "PCMA"
_DEFAULT_PORTS = {"https": 443, "http": 80}
TOKEN_PARAMETER = "parley_token"
STREAM_TOKEN_TTL_S = 120  # carriers open the stream within a second or two of the webhook's answer
MAX_USED_TOKENS = 100_000


class StreamError(ValueError):
    """A stream message we cannot use. `reason` is a bounded metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class StreamStart:
    """What a carrier's `start` message tells about the stream and its call."""

    call_id: str  # the carrier's call id (Twilio CallSid, Telnyx call_control_id)
    stream_id: str
    parameters: dict[str, str]  # the custom parameters our webhook put in the markup
    caller: str
    called: str
    encoding: str  # PCMU or PCMA, 8 kHz mono


def string_map(value: Any, what: str) -> dict[str, str]:
    """A JSON object of strings (custom parameters); a list of {name, value} pairs is accepted too."""
    if value is None:
        return {}
    if isinstance(value, list) and all(isinstance(p, dict) and "name" in p for p in value):
        value = {p["name"]: p.get("value", "") for p in value}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise StreamError("bad_start", f"{what} must be an object of strings")
    return {k: v if isinstance(v, str) else str(v) for k, v in value.items()}


def required_str(container: Mapping[str, Any], key: str) -> str:
    value = container.get(key)
    if not isinstance(value, str) or not value:
        raise StreamError("bad_start", f"the start message has no {key}")
    return value


# markup (TwiML; Telnyx's TeXML takes the same verbs)


def stream_markup(
    url: str,
    parameters: Mapping[str, str],
    attributes: Mapping[str, str],
    *,
    action: str = "",
    redirect: str = "",
) -> str:
    """`<Response><Connect><Stream url=...>` with a `<Parameter>` per custom parameter; `action` goes on
    the `<Connect>`, `redirect` becomes a `<Redirect>` after it (for markup whose `<Connect>` has none)."""
    response = ElementTree.Element("Response")
    connect = ElementTree.SubElement(
        response, "Connect", {"action": action, "method": "POST"} if action else {}
    )
    stream = ElementTree.SubElement(connect, "Stream", {"url": url, **attributes})
    for name, value in parameters.items():
        ElementTree.SubElement(stream, "Parameter", {"name": name, "value": value})
    if redirect:
        ElementTree.SubElement(response, "Redirect", {"method": "POST"}).text = redirect
    return _document(response)


def dial_markup(destination: str) -> str:
    """Transfer the caller: `<Dial><Sip>` a SIP URI, `<Dial><Number>` a +E.164 number."""
    response = ElementTree.Element("Response")
    dial = ElementTree.SubElement(response, "Dial")
    noun = "Sip" if destination.lower().startswith(("sip:", "sips:")) else "Number"
    ElementTree.SubElement(dial, noun).text = destination
    return _document(response)


def hangup_markup() -> str:
    response = ElementTree.Element("Response")
    ElementTree.SubElement(response, "Hangup")
    return _document(response)


def reject_markup() -> str:
    """A busy signal: nothing is answered (or billed) and the caller knows to try again."""
    response = ElementTree.Element("Response")
    ElementTree.SubElement(response, "Reject", {"reason": "busy"})
    return _document(response)


def _document(root: ElementTree.Element) -> str:
    return '<?xml version="1.0" encoding="UTF-8"?>' + ElementTree.tostring(root, encoding="unicode")


# stream tokens (a custom parameter of the markup)


class StreamTokens:
    """Per-call stream tokens. The webhook mints one over the carrier's call id and the stream's custom
    parameters (so neither can be swapped); the stream must present it at `start`, once, before expiry,
    and its `start` must name the call it was minted for."""

    def __init__(self, secret: bytes, ttl_s: float = STREAM_TOKEN_TTL_S) -> None:
        self._secret = secret
        self.ttl_s = ttl_s
        self._used: OrderedDict[str, int] = OrderedDict()

    def mint(self, carrier: str, call_id: str, parameters: Mapping[str, str], now: float) -> str:
        expires = int(now + self.ttl_s)
        return f"{expires}.{self._digest(carrier, call_id, expires, parameters)}"

    def problem(self, carrier: str, start: StreamStart, now: float) -> str | None:
        """Why the stream's token is not good for its call (None: it is, and is now used up)."""
        token = start.parameters.get(TOKEN_PARAMETER, "")
        expires_text, _, digest = token.partition(".")
        if not (expires_text.isascii() and expires_text.isdigit() and digest):
            return "missing or malformed stream token"
        expires = int(expires_text)
        others = {k: v for k, v in start.parameters.items() if k != TOKEN_PARAMETER}
        expected = self._digest(carrier, start.call_id, expires, others)
        if not hmac.compare_digest(digest.encode(), expected.encode()):  # bytes: any text a peer sends
            return "invalid stream token"
        if expires < now:
            return "expired stream token"
        while self._used and (next(iter(self._used.values())) < now or len(self._used) > MAX_USED_TOKENS):
            self._used.popitem(last=False)
        if token in self._used:
            return "stream token already used"
        self._used[token] = expires
        return None

    def _digest(self, carrier: str, call_id: str, expires: int, parameters: Mapping[str, str]) -> str:
        signed = json.dumps([carrier, call_id, expires, sorted(parameters.items())], separators=(",", ":"))
        digest = hmac.new(self._secret, signed.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


# request signatures


def twilio_signature(auth_token: str, url: str, params: Sequence[tuple[str, str]]) -> str:
    """The X-Twilio-Signature Twilio sends for a POST of `params` to `url`."""
    signed = url + "".join(name + value for name, value in sorted(params))
    digest = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def signed_url_variants(url: str) -> list[str]:
    """The URL as given, and with its default port added or removed: Twilio's own libraries accept
    either, since what Twilio signs depends on how the URL was configured."""
    parts = urlsplit(url)
    default = _DEFAULT_PORTS.get(parts.scheme)
    if default is None or parts.hostname is None:
        return [url]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if parts.port is None:
        other = urlunsplit(parts._replace(netloc=f"{host}:{default}"))
    elif parts.port == default:
        other = urlunsplit(parts._replace(netloc=host))
    else:
        return [url]
    return [url, other]


class Twilio:
    """Twilio as the service sees it: webhook checks and the stream's message shapes."""

    name = "twilio"
    stream_attributes: Mapping[str, str] = {}

    def __init__(self, auth_token: str = "") -> None:
        self.auth_token = auth_token

    @property
    def signs_webhooks(self) -> bool:
        return bool(self.auth_token)

    def webhook_problem(
        self, url: str, headers: Mapping[str, str], body: bytes, params: Sequence[tuple[str, str]], now: float
    ) -> str | None:
        """Why this webhook request is not Twilio's (None: it is, or no auth token is configured)."""
        if not self.auth_token:
            return None
        given = headers.get(SIGNATURE_HEADER, "")
        if not given:
            return f"missing {SIGNATURE_HEADER}"
        for candidate in signed_url_variants(url):
            if hmac.compare_digest(
                twilio_signature(self.auth_token, candidate, params).encode(), given.encode()
            ):
                return None
        return "invalid Twilio signature"

    def connect_markup(self, stream_url: str, parameters: Mapping[str, str], action_url: str) -> str:
        return stream_markup(stream_url, parameters, self.stream_attributes, action=action_url)

    def parse_start(self, message: Mapping[str, Any]) -> StreamStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise StreamError("bad_start", "the start message has no start object")
        media_format = start.get("mediaFormat") or {}
        if (
            not isinstance(media_format, dict)
            or media_format.get("encoding", "audio/x-mulaw") != "audio/x-mulaw"
        ):
            raise StreamError("bad_start", "Twilio streams are audio/x-mulaw")
        if media_format.get("sampleRate", 8000) not in (8000, "8000"):
            raise StreamError("bad_start", "Twilio streams are 8 kHz")
        parameters = string_map(start.get("customParameters"), "customParameters")
        return StreamStart(
            call_id=required_str(start, "callSid"),
            stream_id=required_str(start, "streamSid"),
            parameters=parameters,
            caller=parameters.get("caller", ""),  # Twilio's start carries no numbers: the webhook passes them
            called=parameters.get("called", ""),
            encoding=MULAW,
        )

    def media(self, stream_id: str, payload: str) -> dict[str, Any]:
        return {"event": "media", "streamSid": stream_id, "media": {"payload": payload}}

    def mark(self, stream_id: str, name: str) -> dict[str, Any]:
        return {"event": "mark", "streamSid": stream_id, "mark": {"name": name}}

    def clear(self, stream_id: str) -> dict[str, Any]:
        return {"event": "clear", "streamSid": stream_id}
