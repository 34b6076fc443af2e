"""SIP messages (RFC 3261 sections 7, 8.2.6, 18, 20): parsing, framing on streams, serialising, and the
Via bookkeeping a UA does around them. Value types (URIs, name-addr, Via) live in `uri`, header fields
in `headers`.

Anything malformed raises SipError and nothing else, so a UA can answer 400 (or drop a datagram) on any
input a peer can send.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeAlias

from parley.transports.sip.headers import Headers, canonical_name
from parley.transports.sip.uri import (
    NameAddr,
    SipError,
    SipUri,
    Via,
    bare_host,
    is_token,
    show,
    split_outside,
)

__all__ = [
    "Headers", "NameAddr", "SipError", "SipMessage", "SipRequest", "SipResponse", "SipUri",
    "Via", "default_reason", "fix_via_received", "ip_literal", "make_response", "new_branch", "new_call_id",
    "new_tag", "parse_message", "response_destination",
]  # fmt: skip

MAX_MESSAGE_BYTES = 65536
MAX_HEADERS = 100
BRANCH_COOKIE = "z9hG4bK"  # RFC 3261 8.1.1.7: marks a branch as unique per transaction

_MANDATORY = ("Via", "From", "To", "Call-ID", "CSeq")  # RFC 3261 8.1.1
HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(r"\r?\n")
LENGTH_LINE = re.compile(rb"^(?:content-length|l)[ \t]*:([^\r\n]*)", re.IGNORECASE | re.MULTILINE)
_BAD_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_DIGITS = re.compile(r"[0-9]{1,9}")
_REQUEST_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S+")

_REASONS = {
    100: "Trying", 180: "Ringing", 181: "Call Is Being Forwarded", 182: "Queued", 183: "Session Progress",
    199: "Early Dialog Terminated", 200: "OK", 202: "Accepted", 204: "No Notification",
    300: "Multiple Choices", 301: "Moved Permanently", 302: "Moved Temporarily", 305: "Use Proxy",
    380: "Alternative Service", 400: "Bad Request", 401: "Unauthorized", 402: "Payment Required",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable",
    407: "Proxy Authentication Required", 408: "Request Timeout", 410: "Gone",
    413: "Request Entity Too Large", 414: "Request-URI Too Long", 415: "Unsupported Media Type",
    416: "Unsupported URI Scheme", 420: "Bad Extension", 421: "Extension Required",
    422: "Session Interval Too Small", 423: "Interval Too Brief", 480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 483: "Too Many Hops",
    484: "Address Incomplete", 485: "Ambiguous", 486: "Busy Here", 487: "Request Terminated",
    488: "Not Acceptable Here", 489: "Bad Event", 491: "Request Pending", 493: "Undecipherable",
    500: "Server Internal Error", 501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Server Time-out", 505: "Version Not Supported", 513: "Message Too Large",
    580: "Precondition Failure", 600: "Busy Everywhere", 603: "Decline", 604: "Does Not Exist Anywhere",
    606: "Not Acceptable",
}  # fmt: skip


def default_reason(status: int) -> str:
    # RFC 3261 8.1.3.2: an unknown code is understood as the x00 of its class.
    return _REASONS.get(status) or _REASONS.get(status // 100 * 100, "Unknown")


class _Message:
    headers: Headers
    body: bytes

    def start_line(self) -> str:
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        """The message on the wire; Content-Length is first set (in `headers` too) from the body."""
        self.headers.set("Content-Length", str(len(self.body)))
        lines = [self.start_line(), *(f"{name}: {value}" for name, value in self.headers)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body

    def required(self, name: str) -> str:
        value = self.headers.get(name)
        if not value:
            raise SipError(f"missing {canonical_name(name)} header")
        return value

    @property
    def call_id(self) -> str:
        return self.required("Call-ID")

    @property
    def cseq(self) -> tuple[int, str]:
        """(number, method) of CSeq (RFC 3261 20.16: a 32-bit unsigned number and the method)."""
        parts = self.required("CSeq").split()
        if len(parts) != 2 or not parts[0].isascii() or not parts[0].isdigit() or len(parts[0]) > 10:
            raise SipError("malformed CSeq")
        if int(parts[0]) >= 2**32 or not is_token(parts[1]):
            raise SipError("malformed CSeq")
        return int(parts[0]), parts[1]

    @property
    def from_addr(self) -> NameAddr:
        return NameAddr.parse(self.required("From"))

    @property
    def to_addr(self) -> NameAddr:
        return NameAddr.parse(self.required("To"))

    @property
    def from_tag(self) -> str | None:
        return self.from_addr.tag

    @property
    def to_tag(self) -> str | None:
        return self.to_addr.tag

    @property
    def vias(self) -> list[Via]:
        return [Via.parse(v) for v in self.headers.get_all("Via")]

    @property
    def top_via(self) -> Via:
        values = self.headers.get_all("Via")
        if not values:
            raise SipError("missing Via header")
        return Via.parse(values[0])

    @property
    def branch(self) -> str | None:
        return self.top_via.branch


@dataclass
class SipRequest(_Message):
    method: str
    uri: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""

    def start_line(self) -> str:
        if not is_token(self.method) or not _REQUEST_URI.fullmatch(self.uri):
            raise SipError(f"bad request line {show(self.method)} {show(self.uri)}")
        return f"{self.method} {self.uri} SIP/2.0"


@dataclass
class SipResponse(_Message):
    status: int
    reason: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""

    def start_line(self) -> str:
        if not 100 <= self.status <= 699 or _BAD_CHARS.search(self.reason):
            raise SipError(f"bad status line {self.status} {show(self.reason)}")
        return f"SIP/2.0 {self.status} {self.reason}"


SipMessage: TypeAlias = SipRequest | SipResponse


def _split_head(head: bytes) -> tuple[str, list[tuple[str, str]], str | None]:
    """The start line, the (name, value) header fields with folded lines joined (RFC 3261 7.3.1), and
    what was wrong with the lines left out, if anything: the rest may still be enough to answer 400."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipError("message head is not UTF-8") from None
    lines = _LINE_END.split(text)
    if any(_BAD_CHARS.search(line) for line in lines):
        raise SipError("control character in message head")
    unfolded: list[str] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            if not unfolded:
                raise SipError("continuation line before any header")
            unfolded[-1] += " " + line.strip()
        else:
            unfolded.append(line)
    if len(unfolded) > MAX_HEADERS:
        raise SipError(f"more than {MAX_HEADERS} headers")
    fields, problem = [], None
    for line in unfolded:
        name, colon, value = line.partition(":")
        try:
            if not colon:
                raise SipError(f"header line without a colon: {show(line)}")
            fields.append((canonical_name(name.rstrip(" \t")), value.strip()))
        except SipError as e:
            problem = problem or str(e)
    return lines[0], fields, problem


