"""The aiohttp application: signaling routes, the call API, health, metrics and the browser page."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from parley import metrics
from parley.access import Access, AccessDenied, CallGrant
from parley.agent.templates import ContextError, checked_context
from parley.call import Call
from parley.config import Settings
from parley.engines import Engines
from parley.limits import BadJson, LimitExceeded, SdpLimits, check_offer_size, parse_json
from parley.ratelimit import forwarded_source, networks
from parley.records import BadCursor, DatabaseError
from parley.registry import CallRegistry
from parley.runtime import CallRefused, Runtime, UnknownAgent
from parley.transports.base import HangUp, open_call
from parley.transports.carrier_webhooks import add_carrier_routes
from parley.transports.sip.uac import DialError, dial
from parley.transports.sip.useragent import SipUserAgent
from parley.transports.webrtc import WebRtcPeer, answering
from parley.transports.webrtc_signaling import SignalingError, configure_ice, parse_ice_servers
from parley.transports.webrtc_tracks import WEBRTC_RATE

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", Runtime)
REGISTRY = web.AppKey("registry", CallRegistry)
SIP = web.AppKey("sip", SipUserAgent)
ACCESS = web.AppKey("access", Access)
TRUSTED_PROXIES = web.AppKey("trusted_proxies", list)
UNAUTHORISED = {"WWW-Authenticate": 'Bearer realm="parley"'}
EVENT_STREAM_BACKLOG = 500
EVENT_STREAM_KEEPALIVE_S = 15.0
_ASSET_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".html": "text/html",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def default_web_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "web"


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


def _authorise(request: web.Request) -> None:
    """The API: the bearer token when one is set (AccessDenied: 401)."""
    request.app[ACCESS].check_bearer(request.headers.get("Authorization", ""))


def _may_call(request: web.Request, *, claim: bool = False) -> CallGrant:
    """Call set-up (and TURN credentials): the bearer token or a call token (AccessDenied: 401)."""
    return request.app[ACCESS].check_caller(
        request.headers.get("Authorization", ""), time.time(), claim=claim
    )


def _count_setup(request: web.Request) -> None:
    """Count a call set-up against its source's rate, before anything else is spent on it."""
    source = forwarded_source(request.remote or "", request.headers, request.app[TRUSTED_PROXIES])
    try:
        request.app[RUNTIME].check_source("webrtc", source)
    except CallRefused as exc:
        raise ApiError(429, exc.message, {"Retry-After": str(exc.retry_after_s)}) from exc


def refusal(exc: CallRefused) -> ApiError:
    return ApiError(503, exc.message, {"Retry-After": str(exc.retry_after_s)})


async def _start_webrtc_call(
    request: web.Request, offer_sdp: str, agent_name: object = None, context: object = None
) -> tuple[Call, str]:
    access = request.app[ACCESS]
    grant = _may_call(request, claim=True)
    try:
        call, peer = await _answer_offer(request, grant, offer_sdp, agent_name, context)
    except BaseException:
        access.unclaim(grant)  # no call was opened with it
        raise
    access.opened(grant, call.call_id)
    if peer.connected:  # connected before the greeting could wait for it
        call.greet()
    return call, peer.answer_sdp


async def _answer_offer(
    request: web.Request, grant: CallGrant, offer_sdp: str, agent_name: object, context: object
) -> tuple[Call, WebRtcPeer]:
    runtime = request.app[RUNTIME]
    if agent_name is not None and not isinstance(agent_name, str):
        raise ApiError(400, '"agent" must be a string')
    if grant.agent is not None:
        if agent_name not in (None, grant.agent):
            raise ApiError(403, "this call token is for another agent")
        agent_name = grant.agent
    try:
        check_offer_size(offer_sdp, SdpLimits.of(runtime.settings))
        agent = runtime.agent(agent_name)
        variables = checked_context(context)
    except LimitExceeded as exc:
        raise ApiError(exc.status, str(exc)) from exc
    except UnknownAgent as exc:
        raise ApiError(404, str(exc)) from exc
    except ContextError as exc:
        raise ApiError(400, str(exc)) from exc
    answer = answering(offer_sdp, parse_ice_servers(runtime.settings.ice_servers))

    async def connect(call: Call, hang_up: HangUp) -> WebRtcPeer:
        call.context = variables
        return await answer(call, hang_up)

    try:
        return await open_call(runtime, "webrtc", WEBRTC_RATE, connect, agent=agent, greet=False)
    except CallRefused as exc:
        raise refusal(exc) from exc
    except SignalingError as exc:
        metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="webrtc", reason="bad_offer").inc()
        raise ApiError(400, str(exc)) from exc


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"body too large (limit {request.app[SETTINGS].max_body_bytes} bytes)") from exc


