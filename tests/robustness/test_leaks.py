"""No leaks: after 100 calls have come and gone over WebRTC, SIP and carrier streams, a third of them
hung up abruptly (a tab closed without DELETE, a SIP phone gone without BYE, a carrier socket dropped
without `stop`), the process is back near where it started: threads, file descriptors, memory, and no
peer connection, stream, RTP socket or stage thread of any call left alive.

The default suite runs it in-process with engine doubles; the slow version runs `parley serve` with the
real models and measures the service process from outside (/proc).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parley import metrics
from parley.bench.caller import Caller
from parley.bench.carrier import CarrierCaller
from parley.bench.listening import Ears
from parley.bench.service import Service, metric_value
from parley.bench.sip_caller import SipCaller
from parley.config import Settings
from parley.transports.media_stream import MediaStream
from parley.transports.sip.leg import SipLeg
from parley.transports.webrtc import WebRtcPeer
from tests.doubles import ToneTts, loud, make_engines, quiet
from tests.robustness.live import LiveService, LoopThread

PAGE = os.sysconf("SC_PAGE_SIZE")
QUESTION = np.concatenate([loud(500), quiet(450)])


@dataclass
class Usage:
    threads: int
    fds: int
    rss_mb: float

    @classmethod
    def of(cls, pid: int | str = "self") -> Usage:
        status = Path(f"/proc/{pid}/status").read_text()
        threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
        return cls(threads, len(os.listdir(f"/proc/{pid}/fd")), round(rss, 1))


def alive(kind: type) -> int:
    gc.collect()
    return sum(isinstance(o, kind) for o in gc.get_objects())


def caller_of(kind: str, service_url: str, sip_uri: str) -> Ears:
    if kind == "webrtc":
        return Caller(service_url)
    if kind == "sip":
        return SipCaller(service_url, sip_uri)
    return CarrierCaller(service_url)


async def one_call(kind: str, abrupt: bool, service_url: str, sip_uri: str) -> None:
    """Call, ask something, and hang up while the agent answers: politely, or by vanishing."""
    caller: Any = caller_of(kind, service_url, sip_uri)
    try:
        await caller.connect()
        await caller.say(QUESTION)
        await asyncio.sleep(0.3)
        if abrupt:
            await vanish(kind, caller)
    finally:
        await caller.hangup()


async def vanish(kind: str, caller: Any) -> None:
    if kind == "webrtc":
        caller.call_id = ""  # no DELETE: the tab is closed
    elif kind == "sip":
        caller.dialog = None  # no BYE: the phone is gone, its RTP stops
    else:
        for task in caller._tasks:
            task.cancel()
        await caller._ws.close()  # no `stop`


async def churn(calls: int, service_url: str, sip_uri: str, at_once: int) -> dict[str, int]:
    kinds = ["webrtc", "sip", "carrier", "carrier", "sip"]
    plan = [(kinds[n % len(kinds)], n % 3 == 2) for n in range(calls)]
    failures: list[BaseException] = []
    for start in range(0, calls, at_once):
        batch = plan[start : start + at_once]
        results = await asyncio.gather(
            *(one_call(kind, abrupt, service_url, sip_uri) for kind, abrupt in batch), return_exceptions=True
        )
        failures += [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures[:3]
    return {
        "calls": calls,
        "abrupt": sum(abrupt for _, abrupt in plan),
        **{kind: sum(k == kind for k, _ in plan) for kind in ("webrtc", "sip", "carrier")},
    }


EXECUTOR_THREADS = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor, per loop


def unpooled_threads() -> int:
    """Threads of this process but the event loops' executor pools (they grow once, then stay)."""
    return sum(not t.name.startswith("asyncio_") for t in threading.enumerate())


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


