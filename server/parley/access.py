"""Who may call: the service's bearer token, short-lived call tokens, and TURN credentials for the page.

- The bearer token (`PARLEY_TOKEN`) guards signaling and the API. It is compared in constant time, so how
  long a refusal takes says nothing about how much of a guess was right.
- A call token lets a customer's page place one call without ever holding the bearer token: the customer's
  backend mints it (`parley token`, or its own code) and puts it in its page's URL (`/?token=...`); the page
  presents it as the bearer on `POST /offer` (or a WHIP client on `POST /whip`). It is short-lived, opens
  one call, lets its holder hang that call up and fetch TURN credentials, and never opens the API.
  Format: `<payload>.<signature>`, where payload is the base64url (no padding) of the JSON object
  `{"exp": <unix seconds>, "id": "<random hex>"}` (optionally `"agent": "<name>"`: the only agent the
  call may ask for) and signature the base64url of HMAC-SHA256(--call-token-secret, payload).
- TURN credentials follow coturn's REST API (draft-uberti-behave-turn-rest; coturn `use-auth-secret` with
  `static-auth-secret`): username `<expiry unix seconds>:<id>`, password base64(HMAC-SHA1(secret,
  username)). The page fetches them (`GET /api/ice`) right before a call, so no lasting TURN secret ever
  reaches a browser, and a leaked pair stops working at its expiry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from parley.config import Settings

MAX_CALL_TOKEN_TTL_S = 86400.0  # a token valid longer than a day is a password, not a call token
MAX_REMEMBERED = 100_000  # used call-token ids kept (until their expiry) so each opens one call
CALL_TOKEN_CHARS = 1024


class AccessDenied(Exception):
    """The request may not do this: 401 with this message."""


@dataclass(frozen=True)
class CallGrant:
    """What a request that may open a call presented: the bearer token (`token_id` "") or a call token."""

    token_id: str
    agent: str | None = None
    expires_at: float = 0.0

    @property
    def by_call_token(self) -> bool:
        return bool(self.token_id)


BEARER = CallGrant("")


def constant_time_equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def bearer_of(authorization: str) -> str:
    """The credential of an `Authorization: Bearer <credential>` header ('' when there is none)."""
    scheme, _, credential = authorization.strip().partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CallTokens:
    """Mints and checks call tokens with one secret (the same on every instance of a fleet)."""

    def __init__(self, secret: str) -> None:
        self._key = secret.encode()

    def mint(self, ttl_s: float, now: float | None = None, agent: str | None = None) -> str:
        now = time.time() if now is None else now
        if not 0 < ttl_s <= MAX_CALL_TOKEN_TTL_S:
            raise ValueError(f"a call token lives between 0 and {MAX_CALL_TOKEN_TTL_S:g} s")
        claims: dict[str, Any] = {"exp": int(now + ttl_s), "id": secrets.token_hex(8)}
        if agent:
            claims["agent"] = agent
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        return f"{payload}.{self._sign(payload)}"

    def check(self, token: str, now: float, *, allow_expired: bool = False) -> CallGrant:
        """The grant a token carries; AccessDenied when forged, malformed or (unless allowed) expired."""
        payload, dot, signature = token.partition(".")
        if (
            not dot
            or len(token) > CALL_TOKEN_CHARS
            or not constant_time_equal(signature, self._sign(payload))
        ):
            raise AccessDenied("not a valid call token")
        try:
            claims = json.loads(_unb64(payload))
        except (ValueError, binascii.Error, RecursionError) as exc:
            raise AccessDenied("not a valid call token") from exc
        expiry, token_id, agent = (
            (claims.get("exp"), claims.get("id"), claims.get("agent"))
            if isinstance(claims, dict)
            else (0, 0, 0)
        )
        if not isinstance(expiry, int) or not isinstance(token_id, str) or not token_id:
            raise AccessDenied("not a valid call token")
        if agent is not None and not isinstance(agent, str):
            raise AccessDenied("not a valid call token")
        if expiry > now + MAX_CALL_TOKEN_TTL_S:
            raise AccessDenied("this call token lives too long")
        if expiry <= now and not allow_expired:
            raise AccessDenied("this call token has expired")
        return CallGrant(token_id, agent, float(expiry))

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())


def turn_credentials(secret: str, ttl_s: float, now: float, user: str) -> tuple[str, str]:
    """(username, password) for coturn's REST API: valid until now + ttl_s."""
    username = f"{int(now + ttl_s)}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


