"""What every HTTP route shares: the application's keys, failures as JSON `{"error": ...}`, and who may
do what (the API's bearer token, a caller's call token, the set-up rate per source, the Host and Origin
a browser's request may carry)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import hdrs, web

from parley import metrics
from parley.access import Access, AccessDenied, CallGrant, bearer_of, constant_time_equal
from parley.config import Settings
from parley.exposure import ANY, host_name, is_loopback, served_hosts
from parley.ratelimit import Proxies, Source
from parley.registry import CallRegistry
from parley.runtime import CallRefused, Runtime
from parley.transports.sip.useragent import SipUserAgent

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", Runtime)
REGISTRY = web.AppKey("registry", CallRegistry)
SIP = web.AppKey("sip", SipUserAgent)
ACCESS = web.AppKey("access", Access)
PROXIES = web.AppKey("proxies", Proxies)
UNAUTHORISED = {"WWW-Authenticate": 'Bearer realm="parley"'}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class ApiError(Exception):
    """A refusal the caller should understand: it leaves as `{"error": message}` with this status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as JSON `{"error": ...}` with its status; nothing escapes as a bare 500."""
    try:
        response = await handler(request)
    except ApiError as exc:
        response = json_error(exc.status, exc.message, exc.headers)
    except AccessDenied as exc:
        response = json_error(401, str(exc), UNAUTHORISED)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = json_error(exc.status, exc.reason)
    except Exception:
        log.exception("request_failed", extra={"path": request.path})
        response = json_error(500, "internal error")
    if response.status >= 400:
        reason = metrics.HTTP_ERROR_REASONS.get(response.status, "other")
        metrics.HTTP_ERRORS_TOTAL.labels(reason=reason).inc()
    return response


def authorise(request: web.Request) -> None:
    """The API: the bearer token when one is set (AccessDenied: 401)."""
    request.app[ACCESS].check_bearer(request.headers.get("Authorization", ""))


def authorise_metrics(request: web.Request) -> None:
    """/metrics: the metrics token, so that a scraper need not hold the API's, or the bearer token."""
    access, metrics_token = request.app[ACCESS], request.app[SETTINGS].metrics_token
    if metrics_token:
        if constant_time_equal(bearer_of(request.headers.get("Authorization", "")), metrics_token):
            return
        if not access.token:
            raise AccessDenied("missing or wrong metrics token")
    access.check_bearer(request.headers.get("Authorization", ""))


def require_json(request: web.Request) -> None:
    """A state-changing API route takes application/json only: a page on another site can post a form
    or text/plain without asking the service first (no CORS preflight), never application/json."""
    if request.content_type != "application/json":
        raise ApiError(415, f"{request.path} takes application/json")


def may_call(request: web.Request) -> CallGrant:
    """Call set-up (and TURN credentials): the bearer token or a call token (AccessDenied: 401)."""
    return request.app[ACCESS].check_caller(request.headers.get("Authorization", ""), time.time())


def request_source(request: web.Request) -> Source:
    """Who sent this request, as the per-source limits count it (behind --trusted-proxies, the caller)."""
    return request.app[PROXIES].source(request.remote or "", request.headers)


def count_setup(request: web.Request) -> None:
    """Count a call set-up against its source's rate, before anything else is spent on it."""
    source = request_source(request)
    try:
        request.app[RUNTIME].check_source("webrtc", source.address, spare=source.spareable)
    except CallRefused as exc:
        raise ApiError(429, exc.message, {"Retry-After": str(exc.retry_after_s)}) from exc


def refusal(exc: CallRefused) -> ApiError:
    """A call that cannot open: 429 when its source holds too many calls, else 503 (for everyone)."""
    status = 429 if exc.reason == "source_limit" else 503
    return ApiError(status, exc.message, {"Retry-After": str(exc.retry_after_s)})


@dataclass(frozen=True)
class SameSite:
    """The Host names the service answers and the browser origins whose requests may change something.

    A name that resolves to a loopback service by DNS rebinding reaches it as a "same-origin" request of
    the attacker's page: the Host header gives it away. A page on another site may post to the service
    (a form, a no-cors fetch) without asking first: its Origin header gives it away. Requests without an
    Origin (not from a browser's page: a carrier, a script) pass that check."""

    hosts: frozenset[str] | None  # None: any Host
    origins: frozenset[str]  # besides the request's own; "*": any
    public_origin: str  # --public-url's origin ("" if none)

    @classmethod
    def of(cls, settings: Settings) -> SameSite:
        origins = frozenset(origin.rstrip("/").lower() for origin in settings.allowed_origins)
        public = _origin(settings.public_url) if settings.public_url else ""
        return cls(served_hosts(settings), origins, public)

    def host_problem(self, host: str) -> str | None:
        name = host_name(host)
        if not host or self.hosts is None or name in self.hosts or is_loopback(name):
            return None
        return f"this service does not answer to the name {name[:64]!r} (--allowed-hosts)"

    def origin_problem(self, origin: str, host: str, forwarded_host: str | None) -> str | None:
        given = origin.strip().rstrip("/").lower()
        if ANY in self.origins or given in self.origins or (given and given == self.public_origin):
            return None
        own = {_netloc(own_host) for own_host in (host, forwarded_host) if own_host}
        netloc = given.partition("://")[2]
        if netloc and _netloc(netloc) in own:
            return None
        return f"requests from the page at {given[:100]!r} are not allowed here (--allowed-origins)"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _netloc(netloc: str) -> str:
    """host[:port] with a default port (80, 443) left out: how a Host header and an Origin compare."""
    netloc = netloc.strip().lower()
    for default in (":80", ":443"):
        if netloc.endswith(default):
            return netloc.removesuffix(default)
    return netloc


SAME_SITE = web.AppKey("same_site", SameSite)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@web.middleware
async def same_site_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a Host the service does not answer to (421) and, on anything that changes state (every
    method but GET/HEAD/OPTIONS, and WebSocket upgrades, which no CORS rule covers), a browser page
    from another origin (403)."""
    same_site = request.app[SAME_SITE]
    host = request.headers.get(hdrs.HOST, "")
    problem = same_site.host_problem(host)
    if problem is not None:
        raise ApiError(421, problem)
    origin = request.headers.get(hdrs.ORIGIN)
    upgrade = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
    if origin is not None and (request.method not in SAFE_METHODS or upgrade):
        forwarded_host = request.app[PROXIES].forwarded(request.remote or "", request.headers, "Host")
        problem = same_site.origin_problem(origin, host, forwarded_host)
        if problem is not None:
            raise ApiError(403, problem)
    return await handler(request)


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"body too large (limit {request.app[SETTINGS].max_body_bytes} bytes)") from exc


async def hang_up(request: web.Request) -> web.Response:
    call_id = request.match_info["call_id"]
    if not await request.app[REGISTRY].end(call_id, "hangup"):
        raise ApiError(404, f"no active call {call_id}")
    return web.json_response({"call_id": call_id, "state": "ended"})
