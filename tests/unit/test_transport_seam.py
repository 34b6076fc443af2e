"""The transport seam: opening calls for any transport, and the clock non-WebRTC senders pace by."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from parley.call import Call
from parley.config import Settings
from parley.runtime import CallRefused, Runtime
from parley.transports.base import FrameClock, HangUp, open_call, send_paced
from tests.doubles import make_engines


class RecordingTransport:
    def __init__(self, call: Call, hang_up: HangUp) -> None:
        self.call = call
        self.hang_up = hang_up
        self.events: list[dict[str, Any]] = []
        self.closed = False

    def deliver_event(self, payload: dict[str, Any]) -> None:
        self.events.append(payload)

    def audio_flushed(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


async def connect(call: Call, hang_up: HangUp) -> RecordingTransport:
    return RecordingTransport(call, hang_up)


async def test_a_call_opens_on_any_transport_and_its_hang_up_ends_it() -> None:
    runtime = Runtime(Settings(greeting="Hello.", sip="off"), make_engines())
    call, transport = await open_call(runtime, "sip", 8000, connect)
    try:
        assert call.transport == "sip" and call.outbound.rate == 8000
        assert runtime.registry.get(call.call_id) is call
        deadline = time.monotonic() + 5
        while not any(e["type"] == "call" for e in transport.events):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        transport.hang_up("hangup")
        while runtime.registry.active():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert transport.closed and call.ended and call.end_reason == "hangup"
    finally:
        await runtime.close()


async def test_calls_beyond_capacity_are_refused_for_every_transport() -> None:
    runtime = Runtime(Settings(greeting="", max_calls=1, sip="off"), make_engines())
    try:
        await open_call(runtime, "sip", 8000, connect)
        with pytest.raises(CallRefused) as refused:
            await open_call(runtime, "twilio", 8000, connect)
        assert refused.value.reason == "capacity"
    finally:
        await runtime.close()


async def test_calls_are_refused_while_the_models_load() -> None:
    runtime = Runtime(Settings(sip="off"))
    with pytest.raises(CallRefused) as refused:
        await open_call(runtime, "sip", 8000, connect)
    assert refused.value.reason == "loading"


async def test_a_call_set_up_while_the_service_shuts_down_is_closed_not_started() -> None:
    runtime = Runtime(Settings(greeting="", sip="off"), make_engines())
    started = asyncio.Event()
    release = asyncio.Event()
    made: list[RecordingTransport] = []

    async def slow_connect(call: Call, hang_up: HangUp) -> RecordingTransport:
        started.set()
        await release.wait()
        made.append(RecordingTransport(call, hang_up))
        return made[-1]

    opening = asyncio.ensure_future(open_call(runtime, "sip", 8000, slow_connect))
    await started.wait()
    closing = asyncio.ensure_future(runtime.close())
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(CallRefused):
        await opening
    await closing
    assert made[0].closed and not runtime.registry.active()


def test_the_frame_clock_keeps_a_20_ms_schedule_without_drift() -> None:
    clock = FrameClock()
    assert clock.delay() == 0.0
    time.sleep(0.005)
    assert 0.01 < clock.delay() <= 0.015  # due 20 ms after the first frame, 5 ms have passed
    time.sleep(0.3)  # a stall longer than the lag the clock tolerates: a fresh schedule, no burst
    assert clock.delay() == 0.0
    assert 0.015 < clock.delay() <= 0.02


async def test_the_paced_sender_sends_one_frame_every_20_ms_and_survives_send_errors() -> None:
    sent: list[float] = []

    def send(frame: np.ndarray) -> None:
        sent.append(time.monotonic())
        if len(sent) == 3:
            raise OSError("network unreachable")

    task = asyncio.ensure_future(send_paced(lambda: np.zeros(160, dtype=np.int16), send))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 20 <= len(sent) <= 27
    span = sent[-1] - sent[0]
    assert abs(span - 0.02 * (len(sent) - 1)) < 0.03