class Access:
    """The service's access rules, from its settings. Used on the event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.token = settings.token
        self.call_tokens = CallTokens(settings.call_token_secret) if settings.call_token_secret else None
        self._used: OrderedDict[str, float] = OrderedDict()  # call-token id -> its expiry
        self._opened_by: OrderedDict[str, str] = OrderedDict()  # call id -> the call token's id

    @property
    def calls_need_credentials(self) -> bool:
        return bool(self.token or self.call_tokens)

    def check_bearer(self, authorization: str) -> None:
        """For the API: the bearer token when one is set (call tokens never open the API)."""
        if self.token and not constant_time_equal(bearer_of(authorization), self.token):
            raise AccessDenied("missing or wrong bearer token")

    def check_caller(self, authorization: str, now: float, *, claim: bool = True) -> CallGrant:
        """For call set-up (and TURN credentials, `claim=False`): the bearer token or a valid call token
        that opened no call yet. A claimed token stays spent unless `unclaim` gives it back."""
        credential = bearer_of(authorization)
        if not self.calls_need_credentials or (self.token and constant_time_equal(credential, self.token)):
            return BEARER
        if self.call_tokens is None or not credential:
            raise AccessDenied("missing or wrong bearer token")
        grant = self.call_tokens.check(credential, now)
        self._forget_expired(now)
        if grant.token_id in self._used:
            raise AccessDenied("this call token has opened a call already")
        if claim:
            self._used[grant.token_id] = grant.expires_at
            while len(self._used) > MAX_REMEMBERED:
                self._used.popitem(last=False)
        return grant

    def unclaim(self, grant: CallGrant) -> None:
        """The call this grant was claimed for did not open (refused, bad offer): the token is good again."""
        if grant.by_call_token:
            self._used.pop(grant.token_id, None)

    def opened(self, grant: CallGrant, call_id: str) -> None:
        if grant.by_call_token:
            self._opened_by[call_id] = grant.token_id
            while len(self._opened_by) > MAX_REMEMBERED:
                self._opened_by.popitem(last=False)

    def check_hang_up(self, authorization: str, call_id: str, now: float) -> None:
        """Hanging up: the bearer token, or the call token that opened this very call (even expired: calls
        outlive their tokens)."""
        try:
            self.check_bearer(authorization)
            return
        except AccessDenied:
            if self.call_tokens is None:
                raise
        grant = self.call_tokens.check(bearer_of(authorization), now, allow_expired=True)
        if self._opened_by.get(call_id) != grant.token_id:
            raise AccessDenied("this call token did not open this call")

    def ice_servers(self, now: float) -> dict[str, Any]:
        """What the page gives its RTCPeerConnection: the STUN servers, and the TURN servers with
        credentials of their own (GET /api/ice)."""
        servers: list[dict[str, Any]] = []
        stun = [url for url in self.settings.ice_servers if url.startswith(("stun:", "stuns:"))]
        if stun:
            servers.append({"urls": stun})
        settings = self.settings
        if settings.turn_urls and settings.turn_secret:
            username, credential = turn_credentials(
                settings.turn_secret, settings.turn_ttl_s, now, secrets.token_hex(6)
            )
            servers.append({"urls": list(settings.turn_urls), "username": username, "credential": credential})
        return {"iceServers": servers, "ttl": int(settings.turn_ttl_s)}

    def _forget_expired(self, now: float) -> None:
        while self._used and next(iter(self._used.values())) <= now:
            self._used.popitem(last=False)
