"""What every HTTP route shares: the application's keys, failures as JSON `{"error": ...}`, and who may
do what (the API's bearer token, a caller's call token, the set-up rate per source)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from parley import metrics
from parley.access import Access, AccessDenied, CallGrant
from parley.config import Settings
from parley.ratelimit import forwarded_source
from parley.registry import CallRegistry
from parley.runtime import CallRefused, Runtime
from parley.transports.sip.useragent import SipUserAgent

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", Runtime)
REGISTRY = web.AppKey("registry", CallRegistry)
SIP = web.AppKey("sip", SipUserAgent)
ACCESS = web.AppKey("access", Access)
TRUSTED_PROXIES = web.AppKey("trusted_proxies", list)
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


def may_call(request: web.Request, *, claim: bool = False) -> CallGrant:
    """Call set-up (and TURN credentials): the bearer token or a call token (AccessDenied: 401)."""
    return request.app[ACCESS].check_caller(
        request.headers.get("Authorization", ""), time.time(), claim=claim
    )


def count_setup(request: web.Request) -> None:
    """Count a call set-up against its source's rate, before anything else is spent on it."""
    source = forwarded_source(request.remote or "", request.headers, request.app[TRUSTED_PROXIES])
    try:
        request.app[RUNTIME].check_source("webrtc", source)
    except CallRefused as exc:
        raise ApiError(429, exc.message, {"Retry-After": str(exc.retry_after_s)}) from exc


def refusal(exc: CallRefused) -> ApiError:
    return ApiError(503, exc.message, {"Retry-After": str(exc.retry_after_s)})


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
