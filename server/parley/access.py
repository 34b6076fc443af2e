"""Who may call: the service's bearer token, short-lived call tokens, and TURN credentials for the page.

- The bearer token (`PARLEY_TOKEN`) guards signaling and the API. It is compared in constant time, so how
  long a refusal takes says nothing about how much of a guess was right.
- A call token lets a customer's page place one call without ever holding the bearer token: the customer's
  backend mints it (`parley token`, or its own code) and puts it in its page's URL (`/?token=...`); the page
  presents it as the bearer on `POST /offer` (or a WHIP client on `POST /whip`). It is short-lived, opens
  one call, lets its holder hang that call up and fetch TURN credentials, and never opens the API.
  Format: `<payload>.<signature>`, where payload is the base64url (no padding) of the JSON object
  `{"exp": <unix seconds>, "id": "<random hex>"}` (optionally `"agent": "<name>"`: the only agent the
  call may ask for, and `"context": {"key": "value"}`: variables the call gets, which its caller cannot
  change) and signature the base64url of HMAC-SHA256(--call-token-secret, payload). "One call" holds
  across a fleet when the records are in PostgreSQL (records/used_tokens.py), else per process.
- TURN credentials follow coturn's REST API (draft-uberti-behave-turn-rest; coturn `use-auth-secret` with
  `static-auth-secret`): username `<expiry unix seconds>:<id>`, password base64(HMAC-SHA1(secret,
  username)). The page fetches them (`GET /api/ice`) right before a call, so no lasting TURN secret ever
  reaches a browser, and a leaked pair stops working at its expiry.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from parley.access_settings import AccessSettings
from parley.agent.templates import ContextError, checked_context

log = logging.getLogger(__name__)

MAX_CALL_TOKEN_TTL_S = 86400.0  # a token valid longer than a day is a password, not a call token
MAX_REMEMBERED = 100_000  # used call-token ids kept (until their expiry) so each opens one call
CALL_TOKEN_CHARS = 4096  # fits a URL's query and an Authorization header, with a few context values


class AccessDenied(Exception):
    """The request may not do this: 401 with this message."""


@dataclass(frozen=True)
class CallGrant:
    """What a request that may open a call presented: the bearer token (`token_id` "") or a call token."""

    token_id: str
    agent: str | None = None
    expires_at: float = 0.0
    context: tuple[tuple[str, str], ...] = ()  # the token's variables (its signer's, not the caller's)

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

    def mint(
        self,
        ttl_s: float,
        now: float | None = None,
        agent: str | None = None,
        context: Mapping[str, str] | None = None,
    ) -> str:
        now = time.time() if now is None else now
        if not 0 < ttl_s <= MAX_CALL_TOKEN_TTL_S:
            raise ValueError(f"a call token lives between 0 and {MAX_CALL_TOKEN_TTL_S:g} s")
        claims: dict[str, Any] = {"exp": int(now + ttl_s), "id": secrets.token_hex(8)}
        if agent:
            claims["agent"] = agent
        if context:
            claims["context"] = checked_context(dict(context))  # ContextError (a ValueError) if unfit
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        token = f"{payload}.{self._sign(payload)}"
        if len(token) > CALL_TOKEN_CHARS:
            raise ValueError(f"a call token is at most {CALL_TOKEN_CHARS} characters: less context")
        return token

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
        try:
            context = checked_context(claims.get("context"))
        except ContextError as exc:
            raise AccessDenied("not a valid call token") from exc
        if expiry > now + MAX_CALL_TOKEN_TTL_S:
            raise AccessDenied("this call token lives too long")
        if expiry <= now and not allow_expired:
            raise AccessDenied("this call token has expired")
        return CallGrant(token_id, agent, float(expiry), tuple(context.items()))

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())


def turn_credentials(secret: str, ttl_s: float, now: float, user: str) -> tuple[str, str]:
    """(username, password) for coturn's REST API: valid until now + ttl_s."""
    username = f"{int(now + ttl_s)}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


class UsedTokens(Protocol):
    """The call-token ids that opened a call, until their tokens expire. May block (a database)."""

    def claim(self, token_id: str, expires_at: float) -> bool:
        """True for the first claim of `token_id`; raises when the store cannot say."""
        ...

    def unclaim(self, token_id: str) -> None: ...

    def close(self) -> None: ...


