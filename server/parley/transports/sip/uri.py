"""SIP value types: SIP/SIPS/tel URIs, name-addr header values and Via (RFC 3261 sections 19.1, 20, 25).

Values are kept as written (no percent-decoding, no case folding of hosts) so that `str(X.parse(s))` gives
back an equivalent text; parameter names are lowercased because RFC 3261 19.1.4 and 7.3.1 compare them
case-insensitively.
"""

from __future__ import annotations

import ipaddress
import re
import string
from dataclasses import dataclass, field

TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "-.!%*_+`'~")
_UNRESERVED = string.ascii_letters + string.digits + "-_.!~*'()%"
# RFC 3261 25.1: the characters each part of a SIP-URI may carry unescaped ("%" stands for escaped).
_USER_CHARS = frozenset(_UNRESERVED + "&=+$,;?/")
_PASSWORD_CHARS = frozenset(_UNRESERVED + "&=+$,")
_PARAM_CHARS = frozenset(_UNRESERVED + "[]/:&+$")
_HEADER_CHARS = frozenset(_UNRESERVED + "[]/?:+$")
_TEL_CHARS = frozenset(string.ascii_letters + string.digits + "+-.()*#")
# Header parameter values (gen-value: token / host / quoted-string) that need no quotes on output.
_BARE_VALUE_CHARS = TOKEN_CHARS | frozenset(":[]")
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")
_PORT = re.compile(r"[0-9]{1,5}")
_SENT_PROTOCOL = re.compile(r"\s*([^\s/]+)\s*/\s*([^\s/]+)\s*/\s*([^\s/;]+)\s+(.*)", re.DOTALL)


class SipError(ValueError):
    """Malformed SIP input. `status` is the response to answer with; `request`, when the message got far
    enough to be answered (RFC 3261 8.2 and 18.3 ask for a 400 then), is the `SipRequest` parsed (typed
    `object` here: the value types come before the messages that use them, and the endpoint that answers
    it checks its type)."""

    status: int
    request: object

    def __init__(self, message: str, status: int = 400, request: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.request = request


def show(text: str, limit: int = 40) -> str:
    """Input quoted for an error message: repr() escapes CR/LF, so the message is safe as a reason phrase."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def is_token(text: str) -> bool:
    return bool(text) and all(c in TOKEN_CHARS for c in text)


def split_outside(text: str, sep: str, *, angle_brackets: bool = True) -> list[str]:
    """Splits on `sep` where it is not inside a quoted string or <...> (RFC 3261 7.3.1, 20.10)."""
    parts: list[str] = []
    start, i, angle, n = 0, 0, False, len(text)
    while i < n:
        c = text[i]
        if c == '"' and not angle:
            i = end_of_quoted(text, i)
            continue
        if c == "<" and angle_brackets:
            angle = True
        elif c == ">":
            angle = False
        elif c == sep and not angle:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if angle:
        raise SipError(f"unclosed '<' in {show(text)}")
    parts.append(text[start:])
    return parts


def end_of_quoted(text: str, start: int) -> int:
    """Index just past the quoted-string that opens at `start` (RFC 3261 25.1: quoted-pair is \\ + char)."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    raise SipError(f"unterminated quoted string in {show(text)}")


def unquote(text: str) -> str:
    out: list[str] = []
    i = 1
    while i < len(text) - 1:
        if text[i] == "\\" and i + 1 < len(text) - 1:
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out)


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_params(text: str) -> dict[str, str]:
    """`;name[=value]` header parameters (RFC 3261 25.1 generic-param); values may be quoted strings."""
    params: dict[str, str] = {}
    text = text.strip()
    if not text:
        return params
    if not text.startswith(";"):
        raise SipError(f"expected ';' before parameters in {show(text)}")
    for item in split_outside(text[1:], ";"):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not is_token(name):
            raise SipError(f"bad parameter name in {show(text)}")
        if eq and not value:
            raise SipError(f"parameter {show(name)} has '=' but no value")
        if value.startswith('"'):
            if end_of_quoted(value, 0) != len(value):
                raise SipError(f"junk after quoted value of parameter {show(name)}")
            value = unquote(value)
        elif value and not all(c in _BARE_VALUE_CHARS for c in value):
            raise SipError(f"bad value for parameter {show(name)}")
        params[name.lower()] = value
    return params


