"""The aiohttp application: the call API, health, metrics and the browser page, with the WebRTC
signaling routes (transports/webrtc_http.py) and the carriers' webhooks mounted beside them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from parley import metrics
from parley.access import Access
from parley.agent.templates import ContextError, checked_context
from parley.config import Settings
from parley.engines import Engines
from parley.exposure import check_exposure
from parley.http_api import (
    ACCESS,
    PROXIES,
    REGISTRY,
    RUNTIME,
    SAME_SITE,
    SETTINGS,
    SIP,
    ApiError,
    Handler,
    SameSite,
    authorise,
    authorise_metrics,
    errors_as_json,
    hang_up,
    read_body,
    refusal,
    require_json,
    same_site_only,
)
from parley.limits import BadJson, parse_json
from parley.ratelimit import Proxies
from parley.records import BadCursor, DatabaseError
from parley.records.used_tokens import shared_used_tokens
from parley.runtime import CallRefused, Runtime
from parley.transports.carrier_webhooks import add_carrier_routes
from parley.transports.sip.dial_policy import DialRefused
from parley.transports.sip.uac import DialError, dial
from parley.transports.sip.useragent import SipUserAgent
from parley.transports.webrtc_http import add_webrtc_routes
from parley.transports.webrtc_signaling import configure_ice, parse_ice_servers

log = logging.getLogger(__name__)

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


def default_web_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "web"


async def end_call(request: web.Request) -> web.Response:
    """Hang up any call, whatever its transport (a SIP call gets its BYE)."""
    authorise(request)
    return await hang_up(request)


async def list_calls(request: web.Request) -> web.Response:
    """Active calls (a list); with `?fleet=1`, those of every instance sharing the records database (from
    the records: each with its `instance`); with `?state=ended`, a page of stored records: `{"calls",
    "next"}`, where `next` is the `cursor` of the following page (`&limit=` up to 200, default 50)."""
    authorise(request)
    state = request.query.get("state", "active")
    fleet = request.query.get("fleet") in ("1", "true")
    if state == "active" and not fleet:
        return web.json_response([call.summary() for call in request.app[REGISTRY].active()])
    if state not in ("active", "ended"):
        raise ApiError(400, "state must be active or ended")
    records = request.app[RUNTIME].records
    if records is None:
        raise ApiError(409, "call records are off (--database off)")
    if state == "active":
        try:
            return web.json_response(await asyncio.to_thread(records.list_live))
        except DatabaseError as exc:
            raise ApiError(503, f"call records unavailable: {exc}") from exc
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
    authorise(request)
    call_id = request.match_info["call_id"]
    call = request.app[REGISTRY].get(call_id)
    if call is not None:
        return web.json_response({**call.details(), **request.app[RUNTIME].after_call(call_id)})
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
    require_json(request)  # first: whatever the credentials, a form or text/plain body is refused
    authorise(request)
    runtime = request.app[RUNTIME]
    runtime.drain()
    return web.json_response({"draining": True, "calls": len(runtime.registry.active())})


async def call_events(request: web.Request) -> web.StreamResponse:
    """The call's events as they happen (Server-Sent Events), whatever its transport: the same JSON
    the browser page gets over its data channel. Ends when the call ends."""
    authorise(request)
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
    """`{"to": "sip:user@host:port", "context": {"name": "Dana"}}`: the agent calls out (`context`, optional:
    the call's variables); 202 with the call's id while it rings."""
    require_json(request)  # first: whatever the credentials, a form or text/plain body is refused
    authorise(request)
    ua = request.app.get(SIP)
    if ua is None:
        raise ApiError(409, "SIP is off (--sip off)")
    try:
        data = parse_json(await read_body(request))
    except BadJson as exc:
        raise ApiError(400, str(exc)) from exc
    if not isinstance(data, dict) or not isinstance(data.get("to"), str):
        raise ApiError(400, 'expected {"to": "sip:user@host:port"}')
    try:
        context = checked_context(data.get("context"))  # the dialler's, as a call token's context
    except ContextError as exc:
        raise ApiError(400, str(exc)) from exc
    try:
        call = await dial(ua, data["to"], context)
    except DialError as exc:
        raise ApiError(400, str(exc)) from exc
    except DialRefused as exc:  # the destination policy: 403, or 429 while the hourly budget is spent
        retry = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        raise ApiError(429 if retry else 403, str(exc), retry) from exc
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
    authorise_metrics(request)
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
    """The service. Without `engines`, the models load in a thread at start-up (readyz says when).
    SettingsError when it would be open to anyone who reaches it (exposure.py)."""
    check_exposure(settings)
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[errors_as_json, same_site_only]
    )
    runtime = Runtime(settings, engines)
    app[SETTINGS] = settings
    app[RUNTIME] = runtime
    app[REGISTRY] = runtime.registry
    app[ACCESS] = Access(
        settings, ice_servers=settings.ice_servers, used=shared_used_tokens(settings.database)
    )
    app[PROXIES] = Proxies(settings.trusted_proxies)
    app[SAME_SITE] = SameSite.of(settings)
    if settings.sip != "off":
        app[SIP] = SipUserAgent(runtime)
    configure_ice(settings.ice_addresses)
    parse_ice_servers(settings.ice_servers)  # a bad URL fails at start, not at the first call

    web_dir = Path(settings.web_dir) if settings.web_dir else default_web_dir()
    static = _static(web_dir)
    app.router.add_get("/", static)
    app.router.add_get("/api/calls", list_calls)
    app.router.add_post("/api/calls/sip", dial_sip)
    app.router.add_get("/api/calls/{call_id}", get_call)
    app.router.add_delete("/api/calls/{call_id}", end_call)
    app.router.add_get("/api/calls/{call_id}/events", call_events)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_post("/api/drain", drain)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get(r"/{name:[A-Za-z0-9_-]+\.(?:js|css|svg|png|ico|html)}", static)
    add_webrtc_routes(app)
    add_carrier_routes(app, runtime, app[PROXIES])

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
    await app[ACCESS].close()
    await runtime.close()