class MemoryUsedTokens:
    """This process's memory: a token opens one call per instance."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self._expiries: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()  # claims come through a worker thread (Access.claim)

    def claim(self, token_id: str, expires_at: float) -> bool:
        with self._lock:
            now = time.time()
            while self._expiries and next(iter(self._expiries.values())) <= now:
                self._expiries.popitem(last=False)
            if token_id in self._expiries:
                return False
            self._expiries[token_id] = expires_at
            while len(self._expiries) > self.limit:
                self._expiries.popitem(last=False)
            return True

    def unclaim(self, token_id: str) -> None:
        with self._lock:
            self._expiries.pop(token_id, None)

    def close(self) -> None:
        """Nothing to let go of: the memory goes with the process."""


class TokenStoreUnavailable(Exception):
    """Whether a call token opened a call already cannot be told now (the database is down): 503."""


class Access:
    """The service's access rules, from its settings. Used on the event loop."""

    def __init__(
        self, settings: AccessSettings, *, ice_servers: Sequence[str] = (), used: UsedTokens | None = None
    ) -> None:
        """`ice_servers`: the service's STUN and TURN URLs (--ice-servers), whose STUN ones the page gets;
        `used`: the call tokens spent in the fleet (records/used_tokens.py; None: in this process only)."""
        self.settings = settings
        self._stun = tuple(url for url in ice_servers if url.startswith(("stun:", "stuns:")))
        self.token = settings.token
        self.call_tokens = CallTokens(settings.call_token_secret) if settings.call_token_secret else None
        self.used: UsedTokens = used or MemoryUsedTokens()
        # The call tokens spent through this process (id -> expiry), refused at once without asking a
        # database; `used` is the word of the fleet.
        self._spent_here: OrderedDict[str, float] = OrderedDict()
        self._opened_by: OrderedDict[str, str] = OrderedDict()  # call id -> the call token's id
        self._unclaiming: set[asyncio.Future[None]] = set()

    @property
    def calls_need_credentials(self) -> bool:
        return bool(self.token or self.call_tokens)

    def check_bearer(self, authorization: str) -> None:
        """For the API: the bearer token when one is set (call tokens never open the API). With call
        tokens and no bearer token, the API is closed: whoever may place a call is not its operator."""
        if self.token and not constant_time_equal(bearer_of(authorization), self.token):
            raise AccessDenied("missing or wrong bearer token")
        if not self.token and self.call_tokens is not None:
            raise AccessDenied("the API needs PARLEY_TOKEN: a call-token secret alone opens no API")

    def check_caller(self, authorization: str, now: float) -> CallGrant:
        """For call set-up (and TURN credentials): the bearer token or a valid call token that opened no
        call through this process. A call set-up then spends it for the whole fleet with
        `await claim(grant)`."""
        credential = bearer_of(authorization)
        if not self.calls_need_credentials or (self.token and constant_time_equal(credential, self.token)):
            return BEARER
        if self.call_tokens is None or not credential:
            raise AccessDenied("missing or wrong bearer token")
        grant = self.call_tokens.check(credential, now)
        self._forget_expired(now)
        if grant.token_id in self._spent_here:
            raise AccessDenied("this call token has opened a call already")
        return grant

    async def claim(self, grant: CallGrant) -> None:
        """Spend the grant's call token: AccessDenied when it opened a call already, here or on another
        instance sharing the store; TokenStoreUnavailable when the store cannot say (the call is refused:
        a token that cannot be checked could open any number of calls)."""
        if not grant.by_call_token:
            return
        if grant.token_id in self._spent_here:
            raise AccessDenied("this call token has opened a call already")
        self._spend_here(grant)  # first: a second offer with it on this instance meanwhile is refused
        try:
            first = await asyncio.to_thread(self.used.claim, grant.token_id, grant.expires_at)
        except Exception as exc:
            self._spent_here.pop(grant.token_id, None)
            raise TokenStoreUnavailable("call tokens cannot be checked now; try again") from exc
        if not first:
            raise AccessDenied("this call token has opened a call already")

    def unclaim(self, grant: CallGrant) -> None:
        """The call this grant was claimed for did not open (refused, bad offer): the token is good again.
        Never blocks: the store forgets it on a worker thread."""
        if not grant.by_call_token:
            return
        self._spent_here.pop(grant.token_id, None)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.used.unclaim(grant.token_id)
            return
        forgetting = loop.run_in_executor(None, self.used.unclaim, grant.token_id)
        self._unclaiming.add(forgetting)
        forgetting.add_done_callback(self._unclaimed)

    async def close(self) -> None:
        """Let the store go (a database connection), once what it was still forgetting is done."""
        if self._unclaiming:
            await asyncio.wait(list(self._unclaiming), timeout=5.0)
        await asyncio.to_thread(self.used.close)

    def _unclaimed(self, forgetting: asyncio.Future[None]) -> None:
        self._unclaiming.discard(forgetting)
        if not forgetting.cancelled() and forgetting.exception() is not None:
            # The token stays spent in the fleet: its holder needs a new one, which is the safe side.
            log.warning("call_token_unclaim_failed", extra={"error": repr(forgetting.exception())})

    def _spend_here(self, grant: CallGrant) -> None:
        self._spent_here[grant.token_id] = grant.expires_at
        while len(self._spent_here) > MAX_REMEMBERED:
            self._spent_here.popitem(last=False)

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
        if self._stun:
            servers.append({"urls": list(self._stun)})
        settings = self.settings
        if settings.turn_urls and settings.turn_secret:
            username, credential = turn_credentials(
                settings.turn_secret, settings.turn_ttl_s, now, secrets.token_hex(6)
            )
            servers.append({"urls": list(settings.turn_urls), "username": username, "credential": credential})
        return {"iceServers": servers, "ttl": int(settings.turn_ttl_s)}

    def _forget_expired(self, now: float) -> None:
        while self._spent_here and next(iter(self._spent_here.values())) <= now:
            self._spent_here.popitem(last=False)
