"""Faults: engines that raise or hang, an LLM endpoint that is down or slow, peers that vanish. None of
them touches another call; each is counted, logged with its call's id, and the caller hears a short
apology and can go on (or, when nothing works, the call ends cleanly)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from parley import metrics
from parley.bench.caller import Caller
from parley.bench.carrier import CarrierCaller
from parley.bench.service import metric_value
from parley.call import Call
from parley.config import Settings
from parley.engines.endpoint import OpenAiLlm
from parley.runtime import Runtime
from parley.transports.base import HangUp, open_call
from tests.doubles import (
    Fault,
    FaultyLlm,
    FaultyStt,
    FaultyTts,
    ScriptedLlm,
    ToneTts,
    loud,
    make_engines,
    quiet,
)
from tests.robustness.live import LiveService, LoopThread
from tests.robustness.test_defects import closed_port
from tests.unit.test_call import Line

APOLOGY = "Sorry, say that again."
QUESTION = np.concatenate([loud(700), quiet(700)])


def errors(engine: str) -> float:
    return metric_value(metrics.exposition().decode(), "parley_engine_errors_total", {"engine": engine})


class PulledLine(Line):
    """A transport for `open_call`: pulls the agent's audio at real pace (so replies play and commit)."""

    def __init__(self, call: Call, hang_up: HangUp) -> None:
        super().__init__(call)
        self.hang_up = hang_up
        self.closed = False
        self.start()

    async def close(self) -> None:
        self.closed = True
        self.stop()

    def said(self) -> list[str]:
        return [e["text"] for e in self.events if e["type"] == "agent_text"]


async def connect_line(call: Call, hang_up: HangUp) -> PulledLine:
    return PulledLine(call, hang_up)


def settings(**overrides: Any) -> Settings:
    options: dict[str, Any] = {
        "greeting": "",
        "sip": "off",
        "apology": APOLOGY,
        "engine_timeout_s": 0.5,
        "early_stt_ms": 0,  # one transcription per turn: the faults count turns
    }
    options.update(overrides)
    return Settings(**options)