@pytest.mark.slow  # make test-all; fifty SIPp calls check that calls leave nothing behind in make test
def test_100_calls_come_and_go_and_leave_nothing_behind() -> None:
    # An idle executor thread of an earlier test's loop may linger a while (CI once counted 13 of 12).
    earlier = set(threading.enumerate())
    settings = Settings(
        greeting="Hi.", ice_addresses=("127.0.0.1",), rtp_timeout_s=1.0, setup_rate=0, max_calls=40
    )
    service = LiveService(settings, make_engines(tts=ToneTts(0.05))).start()
    callers = LoopThread("callers")
    sip_uri = f"sip:agent@127.0.0.1:{service.sip_port}"
    try:
        callers.run(churn(6, service.base_url, sip_uri, at_once=6), timeout=60)  # warm: imports, caches
        wait_until(lambda: not service.active_calls(), 10, "the warm-up calls ended")
        time.sleep(1.0)
        gc.collect()
        before, unpooled = Usage.of(), unpooled_threads()
        started = time.monotonic()
        plan = callers.run(churn(100, service.base_url, sip_uri, at_once=10), timeout=240)
        wait_until(lambda: not service.active_calls(), 15, "every call ended")
        wait_until(
            lambda: metric_value(metrics.exposition().decode(), "parley_call_threads") == 0, 10, "threads"
        )
        try:
            wait_until(lambda: unpooled_threads() <= unpooled + 2, 10, "threads back")
        except AssertionError:
            kinds = collections.Counter(t.name.split(":")[-1] for t in threading.enumerate())
            raise AssertionError(f"threads left: before {before}, now {Usage.of()}: {kinds}") from None
        gc.collect()
        after = Usage.of()
        print(f"\nleaks: {plan} in {time.monotonic() - started:.0f} s; before {before}, after {after}")
        # This test's two event loops' default executors keep up to EXECUTOR_THREADS threads each once
        # they grew.
        executors = [t for t in threading.enumerate() if t.name.startswith("asyncio_") and t not in earlier]
        assert len(executors) <= 2 * EXECUTOR_THREADS
        assert after.fds <= before.fds + 4
        assert after.rss_mb <= before.rss_mb + 40
        assert alive(WebRtcPeer) == 0 and alive(MediaStream) == 0
        assert all(not leg.call.threads_alive() for leg in gc.get_objects() if isinstance(leg, SipLeg))
        ended = service.runtime.registry
        assert len(ended._ended) == 106 and all(call.threads_alive() == 0 for call in ended._ended.values())
    finally:
        callers.close()
        service.stop()


@pytest.mark.slow
def test_100_real_calls_leave_the_service_where_it_started(tmp_path: Path) -> None:
    """The same churn against `parley serve` with the real models (~4 minutes on 2 cores)."""
    args = ["--rtp-timeout-s", "1", "--setup-rate", "0", "--max-calls", "24"]
    service = Service(args, log_path=tmp_path / "parley.log").start()
    callers = LoopThread("callers")
    pid = service.process.pid  # type: ignore[union-attr]
    try:
        callers.run(churn(6, service.base_url, service.sip_uri, at_once=3), timeout=120)
        wait_until(lambda: not service.get_json("/api/calls"), 30, "the warm-up calls ended")
        time.sleep(2.0)
        before = Usage.of(pid)
        started = time.monotonic()
        plan = callers.run(churn(100, service.base_url, service.sip_uri, at_once=4), timeout=900)
        wait_until(lambda: not service.get_json("/api/calls"), 60, "every call ended")
        wait_until(lambda: metric_value(service.metrics_text(), "parley_call_threads") == 0, 30, "threads")
        time.sleep(5.0)
        after = Usage.of(pid)
        print(
            f"\nleaks (real service): {plan} in {time.monotonic() - started:.0f} s; "
            f"before {before}, after {after}"
        )
        assert after.threads <= before.threads + 4
        assert after.fds <= before.fds + 4
        assert after.rss_mb <= before.rss_mb + 60
    finally:
        with contextlib.suppress(Exception):
            callers.close()
        assert service.stop() == 0
