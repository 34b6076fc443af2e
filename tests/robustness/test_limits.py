"""Admission and limits: per-source set-up rates on every transport, offer size, media sections and
candidates, data-channel messages, call duration and silence."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from parley import metrics
from parley.app import REGISTRY, RUNTIME, create_app
from parley.bench.service import free_port, metric_value
from parley.config import Settings
from parley.limits import MessageGuard
from parley.ratelimit import (
    Proxies,
    Source,
    SourceLimiter,
    TokenBucket,
    forwarded_source,
    networks,
    source_key,
)
from parley.transports.base import open_call
from tests.doubles import make_engines
from tests.robustness.test_defects import eventually, offer_sdp
from tests.sip_wire import LOCAL, Dialogue, SipWire, offer
from tests.unit.test_transport_seam import connect


def counted(name: str, **labels: str) -> float:
    return metric_value(metrics.exposition().decode(), name, labels)


async def app_client(**overrides: Any) -> TestClient:  # type: ignore[type-arg]
    # Loopback is spared by default; these tests flood from it.
    options: dict[str, Any] = {
        "sip": "off",
        "greeting": "",
        "ice_addresses": ("127.0.0.1",),
        "rate_limit_exempt": (),
    }
    options.update(overrides)
    client: TestClient = TestClient(TestServer(create_app(Settings(**options), make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    return client


def test_a_token_bucket_allows_a_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) == 0.0 and bucket.take(0.5) > 0


def test_a_peer_that_keeps_sending_faster_than_allowed_is_flooding_though_some_messages_get_in() -> None:
    # 100 messages a second against 10 allowed: one in ten is admitted, so refusals never come 200 in a
    # row; within ten seconds they reach 200 all the same.
    guard = MessageGuard(max_bytes=512, per_s=10, now=0.0)
    admitted, flooding_at = 0, None
    for n in range(1000):
        now = n / 100
        admitted += guard.admit(20, now) is None
        if flooding_at is None and guard.flooding:
            flooding_at = now
    assert flooding_at is not None and flooding_at < 3.0, flooding_at
    assert admitted > 20  # the burst and then the rate got through
    # A page within its limit, or one burst over it now and then, is never flooding.
    calm = MessageGuard(max_bytes=512, per_s=10, now=0.0)
    for second in range(60):
        for k in range(25):  # a burst of 25 each second: 5 refused
            calm.admit(20, second + k / 1000)
        assert not calm.flooding


def test_sources_are_counted_per_address_ipv6_per_64_and_the_exempt_are_spared() -> None:
    limiter = SourceLimiter(rate=0.1, burst=1, exempt=("10.0.0.0/8",))
    assert limiter.check("192.0.2.1", 0.0) == 0.0 and limiter.check("192.0.2.1", 0.0) > 0
    assert limiter.check("192.0.2.2", 0.0) == 0.0  # another address, another bucket
    assert limiter.check("2001:db8:1:2::1", 0.0) == 0.0 and limiter.check("2001:db8:1:2::ffff", 0.0) > 0
    assert source_key("::ffff:192.0.2.9") == "192.0.2.9"
    assert all(limiter.check("10.1.2.3", 0.0) == 0.0 for _ in range(10))
    assert SourceLimiter(rate=0, burst=1).check("192.0.2.1", 0.0) == 0.0  # off
    small = SourceLimiter(rate=1, burst=1, max_sources=2)
    for n in range(5):
        small.check(f"192.0.2.{n}", 0.0)
    assert len(small._buckets) == 2


def test_behind_a_trusted_proxy_the_forwarded_address_is_the_source() -> None:
    trusted = networks(["127.0.0.1", "10.0.0.0/8"])
    headers = {"X-Forwarded-For": "203.0.113.7, 10.1.1.1"}
    assert forwarded_source("127.0.0.1", headers, trusted) == "203.0.113.7"
    assert forwarded_source("198.51.100.1", headers, trusted) == "198.51.100.1"  # not a proxy: spoofable
    assert forwarded_source("127.0.0.1", {}, trusted) == "127.0.0.1"


def test_only_a_named_proxy_s_forwarding_counts_and_an_unnamed_one_is_never_spared() -> None:
    headers = {"X-Forwarded-For": "203.0.113.7"}
    named = Proxies(["127.0.0.1"])
    assert named.source("127.0.0.1", headers) == Source("203.0.113.7")
    assert named.forwarded("127.0.0.1", {"X-Forwarded-Host": "voice.example.com, x"}, "Host") == (
        "voice.example.com"
    )
    nobody = Proxies([])
    assert nobody.source("127.0.0.1", headers) == Source("127.0.0.1", spareable=False)
    assert nobody.source("127.0.0.1", {}) == Source("127.0.0.1")
    assert nobody.forwarded("127.0.0.1", {"X-Forwarded-Host": "evil.example"}, "Host") is None
    limiter = SourceLimiter(rate=0.1, burst=1, exempt=("127.0.0.0/8",))
    assert all(limiter.check("127.0.0.1", 0.0) == 0.0 for _ in range(3))
    assert limiter.check("127.0.0.1", 0.0, spare=False) == 0.0
    assert limiter.check("127.0.0.1", 0.0, spare=False) > 0


async def test_a_flood_of_offers_from_one_address_gets_429_with_retry_after() -> None:
    c = await app_client(setup_rate=0.5, setup_burst=3)
    try:
        before = counted("parley_calls_refused_total", transport="webrtc", reason="rate_limited")
        statuses = []
        for _ in range(5):
            response = await c.post("/offer", json={"sdp": "v=0\r\n", "type": "offer"})
            statuses.append(response.status)
        assert statuses[:3] == [400, 400, 400] and statuses[3:] == [429, 429]
        assert int(response.headers["Retry-After"]) >= 1 and "too many" in (await response.json())["error"]
        after = counted("parley_calls_refused_total", transport="webrtc", reason="rate_limited")
        assert after == before + 2
        assert (await c.get("/api/calls")).status == 200  # only call set-up is limited
    finally:
        await c.close()


async def invite_flood(invites: int, **settings: Any) -> list[Any]:
    """`invites` INVITEs at once from one address; their final responses (answered calls are ACKed)."""
    sip_port = free_port()
    c = await app_client(sip=f"{LOCAL}:{sip_port}", rtp_timeout_s=0, **settings)
    wire = await SipWire.open(sip_port)
    try:
        dialogues = [Dialogue(wire, f"sip:agent@{LOCAL}:{sip_port}") for _ in range(invites)]
        for d in dialogues:
            wire.send(d.invite(offer(9)))
        finals = [await wire.final(method="INVITE", call_id=d.call_id) for d in dialogues]
        for d, final in zip(dialogues, finals, strict=True):
            if final.status == 200:
                d.learn(final)
                wire.send(d.ack())
        return finals
    finally:
        await c.close()
        await wire.close()


async def test_a_flood_of_invites_from_one_address_gets_503_with_retry_after() -> None:
    finals = await invite_flood(4, setup_rate=0.5, setup_burst=2)
    statuses = [f.status for f in finals]
    assert statuses.count(200) == 2 and statuses.count(503) == 2, statuses
    refused = next(f for f in finals if f.status == 503)
    assert int(refused.headers.get("Retry-After") or 0) >= 1


async def test_a_trunk_on_the_sip_allow_list_is_not_rate_limited() -> None:
    """A trunk brings every caller from one address: the allow-list marks it as one."""
    finals = await invite_flood(4, setup_rate=0.5, setup_burst=2, sip_allow=("127.0.0.1",))
    assert [f.status for f in finals] == [200] * 4


async def test_a_flood_of_carrier_streams_from_one_address_is_closed_try_again_later() -> None:
    c = await app_client(setup_rate=0.5, setup_burst=1)
    base = str(c.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession() as session:
            first = await session.ws_connect(f"{base}/twilio/stream")
            second = await session.ws_connect(f"{base}/twilio/stream")
            message = await second.receive(timeout=5)
            assert message.type is aiohttp.WSMsgType.CLOSE and second.close_code == 1013
            assert "too many" in str(message.extra)
            await first.close()
    finally:
        await c.close()


async def test_offers_larger_or_with_more_candidates_than_allowed_are_refused() -> None:
    c = await app_client(max_sdp_bytes=3000, max_ice_candidates=2)
    try:
        sdp = await offer_sdp()
        big = sdp + "a=x-padding:" + "x" * 3000 + "\r\n"
        too_big = await c.post("/offer", json={"sdp": big, "type": "offer"})
        assert too_big.status == 413 and "too large" in (await too_big.json())["error"]
        head, _, tail = sdp.partition("a=end-of-candidates")
        candidate = "a=candidate:1 1 UDP 2130706431 127.0.0.1 {} typ host\r\n"
        many = head + "".join(candidate.format(9000 + n) for n in range(3)) + "a=end-of-candidates" + tail
        candidates = await c.post("/offer", json={"sdp": many, "type": "offer"})
        assert candidates.status == 400 and "candidates" in (await candidates.json())["error"]
        assert c.app[REGISTRY].active() == []
    finally:
        await c.close()


class Page:
    """The page's side of a call, as far as the data channel goes: an aiortc peer with `events`."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.channel: RTCDataChannel = self.pc.createDataChannel("events")
        self.received: list[dict[str, Any]] = []
        self.channel.on("message", lambda m: self.received.append(json.loads(m)))
        self.call_id = ""

    async def connect(self, client: TestClient) -> None:  # type: ignore[type-arg]
        self.pc.addTransceiver("audio")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        response = await client.post("/offer", json={"sdp": self.pc.localDescription.sdp, "type": "offer"})
        answer = await response.json()
        self.call_id = answer["call_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
        await eventually(lambda: self.channel.readyState == "open", 10, "the data channel opened")

    async def answers(self, kind: str, count: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        await eventually(lambda: len(self.of(kind)) >= count, timeout, f"{count} {kind}")
        return self.of(kind)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m.get("type") == kind]


@pytest.fixture
async def page_call() -> AsyncIterator[tuple[TestClient, Page]]:  # type: ignore[type-arg]
    c = await app_client(max_dc_message_bytes=512, max_dc_messages_per_s=10)
    page = Page()
    try:
        await page.connect(c)
        yield c, page
    finally:
        await page.pc.close()
        await c.close()


async def test_the_page_may_ping_and_anything_else_it_sends_gets_an_error(page_call) -> None:  # type: ignore[no-untyped-def]
    _, page = page_call
    bad_before = counted("parley_transport_errors_total", transport="webrtc", reason="dc_bad_message")
    page.channel.send(json.dumps({"type": "ping", "id": 7}))
    assert (await page.answers("pong"))[0] == {"type": "pong", "id": 7}
    for message in ("not json", "[1, 2]", '{"type": "launch"}', b"\x00\xff", "[" * 400):
        page.channel.send(message)
    errors = await page.answers("error", 5)
    assert any("unknown message type" in e["error"] for e in errors)
    assert any("JSON" in e["error"] for e in errors)
    after = counted("parley_transport_errors_total", transport="webrtc", reason="dc_bad_message")
    assert after == bad_before + 5


async def test_oversized_and_flooding_data_channel_messages_are_dropped_then_the_channel_closed(
    page_call,
) -> None:  # type: ignore[no-untyped-def]
    client, page = page_call
    page.channel.send("x" * 600)
    assert "too large" in (await page.answers("error"))[0]["error"]
    rate_before = counted("parley_transport_errors_total", transport="webrtc", reason="dc_rate")
    for n in range(300):  # 10 a second allowed, a burst of 20: the rest is dropped, then the channel closed
        page.channel.send(json.dumps({"type": "ping", "id": n}))
    await eventually(lambda: page.channel.readyState == "closed", 10, "the flooded channel was closed")
    assert 1 <= len(page.of("pong")) <= 25
    assert counted("parley_transport_errors_total", transport="webrtc", reason="dc_rate") >= rate_before + 200
    call = client.app[REGISTRY].get(page.call_id)
    assert call is not None and not call.ended  # the call itself goes on


async def test_a_call_longer_than_max_call_s_ends() -> None:
    c = await app_client(max_call_s=1.0)
    try:
        call, transport = await open_call(c.app[RUNTIME], "sip", 8000, connect)
        started = time.monotonic()
        await eventually(lambda: call.ended, 5, "the call reached its limit")
        assert 0.9 <= time.monotonic() - started <= 2.5 and call.end_reason == "max_duration"
        assert transport.closed
    finally:
        await c.close()


async def test_a_call_nobody_speaks_in_ends_after_max_silence_s() -> None:
    c = await app_client(max_silence_s=0.8)
    try:
        runtime = c.app[RUNTIME]
        quiet_call, _ = await open_call(runtime, "sip", 8000, connect)
        busy_call, _ = await open_call(runtime, "sip", 8000, connect)
        busy_call.decisions.user_started_speaking()  # the caller is talking: not silence, however long
        await eventually(lambda: quiet_call.ended, 5, "the silent call ended")
        assert quiet_call.end_reason == "silence"
        await asyncio.sleep(1.0)
        assert not busy_call.ended
    finally:
        await c.close()
