"""A caller on a noisy line, over SIP: with `--denoise rnnoise` the question, said over street noise and
sent as G.711 RTP from a raw SIP peer, is still heard. The service runs in-process with the real VAD,
Whisper and RNNoise (the reply's LLM and TTS are doubles: only the hearing is under test)."""

from __future__ import annotations

import asyncio
import re
import struct
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from parley.audio import PIPELINE_RATE, resample, ulaw_encode
from parley.bench.common import word_overlap
from parley.bench.noises import mixed, street
from parley.bench.speech import espeak, trim
from parley.config import Settings
from parley.engines.denoise import Rnnoise
from parley.engines.stt import load_stt
from parley.engines.vad import SileroVad
from tests.doubles import make_engines
from tests.sip_app import SipApp, eventually
from tests.sip_wire import offer

QUESTION = "what is the capital city of japan"
SIP_RATE = 8000
FRAME = SIP_RATE // 50  # 20 ms


@pytest.fixture
async def agent() -> AsyncIterator[SipApp]:
    engines = make_engines(vad=SileroVad(), stt=load_stt(Settings(stt_workers=1)), denoiser=Rnnoise())
    app = await SipApp.start(engines=engines)
    try:
        yield app
    finally:
        await app.close()
        engines.close()
    assert not [t.name for t in threading.enumerate() if "denoise" in t.name]  # ended with the call


def sdp_port(body: bytes) -> int:
    match = re.search(rb"^m=audio (\d+) RTP/AVP", body, re.MULTILINE)
    assert match, body
    return int(match.group(1))


async def user_turns(app: SipApp, call_id: str) -> list[dict[str, Any]]:
    response = await app.client.get(f"/api/calls/{call_id}", headers=app.auth)
    details = await response.json()
    return [t for t in details["transcript"] if t["turn_id"] != "greeting" and t["user"]]


async def test_a_question_said_over_street_noise_is_heard_with_rnnoise(agent: SipApp) -> None:
    question = trim(espeak(QUESTION))
    lead, tail = PIPELINE_RATE, 2 * PIPELINE_RATE
    noisy = mixed(question, street(6.0), 10.0, 0, lead, tail)  # 10 dB under the speech
    line = np.frombuffer(ulaw_encode(resample(noisy, PIPELINE_RATE, SIP_RATE)), dtype=np.uint8)

    wire, rtp = await agent.wire(), await agent.rtp()
    d = agent.dialogue(wire)
    wire.send(d.invite(offer(rtp.port)))
    ok = await wire.response(200, call_id=d.call_id)
    d.learn(ok)
    wire.send(d.ack())
    call_id, their_port = ok.headers.get("X-Parley-Call-Id") or "", sdp_port(ok.body)

    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(line.size // FRAME):  # real time, as a phone sends it
        header = struct.pack("!BBHII", 0x80, 0, n & 0xFFFF, n * FRAME, 0x5EED)
        rtp.send(header + line[n * FRAME : (n + 1) * FRAME].tobytes(), their_port)
        await asyncio.sleep(max(0.0, started + (n + 1) * 0.02 - loop.time()))

    turns: list[dict[str, Any]] = []

    async def heard() -> bool:
        turns[:] = await user_turns(agent, call_id)
        return bool(turns)

    await eventually(heard, timeout=20.0, what="the caller's turn in the transcript")
    assert word_overlap(turns[0]["user"], QUESTION) >= 0.7, turns[0]["user"]
    assert await agent.counter("parley_stage_latency_seconds_count", stage="denoise") > 0  # it was cleaned
    wire.send(d.request("BYE"))
    await wire.final(method="BYE", call_id=d.call_id)