async def in_thread(work: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(work)


async def test_an_stt_that_raises_costs_one_turn_and_an_apology_and_the_call_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fault = Fault("raise", when=lambda n: n == 1)
    runtime = Runtime(settings(), make_engines(stt=FaultyStt(fault), tts=ToneTts(0.05)))
    before = errors("stt")
    try:
        with caplog.at_level(logging.WARNING, logger="parley"):
            call, line = await open_call(runtime, "sip", 16000, connect_line)
            await in_thread(lambda: line.say(QUESTION))
            await in_thread(lambda: line.wait(lambda: APOLOGY in line.said()))
        assert errors("stt") == before + 1
        failed = next(r for r in caplog.records if r.getMessage() == "stage_failed")
        assert failed.call_id == call.call_id  # type: ignore[attr-defined]
        await in_thread(lambda: line.say(QUESTION))
        await in_thread(
            lambda: line.wait(lambda: line.event("agent_done", text=ScriptedLlm().reply) is not None)
        )
        assert not call.ended
    finally:
        await runtime.close()


async def test_a_hung_llm_times_out_into_an_apology_while_another_call_is_answered() -> None:
    fault = Fault("hang", when=lambda n: n == 1)
    runtime = Runtime(settings(), make_engines(llm=FaultyLlm(fault), tts=ToneTts(0.05)))
    before = errors("llm")
    try:
        stuck, stuck_line = await open_call(runtime, "sip", 16000, connect_line)
        other, other_line = await open_call(runtime, "sip", 16000, connect_line)
        await in_thread(lambda: stuck_line.say(QUESTION))
        await in_thread(lambda: stuck_line.wait(lambda: fault.struck == 1, timeout=5))
        started = time.monotonic()
        await in_thread(lambda: other_line.say(QUESTION))  # while the first call's model hangs
        await in_thread(lambda: other_line.wait(lambda: other_line.event("agent_done") is not None))
        assert time.monotonic() - started < 3.0
        await in_thread(lambda: stuck_line.wait(lambda: APOLOGY in stuck_line.said()))
        assert errors("llm") == before + 1 and APOLOGY not in other_line.said()
        await in_thread(lambda: stuck_line.say(QUESTION))  # the call goes on: the next turn is answered
        await in_thread(
            lambda: stuck_line.wait(
                lambda: len(stuck_line.said()) >= 2 and "weather" in " ".join(stuck_line.said())
            )
        )
        assert not stuck.ended and not other.ended
    finally:
        fault.release()
        await runtime.close()


async def test_a_hung_tts_costs_one_reply_and_the_next_one_plays() -> None:
    fault = Fault("hang", when=lambda n: n == 1)
    runtime = Runtime(settings(apology=""), make_engines(tts=FaultyTts(fault, seconds_per_word=0.05)))
    before = errors("tts")
    try:
        call, line = await open_call(runtime, "sip", 16000, connect_line)
        await in_thread(lambda: line.say(QUESTION))
        await in_thread(lambda: line.wait(lambda: errors("tts") >= before + 1, timeout=5))
        await in_thread(lambda: line.wait(lambda: bool(line.said())))  # the rest of the reply plays
        await in_thread(lambda: line.say(QUESTION))
        await in_thread(lambda: line.wait(lambda: sum(e["type"] == "agent_done" for e in line.events) >= 2))
        assert not call.ended
    finally:
        fault.release()
        await runtime.close()


async def test_a_call_whose_turns_keep_failing_ends_cleanly() -> None:
    runtime = Runtime(
        settings(max_engine_failures=2), make_engines(stt=FaultyStt(Fault("raise")), tts=ToneTts(0.05))
    )
    try:
        call, line = await open_call(runtime, "sip", 16000, connect_line)
        await in_thread(lambda: line.say(QUESTION))
        await in_thread(lambda: line.wait(lambda: APOLOGY in line.said()))
        await in_thread(lambda: line.wait(lambda: call.state == "listening"))
        await in_thread(lambda: line.say(QUESTION))
        await in_thread(lambda: line.wait(lambda: call.ended, timeout=5))
        assert call.end_reason == "engine_error" and line.closed and not runtime.registry.active()
    finally:
        await runtime.close()


class Stalling:
    """An OpenAI-compatible endpoint that accepts the request and then says nothing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.held.append(conn)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.mark.parametrize("endpoint", ["down", "slow"])
async def test_an_llm_endpoint_that_is_down_or_slow_costs_an_apology(endpoint: str) -> None:
    stalling = Stalling() if endpoint == "slow" else None
    url = stalling.url if stalling else f"http://127.0.0.1:{closed_port()}/v1"
    runtime = Runtime(settings(), make_engines(llm=OpenAiLlm(url, timeout=30), tts=ToneTts(0.05)))
    before = errors("llm")
    try:
        call, line = await open_call(runtime, "sip", 16000, connect_line)
        await in_thread(lambda: line.say(QUESTION))
        await in_thread(lambda: line.wait(lambda: APOLOGY in line.said(), timeout=5))
        assert errors("llm") == before + 1 and not call.ended
    finally:
        await runtime.close()
        if stalling:
            stalling.close()


def test_peers_that_vanish_end_their_own_calls_only() -> None:
    """A WebRTC peer whose machine stops (no close, nothing sent) and a carrier stream whose socket drops
    without `stop`: their calls end, counted; a call going on meanwhile is answered."""
    service = LiveService(
        Settings(greeting="", ice_addresses=("127.0.0.1",), media_timeout_s=1.0), sip="off"
    ).start()
    callers = LoopThread("callers")
    vanishing = LoopThread("vanishing")
    webrtc_before = metric_value(
        metrics.exposition().decode(), "parley_transport_errors_total", {"reason": "media_timeout"}
    )
    stream_before = metric_value(
        metrics.exposition().decode(), "parley_transport_errors_total", {"reason": "closed_without_stop"}
    )
    witness = CarrierCaller(service.base_url)
    gone_webrtc = Caller(service.base_url)
    gone_stream = CarrierCaller(service.base_url)
    try:
        callers.run(witness.connect())
        callers.run(gone_stream.connect())
        vanishing.run(gone_webrtc.connect())
        assert len(service.active_calls()) == 3
        time.sleep(0.5)  # the call is up and its audio flows
        vanishing.loop.call_soon_threadsafe(time.sleep, 4.0)  # its machine froze: nothing more is sent

        async def drop_socket() -> None:
            for task in gone_stream._tasks:
                task.cancel()
            assert gone_stream._ws is not None
            await gone_stream._ws.close()  # the TCP connection goes; no `stop` was sent

        callers.run(drop_socket())
        deadline = time.monotonic() + 5
        while len(service.active_calls()) > 1:
            assert time.monotonic() < deadline, [
                (c.call_id, c.transport) for c in service.runtime.registry.active()
            ]
            time.sleep(0.05)
        assert service.active_calls() == [witness.call_id]
        asked = callers.run(witness.say(QUESTION))[1]
        callers.run(witness.wait_for_event("agent_done", timeout=10, after=asked))
        text = metrics.exposition().decode()
        assert (
            metric_value(text, "parley_transport_errors_total", {"reason": "media_timeout"})
            == webrtc_before + 1
        )
        assert (
            metric_value(text, "parley_transport_errors_total", {"reason": "closed_without_stop"})
            == stream_before + 1
        )
    finally:
        with contextlib.suppress(Exception):
            callers.run(witness.hangup())
        with contextlib.suppress(Exception):
            callers.run(gone_stream.hangup())
        with contextlib.suppress(Exception):
            vanishing.run(gone_webrtc.hangup(), timeout=15)
        callers.close()
        vanishing.close()
        service.stop()
