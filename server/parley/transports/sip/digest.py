"""HTTP Digest authentication as SIP uses it (RFC 3261 22.4, RFC 2617, RFC 7616): MD5 and SHA-256, with
qop=auth or without qop (RFC 2069 style), and the -sess variants.

The server side keeps no state: a nonce is its minting time, a salt and an HMAC over both, so a nonce
we did not mint fails the HMAC and an old one is reported stale. Without a per-nonce record, nonce-count
replays are not detected inside the nonce's lifetime (RFC 7616 5.2 makes that check optional).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable

from parley.transports.sip.uri import SipError, end_of_quoted, is_token, quote, show, split_outside, unquote

__all__ = ["DigestAuthenticator", "Verdict", "authorization_for", "parse_auth"]

# RFC 7616 3.3 (the -sess variants hash the nonces into A1 too).
_HASHES = {"MD5": "md5", "MD5-SESS": "md5", "SHA-256": "sha256", "SHA-256-SESS": "sha256"}
_NONCE = re.compile(r"([0-9a-f]{1,16})\.([0-9a-f]{16})\.([0-9a-f]{32})")
_NC = re.compile(r"[0-9a-fA-F]{8}")
_CLOCK_SKEW_S = 60.0


class Verdict(enum.Enum):
    OK = "ok"
    BAD = "bad"  # answer with a fresh challenge
    STALE = "stale"  # right password, expired nonce: challenge again with stale=true (RFC 7616 3.3)


def parse_auth(value: str) -> tuple[str, dict[str, str]]:
    """A challenge or credentials: the scheme and its comma-separated `name=value` parameters, names
    lowercased and quoted strings unquoted (RFC 7616 3.3, 3.4; RFC 3261 25.1 digest-response)."""
    words = value.split(None, 1)
    scheme, rest = (words[0] if words else ""), (words[1] if len(words) > 1 else "")
    if not is_token(scheme):
        raise SipError(f"bad authentication scheme in {show(value)}")
    params: dict[str, str] = {}
    for item in split_outside(rest, ",", angle_brackets=False):
        if not item.strip():
            continue
        name, eq, raw = item.partition("=")
        name, raw = name.strip().lower(), raw.strip()
        if not eq or not is_token(name) or not raw:
            raise SipError(f"bad authentication parameter {show(item.strip())}")
        if raw.startswith('"'):
            if end_of_quoted(raw, 0) != len(raw):
                raise SipError(f"bad quoted value for {show(name)}")
            raw = unquote(raw)
        elif not is_token(raw):
            raise SipError(f"bad value for {show(name)}")
        if name in params:
            raise SipError(f"duplicate authentication parameter {show(name)}")
        params[name] = raw
    return scheme, params


def _hash(algorithm: str, text: str) -> str:
    return hashlib.new(_HASHES[algorithm], text.encode("utf-8", "surrogatepass")).hexdigest()


def _digest(
    algorithm: str,
    user: str,
    realm: str,
    password: str,
    method: str,
    uri: str,
    nonce: str,
    qop: str | None,
    nc: str,
    cnonce: str,
) -> str:
    """The request-digest (RFC 2617 3.2.2.1, RFC 7616 3.4.1). `algorithm` is upper case."""
    ha1 = _hash(algorithm, f"{user}:{realm}:{password}")
    if algorithm.endswith("-SESS"):
        ha1 = _hash(algorithm, f"{ha1}:{nonce}:{cnonce}")
    ha2 = _hash(algorithm, f"{method}:{uri}")
    if qop:
        return _hash(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return _hash(algorithm, f"{ha1}:{nonce}:{ha2}")


def _same(a: str, b: str) -> bool:
    # compare_digest refuses non-ASCII str; bytes keep it constant-time for any input.
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))


class DigestAuthenticator:
    """Challenges requests and checks their credentials for one user (RFC 3261 22.4: the UAS side)."""

    def __init__(
        self,
        realm: str,
        user: str,
        password: str,
        secret: bytes | None = None,
        nonce_ttl_s: float = 300.0,
        *,
        algorithm: str = "MD5",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if algorithm.upper() not in _HASHES:
            raise SipError(f"unsupported digest algorithm {show(algorithm)}")
        self.realm, self.user, self._password = realm, user, password
        self.algorithm = algorithm.upper()
        self.nonce_ttl_s = nonce_ttl_s
        # Without a configured secret, nonces only survive as long as the process: a client then sees
        # one more challenge after a restart.
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._clock = clock

    def challenge(self, stale: bool = False) -> str:
        """The WWW-Authenticate (or Proxy-Authenticate) value for a 401 (407)."""
        nonce = f"{int(self._clock()):x}.{secrets.token_hex(8)}"
        nonce += "." + self._mac(nonce)
        value = f'Digest realm={quote(self.realm)}, nonce="{nonce}", algorithm={self.algorithm}, qop="auth"'
        return value + (", stale=true" if stale else "")

    def _mac(self, payload: str) -> str:
        message = f"{self.realm}:{payload}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def _nonce_age(self, nonce: str) -> float | None:
        """Seconds since we minted `nonce`; None when we did not mint it."""
        m = _NONCE.fullmatch(nonce)
        if not m or not _same(self._mac(f"{m.group(1)}.{m.group(2)}"), m.group(3)):
            return None
        age = self._clock() - int(m.group(1), 16)
        return age if age >= -_CLOCK_SKEW_S else None

    def verify(self, authorization: str, method: str, uri: str) -> Verdict:
        """Checks an Authorization (Proxy-Authorization) value against a request's method and
        request-URI. Malformed input is BAD, never an exception."""
        try:
            scheme, p = parse_auth(authorization)
        except SipError:
            return Verdict.BAD
        if scheme.lower() != "digest" or any(
            k not in p for k in ("username", "realm", "nonce", "uri", "response")
        ):
            return Verdict.BAD
        algorithm = p.get("algorithm", "MD5").upper()
        if algorithm != self.algorithm or not _same(p["username"], self.user) or p["realm"] != self.realm:
            return Verdict.BAD
        # RFC 2617 3.2.2.5: the digest must be for this very request-URI, not one replayed from another.
        if p["uri"] != uri:
            return Verdict.BAD
        qop, nc, cnonce = p.get("qop"), p.get("nc", ""), p.get("cnonce", "")
        if qop is not None and (qop.lower() != "auth" or not _NC.fullmatch(nc) or not cnonce):
            return Verdict.BAD
        if qop is None and algorithm.endswith("-SESS"):
            return Verdict.BAD
        age = self._nonce_age(p["nonce"])
        if age is None:
            return Verdict.BAD
        expected = _digest(
            algorithm, self.user, self.realm, self._password, method, uri, p["nonce"], qop, nc, cnonce
        )
        if not _same(expected, p["response"].lower()):
            return Verdict.BAD
        # RFC 7616 3.3: stale only when the digest itself was right, so a client retries without asking
        # its user for the password again.
        return Verdict.STALE if age > self.nonce_ttl_s else Verdict.OK


def authorization_for(
    challenge_value: str,
    method: str,
    uri: str,
    user: str,
    password: str,
    *,
    nc: int = 1,
    cnonce: str | None = None,
) -> str:
    """The Authorization (Proxy-Authorization) value answering a WWW-Authenticate (Proxy-Authenticate)
    challenge (RFC 3261 22.2 and 22.3). Raises SipError for what it cannot answer."""
    scheme, p = parse_auth(challenge_value)
    if scheme.lower() != "digest":
        raise SipError(f"unsupported authentication scheme {show(scheme)}")
    if "realm" not in p or "nonce" not in p:
        raise SipError("digest challenge without realm or nonce")
    algorithm = p.get("algorithm", "MD5")
    if algorithm.upper() not in _HASHES:
        raise SipError(f"unsupported digest algorithm {show(algorithm)}")
    qop: str | None = None
    if "qop" in p:
        if "auth" not in {option.strip().lower() for option in p["qop"].split(",")}:
            raise SipError(f"unsupported qop {show(p['qop'])}: only auth is supported")
        qop = "auth"
    elif algorithm.upper().endswith("-SESS"):
        raise SipError(f"{algorithm} without qop")
    if not 0 < nc < 2**32:
        raise SipError(f"nonce count out of range: {nc}")
    nc_text, cnonce = f"{nc:08x}", cnonce or secrets.token_hex(8)
    response = _digest(
        algorithm.upper(), user, p["realm"], password, method, uri, p["nonce"], qop, nc_text, cnonce
    )
    parts = [
        f"username={quote(user)}",
        f"realm={quote(p['realm'])}",
        f"nonce={quote(p['nonce'])}",
        f"uri={quote(uri)}",
        f'response="{response}"',
        f"algorithm={algorithm}",
    ]
    if qop:
        parts += [f"cnonce={quote(cnonce)}", f"qop={qop}", f"nc={nc_text}"]
    if "opaque" in p:
        parts.append(f"opaque={quote(p['opaque'])}")
    return "Digest " + ", ".join(parts)
