"""A real caller (aiortc on loopback) talks to the real service with the default models."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

from parley.bench.caller import Caller
from parley.bench.common import word_overlap
from parley.bench.service import Service, metric_value
from parley.bench.speech import espeak
from parley.engines.stt import SttEngine

QUESTION = "what is the weather like in paris today"


def post(service: Service, path: str, body: bytes, content_type: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{service.base_url}{path}", data=body, headers={"Content-Type": content_type}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_caller_asks_about_the_weather_and_hears_a_spoken_reply(
    service: Service, whisper: SttEngine
) -> None:
    replies_before = metric_value(service.metrics_text(), "parley_response_latency_seconds_count")
    async with Caller(service.base_url) as caller:
        greeting = await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        assert greeting["text"]
        asked, spoken_end = await caller.say(espeak(QUESTION))
        heard_at = await caller.wait_for_audio(after=spoken_end, timeout=20)
        done = await caller.wait_for_event("agent_done", timeout=60, after=asked)
        # The reply's audio all went out before agent_done; a pause between its pieces is no end.
        silent_at = await caller.wait_for_silence(after=time.monotonic(), hold_s=0.6)
        heard = whisper.transcribe(caller.audio_between(heard_at - 0.2, silent_at + 0.2)).text
        assert len(heard.split()) >= 3, f"the reply should be speech, Whisper heard {heard!r}"
        call = service.get_json(f"/api/calls/{caller.call_id}")
        assert call["transport"] == "webrtc" and call["state"] != "ended"
        turn = next(t for t in call["transcript"] if t["turn_id"] != "greeting")
        # Whisper base hears this espeak voice's "weather" as "winner" now and then: ask for most words.
        assert word_overlap(turn["user"], QUESTION) >= 0.7, turn["user"]
        assert turn["agent_state"] == "committed" and turn["agent"] == done["text"]
        assert len(turn["agent"].split()) >= 3
        assert any(e["type"] == "latency" and e["response_s"] for _, e in caller.events)
        call_id = caller.call_id
    await asyncio.sleep(0.5)
    assert service.get_json(f"/api/calls/{call_id}")["state"] == "ended"
    assert all(c["id"] != call_id for c in service.get_json("/api/calls"))
    assert metric_value(service.metrics_text(), "parley_response_latency_seconds_count") > replies_before


async def test_bad_signaling_is_refused_while_another_call_goes_on(service: Service) -> None:
    async with Caller(service.base_url) as caller:
        await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        refused = [
            post(service, "/offer", b"{oops", "application/json"),
            post(
                service,
                "/offer",
                json.dumps({"sdp": "v=0\r\n", "type": "pranswer"}).encode(),
                "application/json",
            ),
            post(
                service,
                "/offer",
                json.dumps({"sdp": "v=0\r\ns=-\r\n", "type": "offer"}).encode(),
                "application/json",
            ),
            post(service, "/whip", b"v=0\r\nm=video 9 RTP/AVP 96\r\n", "application/sdp"),
            post(service, "/offer", b"x" * 200_000, "application/json"),
        ]
        assert [status for status, _ in refused] == [400, 400, 400, 400, 413]
        assert all(isinstance(body.get("error"), str) for _, body in refused)
        asked, spoken_end = await caller.say(espeak("how do i make a cup of tea"))
        await caller.wait_for_audio(after=spoken_end, timeout=20)
        said = await caller.wait_for_event("user_transcript", timeout=10, after=asked)
        assert "tea" in said["text"].lower()
    assert service.get_json("/healthz")["status"] == "ok"
