"""Idle callers over real transports, with engine doubles: a silent SIP caller (raw SIP and RTP peers) is
prompted twice, told goodbye and sent a BYE, the call recorded as `idle`; a silent carrier-stream caller
gets the same lines and its stream closed; a silent WebRTC caller (aiortc) is prompted. The prompts wait
`--idle-prompt-after-s` (short here) after the agent finished speaking."""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from typing import Any

import numpy as np
import pytest

from parley.app import RUNTIME
from parley.audio import ulaw_decode
from parley.bench.caller import Caller
from parley.config import Settings
from tests.robustness.test_defects import app_client
from tests.sip_app import SipApp
from tests.sip_wire import offer
from tests.unit.test_media_stream import client_for, no_calls, settings, streaming, wait_for_call

WAIT_S = 0.6
PROMPT = "Are you still there?"
CLOSING = "I'll hang up now. Goodbye."
LOUD = 2000  # the test TTS speaks at 8000; silence and comfort noise sit far below


def stretches(times: list[float], gap_s: float = 0.3) -> list[tuple[float, float]]:
    """Runs of loud frames (their arrival times), split where nothing loud came for `gap_s`."""
    runs: list[list[float]] = []
    for at in times:
        if runs and at - runs[-1][-1] <= gap_s:
            runs[-1].append(at)
        else:
            runs.append([at])
    return [(run[0], run[-1]) for run in runs]


def idle_lines(transcript: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(t["turn_id"], t["agent"], t["agent_state"]) for t in transcript if t["turn_id"] != "greeting"]


EXPECTED = [
    ("idle-1", PROMPT, "committed"),
    ("idle-2", PROMPT, "committed"),
    ("idle-3", CLOSING, "committed"),
]


async def test_a_silent_sip_caller_is_prompted_twice_then_told_goodbye_and_sent_a_bye() -> None:
    app = await SipApp.start(idle_prompt_after_s=WAIT_S)
    try:
        idle_before = await app.counter("parley_calls_total", transport="sip", outcome="idle")
        prompts_before = await app.counter("parley_idle_prompts_total", type="prompt")
        wire, rtp = await app.wire(), await app.rtp()
        d = app.dialogue(wire)
        wire.send(d.invite(offer(rtp.port)))
        ok = await wire.response(200, call_id=d.call_id)
        d.learn(ok)
        wire.send(d.ack())
        answered = time.monotonic()
        call_id = ok.headers.get("X-Parley-Call-Id") or ""

        bye = await wire.request("BYE", call_id=d.call_id, timeout=20)  # the wire answers it 200
        assert bye.from_tag == ok.to_tag
        loud = [at for data, _, at in rtp.packets if np.abs(ulaw_decode(data[12:])).max() > LOUD]
        heard = stretches(loud)
        assert len(heard) == 3, heard  # two prompts and the goodbye, nothing else
        # Each came after a silence of about the wait (the watchdog ticks twice a second).
        quiet = [heard[0][0] - answered] + [b[0] - a[1] for a, b in itertools.pairwise(heard)]
        assert all(WAIT_S - 0.1 <= q <= WAIT_S + 1.2 for q in quiet), quiet

        response = await app.client.get(f"/api/calls/{call_id}", headers=app.auth)
        details = await response.json()
        assert details["state"] == "ended" and details["ended_reason"] == "idle"
        assert idle_lines(details["transcript"]) == EXPECTED
        assert await app.counter("parley_calls_total", transport="sip", outcome="idle") == idle_before + 1
        assert await app.counter("parley_idle_prompts_total", type="prompt") == prompts_before + 2
    finally:
        await app.close()


@pytest.mark.slow  # the default suite has this part over another transport
async def test_a_silent_carrier_stream_caller_gets_the_same_lines_and_the_stream_is_closed() -> None:
    c = await client_for(settings(greeting="Hello there.", idle_prompt_after_s=WAIT_S))
    try:
        carrier = await streaming(c)
        carrier.echo = True  # the carrier plays what it is sent and says so at once
        await carrier.echo_marks()  # any that came before
        call = await wait_for_call(c)
        await asyncio.wait_for(carrier.finished, 20)  # the service closed the stream
        await no_calls(c)
        assert call.end_reason == "idle"
        assert idle_lines(call.details()["transcript"]) == EXPECTED
        audio = [
            (at, ulaw_decode(base64.b64decode(m["media"]["payload"])))
            for at, m in carrier.received
            if m["event"] == "media"
        ]
        loud = [at for at, pcm in audio if np.abs(pcm).max() > LOUD]
        assert len(stretches(loud)) == 4  # the greeting, two prompts, the goodbye
    finally:
        await c.close()


@pytest.mark.slow  # the default suite has this part over another transport
async def test_a_silent_webrtc_caller_is_prompted_once_the_greeting_was_heard() -> None:
    c = await app_client(
        Settings(sip="off", greeting="Hello.", ice_addresses=("127.0.0.1",), idle_prompt_after_s=WAIT_S)
    )
    try:
        async with Caller(str(c.make_url("")).rstrip("/")) as caller:
            greeted = await caller.wait_for_event("agent_done", timeout=10, turn_id="greeting")
            assert greeted["text"] == "Hello."
            silent_at = await caller.wait_for_silence(after=time.monotonic(), hold_s=0.2)
            prompted = await caller.wait_for_event("agent_text", timeout=10, turn_id="idle-1")
            assert prompted["text"] == PROMPT
            heard_at = await caller.wait_for_audio(after=silent_at + 0.2, timeout=5)
            assert heard_at - silent_at >= WAIT_S - 0.2  # the caller heard silence first, then the prompt
            call = c.app[RUNTIME].registry.get(caller.call_id)
            assert call is not None and not call.ended
    finally:
        await c.close()