async def offer(request: web.Request) -> web.Response:
    _count_setup(request)
    _may_call(request)
    # A form posted from another site (text/plain, form types) is sent without a CORS preflight;
    # application/json needs one, which this service never grants.
    if request.content_type != "application/json":
        raise ApiError(415, "offers are application/json")
    body = await _read_body(request)
    try:
        data = parse_json(body)
    except BadJson as exc:
        raise ApiError(400, str(exc)) from exc
    if not isinstance(data, dict) or not isinstance(data.get("sdp"), str):
        raise ApiError(400, 'expected {"sdp": "...", "type": "offer"}')
    if data.get("type") != "offer":
        raise ApiError(400, "type must be 'offer'")
    call, answer = await _start_webrtc_call(request, data["sdp"], data.get("agent"), data.get("context"))
    return web.json_response({"sdp": answer, "type": "answer", "call_id": call.call_id})


async def whip_post(request: web.Request) -> web.Response:
    _count_setup(request)
    _may_call(request)
    if request.content_type != "application/sdp":
        raise ApiError(415, "WHIP offers are application/sdp")
    body = await _read_body(request)
    try:
        sdp = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "the SDP must be UTF-8") from exc
    call, answer = await _start_webrtc_call(request, sdp, request.query.get("agent"))
    return web.Response(
        status=201, text=answer, content_type="application/sdp", headers={"Location": f"/whip/{call.call_id}"}
    )


async def end_call(request: web.Request) -> web.Response:
    """Hang up any call, whatever its transport (a SIP call gets its BYE)."""
    _authorise(request)
    return await _hang_up(request)


async def whip_delete(request: web.Request) -> web.Response:
    """Hang up: with the bearer token, or the call token that opened this call (the page's hang-up)."""
    access = request.app[ACCESS]
    access.check_hang_up(request.headers.get("Authorization", ""), request.match_info["call_id"], time.time())
    return await _hang_up(request)


async def ice(request: web.Request) -> web.Response:
    """The page's ICE servers: STUN, and TURN with credentials that expire (coturn's REST API)."""
    _may_call(request)
    servers = request.app[ACCESS].ice_servers(time.time())
    return web.json_response(servers, headers={"Cache-Control": "no-store"})


async def _hang_up(request: web.Request) -> web.Response:
    call_id = request.match_info["call_id"]
    if not await request.app[REGISTRY].end(call_id, "hangup"):
        raise ApiError(404, f"no active call {call_id}")
    return web.json_response({"call_id": call_id, "state": "ended"})


async def list_calls(request: web.Request) -> web.Response:
    """Active calls (a list); with `?state=ended`, a page of stored records: `{"calls", "next"}`, where
    `next` is the `cursor` of the following page (`&limit=` up to 200, default 50)."""
    _authorise(request)
    state = request.query.get("state", "active")
    if state == "active":
        return web.json_response([call.summary() for call in request.app[REGISTRY].active()])
    if state != "ended":
        raise ApiError(400, "state must be active or ended")
    records = request.app[RUNTIME].records
    if records is None:
        raise ApiError(409, "call records are off (--database off)")
    try:
        limit = int(request.query.get("limit", "50"))
    except ValueError as exc:
        raise ApiError(400, "limit must be a number") from exc
    try:
        calls, cursor = await asyncio.to_thread(records.list_ended, limit, request.query.get("cursor", ""))
    except BadCursor as exc:
        raise ApiError(400, str(exc)) from exc
    except DatabaseError as exc:
        raise ApiError(503, f"call records unavailable: {exc}") from exc
    return web.json_response({"calls": calls, "next": cursor})


async def get_call(request: web.Request) -> web.Response:
    """A call in memory (live, or ended lately), else its stored record (any instance of a fleet)."""
    _authorise(request)
    call_id = request.match_info["call_id"]
    call = request.app[REGISTRY].get(call_id)
    if call is not None:
        return web.json_response(call.details())
    records = request.app[RUNTIME].records
    record = None
    if records is not None:
        try:
            record = await asyncio.to_thread(records.get, call_id)
        except DatabaseError as exc:
            raise ApiError(503, f"call records unavailable: {exc}") from exc
    if record is None:
        raise ApiError(404, "no such call")
    return web.json_response(record)


async def drain(request: web.Request) -> web.Response:
    """Take no new call here (readiness 503, SIP 503) and let live ones finish: a pod's preStop hook
    (`parley drain`) calls this, then waits for `calls` to reach 0."""
    _authorise(request)
    runtime = request.app[RUNTIME]
    runtime.drain()
    return web.json_response({"draining": True, "calls": len(runtime.registry.active())})


