"""Soak: `parley serve` with the real models holds calls on every transport for minutes while bad input
and abrupt hang-ups are mixed in. No held call is dropped, every question is answered within a generous
bound, and the service's memory and threads end where they were after warm-up. Under `make test-all`
(`SOAK_S`, default 180 s; about 4 minutes in all on 2 cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from parley.bench.caller import Caller
from parley.bench.carrier import CarrierCaller
from parley.bench.common import QUESTIONS
from parley.bench.service import Service, metric_value
from parley.bench.sip_caller import SipCaller
from parley.bench.speech import espeak, trim
from tests.robustness.live import LoopThread
from tests.robustness.test_leaks import Usage, one_call, wait_until

SOAK_S = float(os.environ.get("SOAK_S", "180"))
# A bound that says the service is not wedged, not how fast it is (`parley bench` measures that): on 2
# cores the three held calls now and then ask at once while a short aiortc call churns beside them, and
# with Qwen2.5-0.5B such a question waited 9-11 s (three runs on 2026-12-01; p50 ~4 s), past the 12 s
# this was once, now and then.
ANSWER_BOUND_S = 25.0
BAD_REQUESTS = [
    ("POST", "/offer", b"{not json", "application/json"),
    (
        "POST",
        "/offer",
        json.dumps({"sdp": "v=0\r\nm=audio 9 RTP/AVP 0\r\n", "type": "offer"}).encode(),
        "application/json",
    ),
    ("POST", "/offer", b"[" * 5000 + b"]" * 5000, "application/json"),
    ("POST", "/whip", b"v=0\r\n" + b"a=x\r\n" * 3000, "application/sdp"),
    ("POST", "/offer", b"sdp=v%3D0", "application/x-www-form-urlencoded"),
    ("DELETE", "/api/calls/no-such-call", b"", ""),
    ("POST", "/api/calls/sip", b'{"to": "not a uri"}', "application/json"),
    ("GET", "/api/calls?state=ended&cursor=%%%", b"", ""),
    ("POST", "/twilio/voice", b"From=%2B1", "application/x-www-form-urlencoded"),
]
SIP_GARBAGE = [
    b"\x00\xff" * 40,
    b"INVITE sip:agent SIP/2.0\r\n\r\n",
    b"OPTIONS sip:x@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKx\r\nCSeq: x\r\n\r\n",
    b"SIP/2.0 200 OK\r\nCall-ID: stray\r\n\r\n",
]


async def hold_a_call(caller: Any, clips: list[Any], until: float, rng: random.Random) -> dict[str, Any]:
    """One long call: a question every 10-20 s until `until`; each answered within ANSWER_BOUND_S."""
    answered: list[float] = []
    await caller.connect()
    try:
        await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
        await asyncio.sleep(rng.uniform(0, 8))
        while time.monotonic() < until - 15:
            asked, spoken_end = await caller.say(rng.choice(clips))
            heard = await caller.wait_for_audio(after=spoken_end, timeout=ANSWER_BOUND_S)
            answered.append(heard - spoken_end)
            await caller.wait_for_event("agent_done", timeout=60, after=asked)
            await asyncio.sleep(rng.uniform(10, 20))
        still_up = await call_is_active(caller)
    finally:
        await caller.hangup()
    return {"answered": answered, "still_up": still_up}


async def call_is_active(caller: Any) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"{caller.base_url}/api/calls") as r:
        return caller.call_id in {c["id"] for c in await r.json()}


async def chaos(service: Service, until: float, rng: random.Random, tried: Counter[str]) -> None:
    """Bad requests, SIP garbage and short calls that vanish mid-reply, one every second or two."""
    loop = asyncio.get_running_loop()
    sip, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    try:
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < until:
                roll = rng.random()
                if roll < 0.5:
                    method, path, body, kind = rng.choice(BAD_REQUESTS)
                    headers = {"Content-Type": kind} if kind else {}
                    async with session.request(
                        method, service.base_url + path, data=body, headers=headers
                    ) as r:
                        assert 400 <= r.status < 500, (method, path, r.status)
                    tried["bad requests"] += 1
                elif roll < 0.8:
                    sip.sendto(rng.choice(SIP_GARBAGE), ("127.0.0.1", service.sip_port))
                    tried["sip garbage"] += 1
                else:
                    kind = rng.choice(["webrtc", "sip", "carrier"])
                    await one_call(kind, rng.random() < 0.5, service.base_url, service.sip_uri)
                    tried[f"short {kind} calls"] += 1
                await asyncio.sleep(rng.uniform(0.5, 2.0))
    finally:
        sip.close()


async def warm_up(service: Service, clips: list[Any]) -> None:
    """A question on each transport at once: the models' first-use memory (and a batch of three) is
    spent before the baseline is taken."""

    async def ask(caller: Any) -> None:
        await caller.connect()
        try:
            await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
            asked, _ = await caller.say(clips[0])
            await caller.wait_for_event("agent_done", timeout=60, after=asked)
        finally:
            await caller.hangup()

    callers = [
        Caller(service.base_url),
        SipCaller(service.base_url, service.sip_uri),
        CarrierCaller(service.base_url),
    ]
    await asyncio.gather(*(ask(c) for c in callers))
    await one_call("webrtc", True, service.base_url, service.sip_uri)


@pytest.mark.slow
def test_calls_held_for_minutes_through_bad_input_and_abrupt_hang_ups(tmp_path: Path) -> None:
    service = Service(["--setup-rate", "0", "--rtp-timeout-s", "2"], log_path=tmp_path / "parley.log").start()
    loop = LoopThread("soak")
    pid = service.process.pid  # type: ignore[union-attr]
    rng = random.Random(7)
    tried: Counter[str] = Counter()
    try:
        clips = [trim(espeak(q)) for q in QUESTIONS[:6]]
        loop.run(warm_up(service, clips), timeout=180)
        time.sleep(2.0)
        before = Usage.of(pid)
        until = time.monotonic() + SOAK_S
        callers = [
            Caller(service.base_url),
            SipCaller(service.base_url, service.sip_uri),
            CarrierCaller(service.base_url),
        ]

        async def soak() -> list[Any]:
            holders = [hold_a_call(c, clips, until, random.Random(n)) for n, c in enumerate(callers)]
            return await asyncio.gather(*holders, chaos(service, until, rng, tried))

        results = loop.run(soak(), timeout=SOAK_S + 240)[:-1]
        wait_until(lambda: not service.get_json("/api/calls"), 60, "every call ended")
        wait_until(lambda: metric_value(service.metrics_text(), "parley_call_threads") == 0, 30, "threads")
        time.sleep(3.0)
        after = Usage.of(pid)
        latencies = sorted(t for r in results for t in r["answered"])
        print(
            f"\nsoak {SOAK_S:.0f} s: held {len(callers)} calls (webrtc, sip, carrier), "
            f"{len(latencies)} questions answered, p50 {latencies[len(latencies) // 2]:.2f} s, "
            f"max {latencies[-1]:.2f} s; injected {dict(tried)}; before {before}, after {after}"
        )
        assert all(r["still_up"] for r in results), "a held call was dropped"
        # A question every 10-20 s on each call: all of them answered, none skipped by a stall.
        assert all(len(r["answered"]) >= max(1, int((SOAK_S - 25) / 25)) for r in results)
        assert after.rss_mb <= before.rss_mb + 80
        assert after.threads <= before.threads + 4
        assert after.fds <= before.fds + 8
    finally:
        with contextlib.suppress(Exception):
            loop.close()
        assert service.stop() == 0
