"""HTTP Digest authentication as SIP uses it (RFC 3261 22.4, RFC 2617, RFC 7616): MD5 and SHA-256, and
the -sess variants.

The server side requires qop=auth and takes each nonce count once. A nonce is its minting time, a salt
and an HMAC over both and the address it was issued to, so a nonce we did not mint, or minted for another
source, fails the HMAC and an old one is reported stale. A bounded table of the live nonces keeps the
last nonce count accepted for each (RFC 7616 3.3, 5.2): a captured Authorization replayed, from anywhere,
is challenged again. The client side answers a challenge; `ClientCredentials` pins its user and password
to one realm, and the caller decides which peers may challenge it at all (dial_policy.py).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from parley.transports.sip.uri import SipError, end_of_quoted, is_token, quote, show, split_outside, unquote

__all__ = ["ClientCredentials", "DigestAuthenticator", "Verdict", "authorization_for", "parse_auth"]

# RFC 7616 3.3 (the -sess variants hash the nonces into A1 too).
_HASHES = {"MD5": "md5", "MD5-SESS": "md5", "SHA-256": "sha256", "SHA-256-SESS": "sha256"}
_NONCE = re.compile(r"([0-9a-f]{1,16})\.([0-9a-f]{16})\.([0-9a-f]{32})")
_NC = re.compile(r"[0-9a-fA-F]{8}")
_CLOCK_SKEW_S = 60.0
# Live nonces remembered for their nonce counts. Past it the oldest is forgotten: its holder is answered
# stale=true and retries with a fresh one, so a flood of challenges costs memory up to here and no more.
MAX_NONCES = 10_000


class Verdict(enum.Enum):
    OK = "ok"
    BAD = "bad"  # answer with a fresh challenge
    # Right password, but the nonce expired, was forgotten or already took this nonce count: challenge
    # again with stale=true (RFC 7616 3.3), so the client retries without asking its user again.
    STALE = "stale"


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
        max_nonces: int = MAX_NONCES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if algorithm.upper() not in _HASHES:
            raise SipError(f"unsupported digest algorithm {show(algorithm)}")
        self.realm, self.user, self._password = realm, user, password
        self.algorithm = algorithm.upper()
        self.nonce_ttl_s = nonce_ttl_s
        self.max_nonces = max_nonces
        # Without a configured secret, nonces only survive as long as the process: a client then sees
        # one more challenge after a restart.
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._clock = clock
        self._last_nc: OrderedDict[str, int] = OrderedDict()  # live nonce -> last nonce count accepted

    def challenge(self, source: str, *, stale: bool = False) -> str:
        """The WWW-Authenticate (or Proxy-Authenticate) value for a 401 (407) to a request from the
        address `source`: its nonce is good for requests from there only."""
        now = self._clock()
        self._forget_expired(now)
        nonce = f"{int(now):x}.{secrets.token_hex(8)}"
        nonce += "." + self._mac(nonce, source)
        self._last_nc[nonce] = 0
        while len(self._last_nc) > self.max_nonces:
            self._last_nc.popitem(last=False)
        value = f'Digest realm={quote(self.realm)}, nonce="{nonce}", algorithm={self.algorithm}, qop="auth"'
        return value + (", stale=true" if stale else "")

    def _mac(self, payload: str, source: str) -> str:
        message = f"{self.realm}:{payload}:{source}".encode("utf-8", "surrogatepass")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def _forget_expired(self, now: float) -> None:
        # Minted in time order, so the expired ones are at the front.
        while self._last_nc:
            oldest = next(iter(self._last_nc))
            if now - int(oldest.split(".", 1)[0], 16) <= self.nonce_ttl_s:
                return
            del self._last_nc[oldest]

    def _nonce_age(self, nonce: str, source: str) -> float | None:
        """Seconds since we minted `nonce` for `source`; None when we did not."""
        m = _NONCE.fullmatch(nonce)
        if not m or not _same(self._mac(f"{m.group(1)}.{m.group(2)}", source), m.group(3)):
            return None
        age = self._clock() - int(m.group(1), 16)
        return age if age >= -_CLOCK_SKEW_S else None

    def verify(self, authorization: str, method: str, uri: str, source: str) -> Verdict:
        """Checks an Authorization (Proxy-Authorization) value against a request's method, request-URI
        and source address. Malformed input is BAD, never an exception."""
        try:
            scheme, p = parse_auth(authorization)
        except SipError:
            return Verdict.BAD
        if scheme.lower() != "digest" or any(
            k not in p for k in ("username", "realm", "nonce", "uri", "response", "qop", "nc", "cnonce")
        ):
            # Without qop there is no nonce count (RFC 2069): a captured Authorization could be
            # replayed for as long as its nonce lives, so it is never accepted.
            return Verdict.BAD
        algorithm = p.get("algorithm", "MD5").upper()
        if algorithm != self.algorithm or not _same(p["username"], self.user) or p["realm"] != self.realm:
            return Verdict.BAD
        # RFC 2617 3.2.2.5: the digest must be for this very request-URI, not one replayed from another.
        if p["uri"] != uri:
            return Verdict.BAD
        nonce, qop, nc, cnonce = p["nonce"], p["qop"], p["nc"], p["cnonce"]
        if qop.lower() != "auth" or not _NC.fullmatch(nc) or int(nc, 16) == 0 or not cnonce:
            return Verdict.BAD
        age = self._nonce_age(nonce, source)
        if age is None:
            return Verdict.BAD
        expected = _digest(
            algorithm, self.user, self.realm, self._password, method, uri, nonce, qop, nc, cnonce
        )
        if not _same(expected, p["response"].lower()):
            return Verdict.BAD
        # From here the digest is right (RFC 7616 3.3: only then stale), but the nonce may be spent.
        last = self._last_nc.get(nonce)
        if age > self.nonce_ttl_s or last is None:
            self._last_nc.pop(nonce, None)
            return Verdict.STALE
        # RFC 7616 3.4: the nonce count goes up with every request; one seen before is a replay.
        if int(nc, 16) <= last:
            return Verdict.STALE
        self._last_nc[nonce] = int(nc, 16)
        return Verdict.OK


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


@dataclass(frozen=True)
class ClientCredentials:
    """Our user and password at one peer (RFC 3261 22.2), pinned to its realm when `realm` is set: a
    challenge in another realm is not answered, so a peer cannot have them answer for a realm they do
    not belong to."""

    user: str
    password: str = field(repr=False)
    realm: str = ""  # '' = whatever realm the challenge names

    def answer(self, challenges: Iterable[str], method: str, uri: str) -> str:
        """The Authorization (Proxy-Authorization) value for the first of a response's challenges that
        these credentials may answer. Raises SipError saying why when there is none."""
        reasons: list[str] = []
        for value in challenges:
            try:
                realm = parse_auth(value)[1].get("realm", "")
                if self.realm and realm != self.realm:
                    raise SipError(f"the challenge's realm {show(realm)} is not {show(self.realm)}")
                return authorization_for(value, method, uri, self.user, self.password)
            except SipError as exc:
                reasons.append(str(exc))
        raise SipError("; ".join(reasons) or "no challenge in the response")