async def call_events(request: web.Request) -> web.StreamResponse:
    """The call's events as they happen (Server-Sent Events), whatever its transport: the same JSON
    the browser page gets over its data channel. Ends when the call ends."""
    _authorise(request)
    call = request.app[REGISTRY].get(request.match_info["call_id"])
    if call is None:
        raise ApiError(404, "no such call")
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=EVENT_STREAM_BACKLOG)

    def enqueue(payload: dict[str, Any]) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # a reader that cannot keep up loses events
            queue.put_nowait(payload)

    def from_any_thread(payload: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(enqueue, payload)

    unwatch = call.watch(from_any_thread)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        await response.write(f"data: {json.dumps({'type': 'state', 'state': call.state})}\n\n".encode())
        while not call.ended or not queue.empty():
            try:
                payload = await asyncio.wait_for(queue.get(), EVENT_STREAM_KEEPALIVE_S)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            await response.write(f"data: {json.dumps(payload)}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        unwatch()
    return response


async def dial_sip(request: web.Request) -> web.Response:
    """`{"to": "sip:user@host:port"}`: the agent calls out; 202 with the call's id while it rings."""
    _authorise(request)
    ua = request.app.get(SIP)
    if ua is None:
        raise ApiError(409, "SIP is off (--sip off)")
    try:
        data = parse_json(await _read_body(request))
    except BadJson as exc:
        raise ApiError(400, str(exc)) from exc
    if not isinstance(data, dict) or not isinstance(data.get("to"), str):
        raise ApiError(400, 'expected {"to": "sip:user@host:port"}')
    try:
        call = await dial(ua, data["to"])
    except DialError as exc:
        raise ApiError(400, str(exc)) from exc
    except CallRefused as exc:
        raise refusal(exc) from exc
    return web.json_response(
        {"call_id": call.call_id, "state": call.state},
        status=202,
        headers={"Location": f"/api/calls/{call.call_id}"},
    )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    reason = runtime.not_ready_reason()
    if reason is not None:
        headers = {"Retry-After": "5"} if runtime.engines is not None else None
        return web.json_response({"ready": False, "reason": reason}, status=503, headers=headers)
    return web.json_response({"ready": True, "calls": len(runtime.registry.active())})


async def prometheus(request: web.Request) -> web.Response:
    return web.Response(body=metrics.exposition(), headers={"Content-Type": metrics.CONTENT_TYPE})


def _static(web_dir: Path) -> Handler:
    async def serve(request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("name") or "index.html"
        path = (web_dir / name).resolve()
        if path.parent != web_dir.resolve() or not path.is_file():
            raise ApiError(404, "not found")
        headers = {
            "Content-Type": _ASSET_TYPES.get(path.suffix, "application/octet-stream"),
            "Cache-Control": "no-cache",
        }
        return web.FileResponse(path, headers=headers)

    return serve


def create_app(settings: Settings, engines: Engines | None = None) -> web.Application:
    """The service. Without `engines`, the models load in a thread at start-up (readyz says when)."""
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[errors_as_json])
    runtime = Runtime(settings, engines)
    app[SETTINGS] = settings
    app[RUNTIME] = runtime
    app[REGISTRY] = runtime.registry
    app[ACCESS] = Access(settings)
    app[TRUSTED_PROXIES] = networks(settings.trusted_proxies)
    if settings.sip != "off":
        app[SIP] = SipUserAgent(runtime)
    configure_ice(settings.ice_addresses)
    parse_ice_servers(settings.ice_servers)  # a bad URL fails at start, not at the first call

    web_dir = Path(settings.web_dir) if settings.web_dir else default_web_dir()
    static = _static(web_dir)
    app.router.add_get("/", static)
    app.router.add_post("/offer", offer)
    app.router.add_post("/whip", whip_post)
    app.router.add_delete("/whip/{call_id}", whip_delete)
    app.router.add_get("/api/calls", list_calls)
    app.router.add_post("/api/calls/sip", dial_sip)
    app.router.add_get("/api/calls/{call_id}", get_call)
    app.router.add_delete("/api/calls/{call_id}", end_call)
    app.router.add_get("/api/calls/{call_id}/events", call_events)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_post("/api/drain", drain)
    app.router.add_get("/api/ice", ice)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get(r"/{name:[A-Za-z0-9_-]+\.(?:js|css|svg|png|ico|html)}", static)
    add_carrier_routes(app, runtime)

    app.on_startup.append(_start)
    app.on_shutdown.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    runtime = app[RUNTIME]
    await runtime.open_records()
    await runtime.start_events()
    runtime.start_loading()
    ua = app.get(SIP)
    if ua is not None:
        await ua.start()


async def _stop(app: web.Application) -> None:
    runtime = app[RUNTIME]
    await runtime.registry.end_all("shutdown")  # while SIP is still up: the calls' BYEs go out
    ua = app.get(SIP)
    if ua is not None:
        await ua.close()
    await runtime.close()
