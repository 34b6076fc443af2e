"""How a carrier's stream becomes a call: `GET /<carrier>/stream` (routed by carrier_webhooks.py).

The WebSocket is accepted, then checked in order, each refusal a close with its reason: the source's
flood limit (1013, try again later), the `start` message within `--stream-start-timeout-s` (1008; a
malformed one 1003), the stream token bound to the carrier's call id when a stream secret is set (1008),
the agent its parameters name (1008), a free call slot (1013). Then the Call opens at 8 kHz both ways,
the custom parameters the agent file declares become its variables, and the stream runs (media_stream.py)
until it ends.
"""

from __future__ import annotations

import logging
import time

from aiohttp import WSCloseCode, WSMsgType, web

from parley import metrics
from parley.call import Call
from parley.call_origin import Origin
from parley.log import event
from parley.ratelimit import Proxies
from parley.runtime import CallRefused, Runtime, UnknownAgent
from parley.transports.base import Connect, HangUp, open_call
from parley.transports.media_stream import (
    CARRIER_RATE,
    CLOSE_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
    Carrier,
    Handler,
    Handoffs,
    MediaStream,
    count_problem,
    json_object,
)
from parley.transports.twilio import TOKEN_PARAMETER, StreamError, StreamStart, StreamTokens

log = logging.getLogger(__name__)


def origin_of(start: StreamStart) -> Origin:
    """The parties the carrier named, and the stream's parameters as the call's variables: the caller's
    word, for our webhook's parameters travel through the carrier, and without a stream secret anyone may
    open a stream with parameters of their own (agent/variables.py)."""
    chosen = (TOKEN_PARAMETER, "agent")  # what opened the stream, not what the call is about
    parameters = {k: v for k, v in start.parameters.items() if k not in chosen}
    return Origin(start.caller, start.called, caller_context=parameters)


def connecting(
    ws: web.WebSocketResponse, carrier: Carrier, start: StreamStart, handoffs: Handoffs
) -> Connect[MediaStream]:
    """How `open_call` connects a started stream."""

    async def connect(call: Call, hang_up: HangUp) -> MediaStream:
        call.outbound.confirm_by_marks()
        # Its handler ends the call when the stream ends; the stream itself only for a transfer.
        stream = MediaStream(call, ws, carrier, start, hang_up, handoffs)
        stream.begin()
        return stream

    return connect


async def close_with(ws: web.WebSocketResponse, code: int, reason: str) -> None:
    await ws.close(code=code, message=reason.encode()[:123])  # a close frame's reason fits in 123 bytes


async def receive_start(ws: web.WebSocketResponse, carrier: Carrier, timeout_s: float) -> StreamStart | None:
    """Wait for the `start` message (after `connected`); None when the stream was closed instead."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            msg = await ws.receive(timeout=max(0.001, deadline - time.monotonic()))
        except TimeoutError:
            count_problem(carrier.name, "no_start")
            await close_with(ws, WSCloseCode.POLICY_VIOLATION, f"no start message within {timeout_s:g} s")
            return None
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return None
        message = json_object(msg.data) if msg.type is WSMsgType.TEXT else None
        kind = message.get("event") if message is not None else None
        if message is None or kind == "connected":
            if message is None:
                count_problem(carrier.name, "bad_json" if msg.type is WSMsgType.TEXT else "binary")
            continue
        if kind != "start":
            count_problem(carrier.name, "before_start")
            continue
        try:
            return carrier.parse_start(message)
        except StreamError as exc:
            count_problem(carrier.name, exc.reason)
            await close_with(ws, WSCloseCode.UNSUPPORTED_DATA, str(exc))
            return None


def stream_handler(
    carrier: Carrier, runtime: Runtime, tokens: StreamTokens | None, handoffs: Handoffs, proxies: Proxies
) -> Handler:
    # A stream whose token the carrier's signed webhook minted is the carrier's gateway, which carries
    # many callers: it is spared the per-source cap on calls (not the set-up rate).
    proven = tokens is not None and carrier.signs_webhooks

    async def serve(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, timeout=CLOSE_TIMEOUT_S)
        await ws.prepare(request)
        source = proxies.source(request.remote or "", request.headers)
        try:
            runtime.check_source(carrier.name, source.address, spare=source.spareable)
        except CallRefused as exc:
            await close_with(ws, WSCloseCode.TRY_AGAIN_LATER, exc.message)
            return ws
        start = await receive_start(ws, carrier, runtime.settings.stream_start_timeout_s)
        if start is None:
            return ws
        problem = tokens.problem(carrier.name, start, time.time()) if tokens is not None else None
        if problem is not None:
            metrics.CALLS_REFUSED_TOTAL.labels(transport=carrier.name, reason="forbidden").inc()
            event(
                log,
                "stream_refused",
                logging.WARNING,
                carrier=carrier.name,
                reason=problem,
                sid=start.call_id,
            )
            await close_with(ws, WSCloseCode.POLICY_VIOLATION, problem)
            return ws
        try:
            agent = runtime.agent(start.parameters.get("agent"))
        except UnknownAgent as exc:
            await close_with(ws, WSCloseCode.POLICY_VIOLATION, str(exc))
            return ws
        try:
            call, stream = await open_call(
                runtime,
                carrier.name,
                CARRIER_RATE,
                connecting(ws, carrier, start, handoffs),
                origin=origin_of(start),
                agent=agent,
                source=None if proven else source,
            )
        except CallRefused as exc:
            await close_with(ws, WSCloseCode.TRY_AGAIN_LATER, exc.message)
            return ws
        event(log, "stream_started", call_id=call.call_id, carrier=carrier.name, sid=start.call_id)
        reason = "stream_error"
        try:
            reason = await stream.run()
        finally:
            await runtime.registry.end(call.call_id, reason)
        return ws

    return serve