def format_params(params: dict[str, str]) -> str:
    out = []
    for name, value in params.items():
        if not value:
            out.append(f";{name}")
        elif all(c in _BARE_VALUE_CHARS for c in value):
            out.append(f";{name}={value}")
        else:
            out.append(f";{name}={quote(value)}")
    return "".join(out)


def parse_port(text: str) -> int:
    if not _PORT.fullmatch(text) or int(text) > 65535:
        raise SipError(f"bad port {show(text)}")
    return int(text)


def parse_hostport(text: str) -> tuple[str, int | None]:
    """`host [":" port]` where host is a name, IPv4 address or [IPv6] reference (RFC 3261 25.1)."""
    port: int | None = None
    if text.startswith("["):
        host, bracket, rest = text.partition("]")
        host += "]"
        if not bracket:
            raise SipError(f"unclosed IPv6 reference {show(text)}")
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise SipError(f"bad IPv6 reference {show(text)}") from None
        if rest:
            if not rest.startswith(":"):
                raise SipError(f"junk after IPv6 reference in {show(text)}")
            port = parse_port(rest[1:])
        return host, port
    host, colon, port_text = text.partition(":")
    if not _HOSTNAME.fullmatch(host):
        raise SipError(f"bad host {show(text)}")
    if colon:
        port = parse_port(port_text)
    return host, port