def content_length(values: set[str]) -> int | None:
    if not values:
        return None
    if len(values) > 1:
        raise SipError("conflicting Content-Length headers")
    text = values.pop()
    if not _DIGITS.fullmatch(text):
        raise SipError(f"bad Content-Length {show(text)}")
    return int(text)


def parse_message(data: bytes) -> SipMessage:
    """One message from a datagram (or from StreamFramer). RFC 3261 18.3: bytes past Content-Length are
    dropped; without Content-Length the rest of the datagram is the body."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipError("message larger than 64 KiB", 513)
    data = data.lstrip(b"\r\n")  # RFC 3261 7.5: empty lines before the start line are ignored
    end = HEAD_END.search(data)
    if end is None:
        raise SipError("no empty line after the headers")
    start, fields, problem = _split_head(data[: end.start()])
    status = 400
    message: SipMessage
    if start[:4].upper() == "SIP/":
        version, _, rest = start.partition(" ")
        code, _, reason = rest.partition(" ")
        if version.upper() != "SIP/2.0" or not re.fullmatch(r"[1-6][0-9][0-9]", code):
            raise SipError(f"bad status line {show(start)}")
        message = SipResponse(int(code), reason.strip(), Headers(fields))
    else:
        parts = start.split(" ")
        if len(parts) != 3 or not is_token(parts[0]):
            raise SipError(f"bad request line {show(start)}")
        message = SipRequest(parts[0], parts[1], Headers(fields))
        # Answerable when its headers are: 505 for another version (21.5.7), 400 for a bad Request-URI.
        if problem:
            pass
        elif parts[2].upper() != "SIP/2.0":
            problem, status = f"SIP version {show(parts[2])} is not supported", 505
        elif not _REQUEST_URI.fullmatch(parts[1]):
            problem = f"bad Request-URI {show(parts[1])}"
    answerable = None
    if isinstance(message, SipRequest):
        try:
            _ = message.top_via  # without a usable Via a request cannot be answered
            answerable = message
        except SipError:
            pass
    try:
        body = data[end.end() :]
        length = content_length({value for name, value in fields if name == "Content-Length"})
        if length is not None:
            if length > len(body):
                raise SipError("body shorter than Content-Length")
            body = body[:length]
        message.body = body
        if problem:
            raise SipError(problem, status)
        _validate(message)
    except SipError as e:
        raise SipError(str(e), e.status, answerable) from None
    return message


def _validate(message: SipMessage) -> None:
    for name in _MANDATORY:
        if not message.headers.get(name):
            raise SipError(f"missing {name} header")
    _, method = message.cseq
    if isinstance(message, SipRequest) and method != message.method:
        raise SipError(f"CSeq method {method} does not match the request method {message.method}")
    _ = (message.top_via, message.from_addr, message.to_addr)  # each raises SipError when malformed
    max_forwards = message.headers.get("Max-Forwards")
    if max_forwards is not None and not re.fullmatch(r"[0-9]{1,3}", max_forwards):
        raise SipError("bad Max-Forwards")


def make_response(
    request: SipRequest,
    status: int,
    reason: str | None = None,
    *,
    to_tag: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
    content_type: str | None = None,
) -> SipResponse:
    """A response per RFC 3261 8.2.6.2: Via (all, in order), From, To, Call-ID and CSeq copied."""
    response = SipResponse(status, reason or default_reason(status))
    for name, value in request.headers:
        if name == "Via":
            response.headers.add(name, value)
    # Copied when present: a 400 for a request missing some of them is still worth sending (RFC 3261 8.2).
    for name in ("From", "To", "Call-ID", "CSeq"):
        copied = request.headers.get(name)
        if copied is None:
            continue
        if name == "To" and to_tag is not None and _tag_of(copied) is None:
            if not is_token(to_tag):
                raise SipError(f"bad To-tag {show(to_tag)}")
            copied += f";tag={to_tag}"
        response.headers.add(name, copied)
    timestamp = request.headers.get("Timestamp")
    if status == 100 and timestamp:  # RFC 3261 8.2.6.1
        response.headers.add("Timestamp", timestamp)
    for name, value in headers:
        response.headers.add(name, value)
    if content_type is not None:
        response.headers.set("Content-Type", content_type)
    response.body = body
    return response


def _tag_of(value: str) -> str | None:
    try:
        return NameAddr.parse(value).tag
    except SipError:
        return None


def new_branch() -> str:
    return BRANCH_COOKIE + secrets.token_hex(12)


def new_tag() -> str:
    return secrets.token_hex(8)


def new_call_id(host: str) -> str:
    return f"{secrets.token_hex(16)}@{host}" if host else secrets.token_hex(16)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(bare_host(host))
    except ValueError:
        return None
    # A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d.
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip


def fix_via_received(request: SipRequest, source_host: str, source_port: int) -> Via:
    """Marks the top Via with where the request really came from; returns it as updated.

    RFC 3261 18.2.1: `received` when sent-by is a name or another address than the packet's source.
    RFC 3581 4: a valueless `rport` gets the source port, and then `received` is added in any case.
    """
    values = [v.strip() for v in split_outside(request.required("Via"), ",") if v.strip()]
    if not values:
        raise SipError("missing Via header")
    via = Via.parse(values[0])
    source = bare_host(source_host)
    if "rport" in via.params and not via.params["rport"]:
        via.params["rport"] = str(source_port)
        via.params["received"] = source
    elif _ip(via.host) is None or _ip(via.host) != _ip(source):
        via.params["received"] = source
    request.headers.replace_first("Via", ", ".join([str(via), *values[1:]]))
    return via


def response_destination(via: Via, transport: str) -> tuple[str, int] | None:
    """Where a response goes on a new connection when the request's own is gone (RFC 3261 18.2.2): the
    received address and the sent-by port. None when that address is no IP literal.

    Never `maddr` and never a name: resolving a name would block (or be steered by the peer's DNS),
    and either would let a request aim our responses, and Timer G's copies of them, at a third party.
    Over UDP the response goes to the request's source address and port instead (RFC 3581), which the
    user agent knows without a Via.
    """
    host = bare_host(via.received or via.host)
    if _ip(host) is None:
        return None
    port = via.port if via.port is not None else (5061 if transport.upper() in ("TLS", "WSS") else 5060)
    if transport.upper() == "UDP" and via.rport:
        port = via.rport
    return host, port


def ip_literal(host: str) -> str | None:
    """`host` as a socket address when it is an IP literal (brackets and IPv4-mapped form undone)."""
    ip = _ip(host)
    return str(ip) if ip is not None else None
