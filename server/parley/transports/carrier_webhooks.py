"""The carrier's webhooks: `POST /<carrier>/voice` answers an incoming call with markup that connects it
to our media stream (opened in stream_opening.py, run in media_stream.py), and `POST
/<carrier>/connect-action` tells the carrier what next once the stream has closed (a transfer's `<Dial>`,
else `<Hangup/>`). Both check the carrier's signature.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from urllib.parse import parse_qsl

from aiohttp import web

from parley import metrics
from parley.carrier_settings import CarrierSettings
from parley.config import SettingsError
from parley.log import event
from parley.ratelimit import Proxies
from parley.runtime import CallRefused, Runtime
from parley.transports.media_stream import (
    MAX_PARAMETER_CHARS,
    MAX_PARAMETERS,
    Carrier,
    Handler,
    Handoffs,
)
from parley.transports.stream_opening import stream_handler
from parley.transports.telnyx import Telnyx
from parley.transports.twilio import (
    CALL_ID_PARAM,
    CALLED_PARAM,
    CALLER_PARAM,
    TOKEN_PARAMETER,
    StreamTokens,
    Twilio,
    dial_markup,
    hangup_markup,
    reject_markup,
)

log = logging.getLogger(__name__)


def stream_tokens(settings: CarrierSettings) -> StreamTokens | None:
    """Tokens with the configured secret; with none, a random one per process as soon as a carrier
    credential is set (webhooks are checked, so streams must be too); else no tokens at all."""
    if settings.stream_secret:
        return StreamTokens(settings.stream_secret.encode())
    if settings.twilio_auth_token or settings.telnyx_public_key:
        return StreamTokens(secrets.token_bytes(32))
    return None


def public_base(request: web.Request, settings: CarrierSettings, proxies: Proxies) -> str:
    """The service's URL as the carrier sees it (scheme and host, no trailing slash): --public-url, else
    the request's, as a trusted proxy forwarded it (anyone else's X-Forwarded-* is ignored)."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    remote = request.remote or ""
    scheme = proxies.forwarded(remote, request.headers, "Proto") or request.scheme
    host = proxies.forwarded(remote, request.headers, "Host") or request.host
    return f"{scheme}://{host}"


def custom_parameters(query: Mapping[str, str]) -> dict[str, str]:
    """The webhook URL's query parameters (e.g. `?agent=sales`), passed on to the stream."""
    if len(query) > MAX_PARAMETERS or any(len(k) + len(v) > MAX_PARAMETER_CHARS for k, v in query.items()):
        raise web.HTTPBadRequest(
            reason=f"at most {MAX_PARAMETERS} parameters of {MAX_PARAMETER_CHARS} characters"
        )
    return {k: v for k, v in query.items() if k != TOKEN_PARAMETER}


def voice_handler(
    carrier: Carrier, runtime: Runtime, tokens: StreamTokens | None, proxies: Proxies
) -> Handler:
    async def answer(request: web.Request) -> web.Response:
        settings = runtime.settings
        body = await request.read()
        params = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)  # form-encoded
        base = public_base(request, settings, proxies)
        problem = carrier.webhook_problem(base + request.path_qs, request.headers, body, params, time.time())
        if problem is not None:
            metrics.CALLS_REFUSED_TOTAL.labels(transport=carrier.name, reason="forbidden").inc()
            event(log, "webhook_refused", logging.WARNING, carrier=carrier.name, reason=problem)
            return web.json_response({"error": problem}, status=403)
        form = dict(params)
        call_id = form.get(CALL_ID_PARAM, "")
        if not call_id:
            return web.json_response({"error": f"no {CALL_ID_PARAM}"}, status=400)
        try:
            runtime.admit(carrier.name)  # counts the refusal; the line is taken when the stream starts
        except CallRefused as exc:
            event(log, "call_rejected", carrier=carrier.name, reason=exc.reason, sid=call_id)
            return web.Response(text=reject_markup(), content_type="text/xml")
        parameters = custom_parameters(request.query)
        parameters.update(caller=form.get(CALLER_PARAM, ""), called=form.get(CALLED_PARAM, ""))
        if tokens is not None:
            parameters[TOKEN_PARAMETER] = tokens.mint(carrier.name, call_id, parameters, time.time())
        stream_url = "ws" + base.removeprefix("http") + f"/{carrier.name}/stream"  # https -> wss, http -> ws
        markup = carrier.connect_markup(stream_url, parameters, f"{base}/{carrier.name}/connect-action")
        return web.Response(text=markup, content_type="text/xml")

    return answer


def action_handler(carrier: Carrier, runtime: Runtime, handoffs: Handoffs, proxies: Proxies) -> Handler:
    """The carrier asks what next once our stream has closed: `<Dial>` the destination of a transfer the
    agent made, else `<Hangup/>` (the agent or the service ended the call). Signed like the voice webhook."""

    async def next_step(request: web.Request) -> web.Response:
        body = await request.read()
        params = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        url = public_base(request, runtime.settings, proxies) + request.path_qs
        problem = carrier.webhook_problem(url, request.headers, body, params, time.time())
        if problem is not None:
            event(log, "webhook_refused", logging.WARNING, carrier=carrier.name, reason=problem)
            return web.json_response({"error": problem}, status=403)
        call_id = dict(params).get(CALL_ID_PARAM, "")
        destination = handoffs.take(carrier.name, call_id, time.monotonic()) if call_id else None
        event(log, "carrier_next_step", carrier=carrier.name, sid=call_id, dial=destination or "")
        markup = dial_markup(destination) if destination else hangup_markup()
        return web.Response(text=markup, content_type="text/xml")

    return next_step


def add_carrier_routes(app: web.Application, runtime: Runtime, proxies: Proxies) -> None:
    """`POST /<carrier>/voice`, `GET /<carrier>/stream` and `POST /<carrier>/connect-action` for Twilio
    and Telnyx. `proxies`: whose X-Forwarded-* name the caller and the public URL."""
    settings = runtime.settings
    if settings.public_url and not settings.public_url.startswith(("https://", "http://")):
        raise SettingsError(f"public_url must start with https:// (or http://), not {settings.public_url!r}")
    if settings.stream_start_timeout_s <= 0:
        raise SettingsError("stream_start_timeout_s must be positive")
    try:
        carriers: list[Carrier] = [Twilio(settings.twilio_auth_token), Telnyx(settings.telnyx_public_key)]
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc
    tokens = stream_tokens(settings)
    handoffs = Handoffs()
    for carrier in carriers:
        app.router.add_post(f"/{carrier.name}/voice", voice_handler(carrier, runtime, tokens, proxies))
        app.router.add_get(
            f"/{carrier.name}/stream", stream_handler(carrier, runtime, tokens, handoffs, proxies)
        )
        app.router.add_post(
            f"/{carrier.name}/connect-action", action_handler(carrier, runtime, handoffs, proxies)
        )