def bare_host(host: str) -> str:
    """The host as a socket wants it: an IPv6 reference without its brackets."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _checked(text: str, allowed: frozenset[str], what: str) -> str:
    if not all(c in allowed for c in text):
        raise SipError(f"bad character in URI {what} {show(text)}")
    return text


@dataclass
class SipUri:
    """A sip:, sips: or tel: URI (RFC 3261 19.1, RFC 3966). For tel: the number is in `user`, `host` is ""."""

    host: str
    user: str | None = None
    port: int | None = None
    scheme: str = "sip"
    password: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> SipUri:
        scheme, colon, rest = text.strip().partition(":")
        scheme = scheme.lower()
        if not colon or scheme not in ("sip", "sips", "tel"):
            raise SipError(f"not a sip, sips or tel URI: {show(text)}")
        if scheme == "tel":
            number, _, param_text = rest.partition(";")
            if not number or "?" in rest:
                raise SipError(f"bad tel URI {show(text)}")
            return cls(
                "", _checked(number, _TEL_CHARS, "number"), scheme=scheme, params=_uri_params(param_text)
            )
        user: str | None = None
        password: str | None = None
        if "@" in rest:
            # RFC 3261 25.1: "@" cannot appear unescaped after the userinfo, while "?" can appear in it.
            userinfo, _, rest = rest.partition("@")
            user, has_password, pw = userinfo.partition(":")
            if not user:
                raise SipError(f"empty user part in {show(text)}")
            _checked(user, _USER_CHARS, "user")
            password = _checked(pw, _PASSWORD_CHARS, "password") if has_password else None
        rest, question, header_text = rest.partition("?")
        headers: dict[str, str] = {}
        if question:
            for item in header_text.split("&"):
                name, _, value = item.partition("=")
                if not name:
                    raise SipError(f"empty URI header name in {show(text)}")
                headers[_checked(name, _HEADER_CHARS, "header")] = _checked(value, _HEADER_CHARS, "header")
        hostport, _, param_text = rest.partition(";")
        host, port = parse_hostport(hostport)
        return cls(host, user, port, scheme, password, _uri_params(param_text), headers)

    def __str__(self) -> str:
        params = "".join(f";{k}={v}" if v else f";{k}" for k, v in self.params.items())
        if self.scheme == "tel":
            return f"tel:{self.user}{params}"
        userinfo = ""
        if self.user is not None:
            userinfo = self.user + (f":{self.password}" if self.password is not None else "") + "@"
        port = f":{self.port}" if self.port is not None else ""
        headers = "&".join(f"{k}={v}" for k, v in self.headers.items())
        return f"{self.scheme}:{userinfo}{self.host}{port}{params}" + (f"?{headers}" if headers else "")


def uri_transport(uri: SipUri) -> str:
    """The transport a request to `uri` takes: TLS for a SIPS URI (RFC 3261 26.2.2), else its
    `transport` parameter (UDP when none); SipError for a SIPS URI that names a transport TLS is not."""
    named = uri.params.get("transport", "").upper()
    if uri.scheme == "sips":
        if named not in ("", "TLS", "TCP"):
            raise SipError(f"a sips: URI cannot be reached over {show(named)}")
        return "TLS"
    return named or "UDP"


def default_port(transport: str) -> int:
    """RFC 3261 19.1.2: 5061 for SIP over TLS, 5060 otherwise."""
    return 5061 if transport.upper() == "TLS" else 5060


def _uri_params(text: str) -> dict[str, str]:
    params: dict[str, str] = {}
    if not text:
        return params
    for item in text.split(";"):
        name, _, value = item.partition("=")
        if not name:
            raise SipError(f"empty URI parameter name in {show(text)}")
        params[_checked(name, _PARAM_CHARS, "parameter").lower()] = _checked(value, _PARAM_CHARS, "parameter")
    return params


@dataclass
class NameAddr:
    """A From/To/Contact/Route style value: `"Display" <uri>;params` or a bare addr-spec (RFC 3261 20.10)."""

    uri: SipUri
    display_name: str | None = None
    params: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str | None:
        return self.params.get("tag")

    @classmethod
    def parse(cls, text: str) -> NameAddr:
        text = text.strip()
        display: str | None = None
        lt, semi = text.find("<"), text.find(";")
        if text.startswith('"'):
            end = end_of_quoted(text, 0)
            display = unquote(text[:end])
            text = text[end:].lstrip()
            if not text.startswith("<"):
                raise SipError(f"expected '<' after the display name in {show(text)}")
            lt = 0
        elif lt == -1 or (semi != -1 and semi < lt):
            # RFC 3261 20.10: without angle brackets, parameters after the URI belong to the header.
            uri_text, _, param_text = text.partition(";")
            return cls(SipUri.parse(uri_text), None, parse_params(";" + param_text if param_text else ""))
        else:
            display = " ".join(text[:lt].split())
            if '"' in display or ">" in display:
                raise SipError(f"bad display name in {show(text)}")
        gt = text.find(">", lt)
        if gt == -1:
            raise SipError(f"unclosed '<' in {show(text)}")
        return cls(SipUri.parse(text[lt + 1 : gt]), display or None, parse_params(text[gt + 1 :]))

    def __str__(self) -> str:
        display = f"{quote(self.display_name)} " if self.display_name else ""
        return f"{display}<{self.uri}>{format_params(self.params)}"


@dataclass
class Via:
    """One Via value (RFC 3261 20.42): `SIP/2.0/UDP host:port;branch=...;received=...;rport`."""

    transport: str
    host: str
    port: int | None = None
    params: dict[str, str] = field(default_factory=dict)

    @property
    def protocol(self) -> str:
        return f"SIP/2.0/{self.transport}"

    @property
    def branch(self) -> str | None:
        return self.params.get("branch")

    @property
    def received(self) -> str | None:
        return self.params.get("received")

    @property
    def maddr(self) -> str | None:
        return self.params.get("maddr")

    @property
    def rport(self) -> int | None:
        """The rport value, when it has one (a bare `rport` asks the server to fill it in, RFC 3581)."""
        value = self.params.get("rport")
        return int(value) if value else None

    @property
    def ttl(self) -> int | None:
        value = self.params.get("ttl")
        return int(value) if value else None

    @classmethod
    def parse(cls, text: str) -> Via:
        m = _SENT_PROTOCOL.fullmatch(text)
        if not m or m.group(1).upper() != "SIP" or m.group(2) != "2.0" or not is_token(m.group(3)):
            raise SipError(f"bad Via {show(text)}")
        sent_by, semi, param_text = m.group(4).partition(";")
        host, port = parse_hostport(re.sub(r"\s*:\s*", ":", sent_by.strip()))
        params = parse_params(semi + param_text)
        rport, ttl = params.get("rport", ""), params.get("ttl", "")
        if rport:
            parse_port(rport)
        if ttl and not (ttl.isascii() and ttl.isdigit() and len(ttl) <= 3 and int(ttl) <= 255):
            raise SipError(f"bad Via ttl {show(ttl)}")
        if "branch" in params and not is_token(params["branch"]):
            raise SipError("bad Via branch")
        return cls(m.group(3).upper(), host, port, params)

    def __str__(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.protocol} {self.host}{port}{format_params(self.params)}"
