"""WebRTC signaling over HTTP: the page's JSON offer (`/offer`), WHIP (`/whip`, `/whip/{call_id}`), and
the ICE servers a caller may use (`/api/ice`). Each offer is checked, then answered with a new Call."""

from __future__ import annotations

import time

from aiohttp import web

from parley import metrics
from parley.access import CallGrant, TokenStoreUnavailable
from parley.agent.templates import ContextError, checked_context
from parley.call import Call
from parley.call_origin import Origin
from parley.http_api import (
    ACCESS,
    RUNTIME,
    ApiError,
    count_setup,
    hang_up,
    may_call,
    read_body,
    refusal,
    request_source,
)
from parley.limits import BadJson, LimitExceeded, SdpLimits, check_offer_size, parse_json
from parley.runtime import CallRefused, UnknownAgent
from parley.transports.base import open_call
from parley.transports.webrtc import WebRtcPeer, answering
from parley.transports.webrtc_signaling import SignalingError, parse_ice_servers
from parley.transports.webrtc_tracks import WEBRTC_RATE


def add_webrtc_routes(app: web.Application) -> None:
    app.router.add_post("/offer", offer)
    app.router.add_post("/whip", whip_post)
    app.router.add_delete("/whip/{call_id}", whip_delete)
    app.router.add_get("/api/ice", ice)


async def _start_webrtc_call(
    request: web.Request, offer_sdp: str, agent_name: object = None, context: object = None
) -> tuple[Call, str]:
    access = request.app[ACCESS]
    grant = may_call(request)
    try:
        await access.claim(grant)  # once in the fleet: AccessDenied (401) when spent already
    except TokenStoreUnavailable as exc:
        raise ApiError(503, str(exc), {"Retry-After": "5"}) from exc
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

    # A token's context is its signer's word; the offer's own sets only what the agent file declares,
    # and none of the token's keys (call_origin.py).
    origin = Origin(token_context=dict(grant.context), caller_context=variables)
    try:
        return await open_call(
            runtime,
            "webrtc",
            WEBRTC_RATE,
            answer,
            origin=origin,
            agent=agent,
            greet=False,
            source=request_source(request),
        )
    except CallRefused as exc:
        raise refusal(exc) from exc
    except SignalingError as exc:
        metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="webrtc", reason="bad_offer").inc()
        raise ApiError(400, str(exc)) from exc


async def offer(request: web.Request) -> web.Response:
    count_setup(request)
    may_call(request)
    # A form posted from another site (text/plain, form types) is sent without a CORS preflight;
    # application/json needs one, which this service never grants.
    if request.content_type != "application/json":
        raise ApiError(415, "offers are application/json")
    body = await read_body(request)
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
    count_setup(request)
    may_call(request)
    if request.content_type != "application/sdp":
        raise ApiError(415, "WHIP offers are application/sdp")
    body = await read_body(request)
    try:
        sdp = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "the SDP must be UTF-8") from exc
    call, answer = await _start_webrtc_call(request, sdp, request.query.get("agent"))
    return web.Response(
        status=201, text=answer, content_type="application/sdp", headers={"Location": f"/whip/{call.call_id}"}
    )


async def whip_delete(request: web.Request) -> web.Response:
    """Hang up: with the bearer token, or the call token that opened this call (the page's hang-up)."""
    access = request.app[ACCESS]
    access.check_hang_up(request.headers.get("Authorization", ""), request.match_info["call_id"], time.time())
    return await hang_up(request)


async def ice(request: web.Request) -> web.Response:
    """The page's ICE servers: STUN, and TURN with credentials that expire (coturn's REST API)."""
    may_call(request)
    servers = request.app[ACCESS].ice_servers(time.time())
    return web.json_response(servers, headers={"Cache-Control": "no-store"})
