"""The Prometheus metrics: every one of DESIGN.md, bounded labels, buckets for voice, capacity and
readiness, and WebRTC connections that never connect counted by reason."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection
from prometheus_client import Counter
from prometheus_client.metrics import MetricWrapperBase

from parley import metrics
from parley.app import REGISTRY, RUNTIME, create_app
from parley.bench.service import metric_value
from parley.config import Settings
from parley.drain import drain
from parley.runtime import CallRefused, Runtime
from parley.transports.base import open_call
from tests.doubles import make_engines
from tests.unit.test_transport_seam import connect

DESIGN_METRICS = {
    "parley_calls_active": {"transport"},
    "parley_calls_total": {"transport", "outcome"},
    "parley_call_duration_seconds": set(),
    "parley_turns_total": set(),
    "parley_turn_revisions_total": set(),
    "parley_reopen_candidates_total": {"outcome"},
    "parley_commits_total": {"outcome"},
    "parley_barge_ins_total": set(),
    "parley_interruption_latency_seconds": set(),
    "parley_false_interruptions_total": set(),
    "parley_stage_latency_seconds": {"stage"},
    "parley_response_latency_seconds": set(),
    "parley_queue_depth": {"stage"},
    "parley_frames_dropped_total": {"reason"},
    "parley_engine_errors_total": {"engine"},
    "parley_transport_errors_total": {"transport", "reason"},
    "parley_calls_max": set(),
    "parley_ready": set(),
}
# type: event kinds; result: who answered an outbound call (amd.py's four verdicts)
BOUNDED_LABELS = {"transport", "outcome", "stage", "reason", "engine", "type", "result", "le"}


def families() -> dict[str, set[str]]:
    """Each metric of the module and its label names, as exposed (counters with their _total)."""
    found: dict[str, set[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            suffix = "_total" if isinstance(value, Counter) else ""
            found[value._name + suffix] = set(value._labelnames)  # prometheus_client's own fields
    return found


def test_every_design_metric_is_exported_with_bounded_labels() -> None:
    exported = families()
    for name, labels in DESIGN_METRICS.items():
        assert name in exported, f"{name} is missing"
        assert labels <= exported[name], f"{name} lacks labels {labels - exported[name]}"
    for name, labels in exported.items():
        assert labels <= BOUNDED_LABELS, f"{name} has unbounded labels {labels - BOUNDED_LABELS}"


def test_latency_histograms_have_buckets_from_10_ms_to_5_s() -> None:
    response = metrics.RESPONSE_LATENCY._upper_bounds  # prometheus_client keeps them here; +Inf last
    assert response[0] == 0.01 and response[-2] == 5.0 and 1.2 in response  # the target on an edge
    for histogram in (metrics.INTERRUPTION_LATENCY, metrics.STAGE_LATENCY):
        buckets = histogram._upper_bounds  # these also resolve the ~1 ms it takes to pause the agent
        assert buckets[0] < 0.001 and 0.01 in buckets and 0.15 in buckets and buckets[-2] == 5.0


async def test_calls_are_counted_by_transport_and_never_by_their_id() -> None:
    runtime = Runtime(Settings(greeting="Hi.", sip="off"), make_engines())
    try:
        call, _ = await open_call(runtime, "twilio", 8000, connect)
        text = metrics.exposition().decode()
        assert metric_value(text, "parley_calls_active", {"transport": "twilio"}) == 1
        await runtime.registry.end(call.call_id, "hangup")
        text = metrics.exposition().decode()
        assert metric_value(text, "parley_calls_total", {"transport": "twilio", "outcome": "hangup"}) >= 1
        assert call.call_id not in text and not re.search(r'"c-[0-9a-f]{12}', text)
    finally:
        await runtime.close()


async def test_capacity_and_readiness_follow_the_calls_and_a_drain() -> None:
    runtime = Runtime(Settings(greeting="", max_calls=1, sip="off"), make_engines())
    try:
        assert metric_value(metrics.exposition().decode(), "parley_calls_max") == 1
        assert metric_value(metrics.exposition().decode(), "parley_ready") == 1
        call, _ = await open_call(runtime, "sip", 8000, connect)
        assert metric_value(metrics.exposition().decode(), "parley_ready") == 0  # full
        await runtime.registry.end(call.call_id, "hangup")
        assert metric_value(metrics.exposition().decode(), "parley_ready") == 1
        runtime.drain()
        assert metric_value(metrics.exposition().decode(), "parley_ready") == 0
        with pytest.raises(CallRefused) as refused:
            await open_call(runtime, "sip", 8000, connect)
        assert refused.value.reason == "draining"
    finally:
        await runtime.close()


async def test_a_drained_instance_is_not_ready_and_lets_live_calls_finish() -> None:
    client: TestClient = TestClient(TestServer(create_app(Settings(sip="off", greeting=""), make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    try:
        registry = client.app[REGISTRY]
        live, _ = await open_call(client.app[RUNTIME], "sip", 8000, connect)
        drained = await client.post("/api/drain", json={})
        assert drained.status == 200 and (await drained.json())["calls"] == 1
        ready = await client.get("/readyz")
        assert ready.status == 503 and (await ready.json())["reason"] == "draining"
        assert not live.ended and registry.get(live.call_id) is live
    finally:
        await client.close()


async def test_a_webrtc_call_that_never_connects_counts_as_an_ice_timeout() -> None:
    settings = Settings(sip="off", greeting="", connect_timeout_s=0.3)
    client: TestClient = TestClient(TestServer(create_app(settings, make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    before = metric_value(
        metrics.exposition().decode(), "parley_transport_errors_total", {"reason": "ice_timeout"}
    )
    caller = RTCPeerConnection()
    try:
        caller.addTransceiver("audio")
        await caller.setLocalDescription(await caller.createOffer())
        answer = await client.post("/offer", json={"sdp": caller.localDescription.sdp, "type": "offer"})
        call_id = (await answer.json())["call_id"]  # the answer is never applied: ICE cannot connect
        deadline = time.monotonic() + 10
        while (await (await client.get(f"/api/calls/{call_id}")).json())["state"] != "ended":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        details = await (await client.get(f"/api/calls/{call_id}")).json()
        assert details["ended_reason"] == "ice_timeout"
        after = metric_value(
            metrics.exposition().decode(),
            "parley_transport_errors_total",
            {"transport": "webrtc", "reason": "ice_timeout"},
        )
        assert after == before + 1
    finally:
        await caller.close()
        await client.close()


async def test_parley_drain_waits_for_the_live_calls_to_end() -> None:
    client: TestClient = TestClient(TestServer(create_app(Settings(sip="off", greeting=""), make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    try:
        live, _ = await open_call(client.app[RUNTIME], "sip", 8000, connect)
        settings = Settings(host="127.0.0.1", port=client.port or 0, sip="off")
        draining = asyncio.ensure_future(asyncio.to_thread(drain, settings, 10.0, 0.1))
        await asyncio.sleep(0.5)
        assert not draining.done()  # a call is still live
        await client.app[REGISTRY].end(live.call_id, "hangup")
        assert await asyncio.wait_for(draining, 5) == 0
        assert drain(Settings(port=1, sip="off"), 1.0) == 2  # nothing listens there
    finally:
        await client.close()


def test_queue_depth_counts_what_waits_in_every_live_queue_of_a_stage() -> None:
    from parley.pipeline.queues import StageQueue

    def depth() -> float:
        return metric_value(metrics.exposition().decode(), "parley_queue_depth", {"stage": "tts"})

    start = depth()
    first, second = StageQueue[int]("tts"), StageQueue[int]("tts")
    for n in range(3):
        first.put(n)
    second.put(9)
    assert depth() == start + 4
    first.get()
    second.flush()
    assert depth() == start + 2
    first.close()
    del first, second
    assert depth() == start
