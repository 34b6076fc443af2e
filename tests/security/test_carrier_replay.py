"""Carrier webhooks replayed and stream tokens carried to another call (issue 42, item 13). Telnyx signs
`<timestamp>|<body>` only, not the URL or its query, so a captured request would pass again within its
five minutes, on any of our Telnyx routes: each signed payload is taken once. A stream token opens only
the call its webhook was minted for. After each attack a legitimate request still works.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any
from urllib.parse import urlencode
from xml.etree import ElementTree

import aiohttp
from aiohttp import ClientResponse
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from parley.app import REGISTRY
from parley.transports.twilio import TOKEN_PARAMETER, twilio_signature
from tests.security.conftest import Service, Start, eventually

TELNYX_KEY = Ed25519PrivateKey.generate()
TELNYX_PUBLIC = base64.b64encode(
    TELNYX_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()
TWILIO_AUTH_TOKEN = "twilio-auth-token-0123"


def telnyx_signed(body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The headers Telnyx sends with a webhook whose body is `body`."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    signature = TELNYX_KEY.sign(stamp.encode() + b"|" + body)
    return {
        "telnyx-timestamp": stamp,
        "telnyx-signature-ed25519": base64.b64encode(signature).decode(),
        "Content-Type": "application/x-www-form-urlencoded",
    }


def form(call_sid: str) -> bytes:
    return urlencode({"CallSid": call_sid, "From": "+15550001111", "To": "+15550002222"}).encode()


async def status_of(response: ClientResponse) -> tuple[int, str]:
    return response.status, await response.text()


async def test_a_replayed_telnyx_webhook_is_refused_on_every_route(start: Start) -> None:
    service = await start(sip="off", telnyx_public_key=TELNYX_PUBLIC)
    body = form("v3:call-1")
    headers = telnyx_signed(body)
    first = await service.client.post("/telnyx/voice", data=body, headers=headers)
    assert first.status == 200 and "<Stream" in await first.text()
    before = await service.counter("parley_calls_refused_total", transport="telnyx", reason="forbidden")
    for path in ("/telnyx/voice", "/telnyx/voice?agent=other", "/telnyx/connect-action"):
        replayed = await service.client.post(path, data=body, headers=headers)
        assert replayed.status == 403, await replayed.text()
        assert "replayed" in (await replayed.json())["error"]
    after = await service.counter("parley_calls_refused_total", transport="telnyx", reason="forbidden")
    assert after >= before + 2  # the voice webhook counts its refusals
    # The next call Telnyx sends (its own timestamp and body) is answered.
    fresh = form("v3:call-2")
    answered = await service.client.post("/telnyx/voice", data=fresh, headers=telnyx_signed(fresh))
    assert answered.status == 200 and "<Stream" in await answered.text()


async def test_the_same_body_signed_at_another_second_is_a_new_request(start: Start) -> None:
    service = await start(sip="off", telnyx_public_key=TELNYX_PUBLIC)
    body = form("v3:call-3")
    now = int(time.time())
    for stamp in (now - 1, now):
        answered = await service.client.post("/telnyx/voice", data=body, headers=telnyx_signed(body, stamp))
        assert answered.status == 200
    stale = await service.client.post("/telnyx/voice", data=body, headers=telnyx_signed(body, now - 301))
    assert stale.status == 403 and "tolerance" in (await stale.json())["error"]


def stream_parameters(markup: str) -> dict[str, str]:
    root = ElementTree.fromstring(markup)
    return {p.attrib["name"]: p.attrib["value"] for p in root.iter("Parameter")}


async def twilio_webhook(service: Service, call_sid: str) -> dict[str, str]:
    """Twilio's signed voice webhook for `call_sid`: the custom parameters its stream must carry."""
    params = {"CallSid": call_sid, "From": "+15550001111", "To": "+15550002222"}
    url = str(service.client.make_url("/twilio/voice"))
    headers = {"X-Twilio-Signature": twilio_signature(TWILIO_AUTH_TOKEN, url, sorted(params.items()))}
    response = await service.client.post("/twilio/voice", data=params, headers=headers)
    assert response.status == 200, await response.text()
    return stream_parameters(await response.text())


async def open_stream(
    session: aiohttp.ClientSession, service: Service, call_sid: str, parameters: dict[str, str]
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(str(service.client.make_url("/twilio/stream")))
    start: dict[str, Any] = {
        "accountSid": "AC1",
        "callSid": call_sid,
        "streamSid": "MZ1",
        "tracks": ["inbound"],
        "customParameters": parameters,
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    }
    await ws.send_str(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
    await ws.send_str(json.dumps({"event": "start", "streamSid": "MZ1", "start": start}))
    return ws


async def test_a_stream_token_opens_only_the_call_it_was_minted_for(start: Start) -> None:
    service = await start(sip="off", twilio_auth_token=TWILIO_AUTH_TOKEN)
    minted_for_one = await twilio_webhook(service, "CA-one")
    assert minted_for_one[TOKEN_PARAMETER]
    registry = service.client.app[REGISTRY]
    async with aiohttp.ClientSession() as session:
        elsewhere = await open_stream(session, service, "CA-another", minted_for_one)
        closed = await elsewhere.receive(timeout=5)
        assert closed.type is aiohttp.WSMsgType.CLOSE and elsewhere.close_code == 1008
        assert "stream token" in str(closed.extra)
        assert not registry.active()
        # The call it was minted for still opens with it.
        own = await open_stream(session, service, "CA-one", minted_for_one)

        async def opened() -> bool:
            return len(registry.active()) == 1

        await eventually(opened, what="the call the token was minted for opens")
        await own.send_str(json.dumps({"event": "stop", "streamSid": "MZ1"}))
        await own.close()


async def test_a_carrier_whose_webhooks_are_signed_is_spared_the_per_source_cap(start: Start) -> None:
    """Every call a carrier streams comes from its gateway: the cap per source would refuse its callers."""
    service = await start(
        sip="off", twilio_auth_token=TWILIO_AUTH_TOKEN, rate_limit_exempt=(), max_calls_per_source=1
    )
    registry = service.client.app[REGISTRY]
    async with aiohttp.ClientSession() as session:
        streams = []
        for sid in ("CA-a", "CA-b"):
            streams.append(await open_stream(session, service, sid, await twilio_webhook(service, sid)))

        async def both() -> bool:
            return len(registry.active()) == 2

        await eventually(both, what="both carrier calls open")
        for ws in streams:
            await ws.send_str(json.dumps({"event": "stop", "streamSid": "MZ1"}))
            await ws.close()
