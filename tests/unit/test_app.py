"""The HTTP surface with test engines: routes, errors as JSON, capacity, auth, health and metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from parley.app import create_app
from parley.config import Settings
from tests.doubles import make_engines

AUDIO_OFFER = """v=0\r
o=- 1 1 IN IP4 127.0.0.1\r
s=-\r
t=0 0\r
m=video 9 UDP/TLS/RTP/SAVPF 96\r
c=IN IP4 0.0.0.0\r
a=rtpmap:96 VP8/90000\r
"""


async def client_for(settings: Settings) -> TestClient:  # type: ignore[type-arg]
    client: TestClient = TestClient(TestServer(create_app(settings, engines=make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    return client


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    c = await client_for(Settings(max_body_bytes=4096, sip="off"))
    yield c
    await c.close()


async def test_health_ready_and_metrics(client) -> None:  # type: ignore[no-untyped-def]
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 200 and (await ready.json())["ready"] is True
    metrics = await (await client.get("/metrics")).text()
    assert "parley_calls_active" in metrics and "parley_response_latency_seconds" in metrics


async def test_the_page_and_its_assets_are_served(client) -> None:  # type: ignore[no-untyped-def]
    page = await client.get("/")
    assert page.status == 200 and "call-button" in await page.text()
    script = await client.get("/app.js")
    assert script.status == 200 and "javascript" in script.headers["Content-Type"]
    missing = await client.get("/nope.js")
    assert missing.status == 404 and "error" in await missing.json()


@pytest.mark.parametrize(
    ("body", "content_type", "status", "words"),
    [
        (b"{not json", "application/json", 400, "JSON"),
        (b'["sdp"]', "application/json", 400, "expected"),
        (b'{"sdp": "v=0", "type": "answer"}', "application/json", 400, "offer"),
        (b'{"sdp": "hello", "type": "offer"}', "application/json", 400, "v=0"),
        (json.dumps({"sdp": AUDIO_OFFER, "type": "offer"}).encode(), "application/json", 400, "no audio"),
        (
            json.dumps({"sdp": "v=0\r\nm=audio\r\n", "type": "offer"}).encode(),
            "application/json",
            400,
            "offer",
        ),
        (b"x" * 10000, "application/json", 413, "too large"),
    ],
)
async def test_bad_offers_get_a_4xx_with_a_json_error(client, body, content_type, status, words) -> None:  # type: ignore[no-untyped-def]
    response = await client.post("/offer", data=body, headers={"Content-Type": content_type})
    assert response.status == status
    assert words in (await response.json())["error"]


async def test_whip_wants_sdp_and_unknown_calls_are_404(client) -> None:  # type: ignore[no-untyped-def]
    wrong_type = await client.post("/whip", data=b"{}", headers={"Content-Type": "application/json"})
    assert wrong_type.status == 415
    no_audio = await client.post(
        "/whip", data=AUDIO_OFFER.encode(), headers={"Content-Type": "application/sdp"}
    )
    assert no_audio.status == 400
    gone = await client.delete("/whip/c-nothere")
    assert gone.status == 404 and "error" in await gone.json()
    unknown = await client.get("/api/calls/c-nothere")
    assert unknown.status == 404
    assert await (await client.get("/api/calls")).json() == []


async def test_a_token_guards_signaling_and_the_api() -> None:
    c = await client_for(Settings(token="s3cret", sip="off"))
    try:
        assert (await c.get("/api/calls")).status == 401
        assert (await c.post("/offer", json={"sdp": "v=0", "type": "offer"})).status == 401
        assert (await c.get("/metrics")).status == 401
        ok = await c.get("/api/calls", headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 200
        assert (await c.get("/metrics", headers={"Authorization": "Bearer s3cret"})).status == 200
        assert (await c.get("/healthz")).status == 200 and (await c.get("/readyz")).status == 200
    finally:
        await c.close()
