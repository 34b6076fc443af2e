"""SDES (RFC 4568): the SDP `a=crypto` attribute that carries SRTP master keys in an offer and answer.

A key in SDP is as secret as the signalling that carries it (RFC 4568 8.3), so the user agent takes and
gives keys only over TLS. We speak the two suites every SDES peer has (6.2.1, 6.2.2), one inline key
each, without MKI and without session parameters; a crypto line asking for more is not ours to use,
and an offer usually carries another that is.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

AES_CM_128_HMAC_SHA1_80 = "AES_CM_128_HMAC_SHA1_80"
AES_CM_128_HMAC_SHA1_32 = "AES_CM_128_HMAC_SHA1_32"
SUITES = (AES_CM_128_HMAC_SHA1_80, AES_CM_128_HMAC_SHA1_32)  # what we offer, the stronger tag first
SECURE_TRANSPORTS = frozenset({"TLS"})
MASTER_KEY_BYTES = 16 + 14  # the AES-128 master key and the 112-bit master salt, concatenated (6.1)
_TAG = re.compile(r"[0-9]{1,9}")
_LIFETIME = re.compile(r"(2\^[0-9]{1,2}|[0-9]{1,20})")


class CryptoError(ValueError):
    """An a=crypto line we cannot use: malformed, or asking for what we do not speak."""


@dataclass(frozen=True)
class Crypto:
    """One a=crypto line: `tag suite inline:key||salt`."""

    tag: int
    suite: str
    key: bytes = field(repr=False)  # the master key and salt, never logged

    @classmethod
    def parse(cls, value: str) -> Crypto:
        """The attribute's value (after `crypto:`); CryptoError if it is not one we can use."""
        parts = value.split()
        if len(parts) < 3:
            raise CryptoError("a=crypto needs: tag crypto-suite key-params")
        tag, suite, key_params, session_params = parts[0], parts[1], parts[2], parts[3:]
        if not _TAG.fullmatch(tag):
            raise CryptoError(f"a=crypto tag {tag[:20]!r} is not 1 to 9 digits")
        if suite not in SUITES:
            raise CryptoError(f"crypto suite {suite[:40]!r} is not one of {', '.join(SUITES)}")
        if session_params:
            # 6.3: a line with a session parameter the answerer does not apply cannot be accepted.
            raise CryptoError(f"session parameters ({' '.join(session_params)[:40]}) are not supported")
        return cls(int(tag), suite, _inline_key(key_params))

    def __str__(self) -> str:
        return f"{self.tag} {self.suite} inline:{base64.b64encode(self.key).decode()}"


@dataclass(frozen=True)
class SrtpKeys:
    """The SRTP agreement of a stream: the suite, our master key (we protect with it) and the peer's."""

    suite: str
    local: bytes = field(repr=False)
    remote: bytes = field(repr=False)


def new_master_key() -> bytes:
    return secrets.token_bytes(MASTER_KEY_BYTES)


def key_if_secure(master_key: bytes, transport: str) -> bytes | None:
    """Our master key when the signalling `transport` may carry it, else None: RFC 4568 8.3 lets SDES
    keys travel only where the signalling is encrypted, as TLS is and UDP or TCP are not."""
    return master_key if transport.upper() in SECURE_TRANSPORTS else None


def offered(key: bytes) -> list[Crypto]:
    """Our offer's crypto lines: each suite we speak, with our key."""
    return [Crypto(tag, suite, key) for tag, suite in enumerate(SUITES, start=1)]


def first_usable(values: Iterable[str]) -> Crypto | None:
    """The first crypto line of an offer we can use (the offerer lists its preference first, 7.1.1)."""
    for value in values:
        try:
            return Crypto.parse(value)
        except CryptoError:
            continue
    return None


def _inline_key(key_params: str) -> bytes:
    if ";" in key_params:
        raise CryptoError("several master keys (MKI) are not supported")
    method, _, info = key_params.partition(":")
    if method != "inline":
        raise CryptoError(f"key method {method[:20]!r} is not inline")
    key_salt, *rest = info.split("|")
    if len(rest) > 1 or (rest and not _LIFETIME.fullmatch(rest[0])):
        raise CryptoError("an MKI, or a malformed lifetime, is not supported")
    try:
        key = base64.b64decode(key_salt, validate=True)
    except (binascii.Error, ValueError):
        raise CryptoError("the inline key is not base64") from None
    if len(key) != MASTER_KEY_BYTES:
        raise CryptoError(f"the inline key is {len(key)} bytes, not the suite's {MASTER_KEY_BYTES}")
    return key
