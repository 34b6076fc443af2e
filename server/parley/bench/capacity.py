"""Capacity: what a connected call costs in media + VAD (CPU) and in memory, beyond the shared models.

N callers connect and stream low-level noise (a line with nobody talking: Opus or G.711 decode,
resampling and the VAD run, no turns open), over WebRTC or SIP (`--transport`). The service's CPU
time and resident memory are read from /proc before and while they are connected, so this needs the
service it starts itself. The callers also count gaps over 40 ms in the audio they receive.

`--full` measures the whole pipeline instead: callers that keep asking questions (bench/full_capacity.py).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from parley.bench.common import QUESTIONS, add_transport_arguments, new_caller
from parley.bench.cpu import cpu_seconds, rss_mb
from parley.bench.full_capacity import GAP_S, add_full_arguments, run_full
from parley.bench.service import Service
from parley.bench.speech import espeak, trim

NAME = "capacity"
HELP = "media + VAD CPU per call and memory per call, with N callers connected"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--callers", type=int, default=10, help="calls connected at once (default 10)")
    parser.add_argument(
        "--seconds", type=float, default=None, help="measuring window (default 20; with --full 75 per level)"
    )
    add_transport_arguments(parser)
    add_full_arguments(parser)


def _gaps(times: list[float], since: float) -> tuple[int, float]:
    """Frames of received audio further apart than GAP_S, and the longest spacing, since `since`."""
    arrived = np.asarray([t for t in times if t >= since])
    if arrived.size < 2:
        return 0, 0.0
    deltas = np.diff(arrived)
    return int(np.sum(deltas > GAP_S)), round(float(deltas.max()), 4)


def line_noise(seconds: float, dbfs: float = -60.0, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(16000 * seconds)) * 32768 * 10 ** (dbfs / 20)).astype(np.int16)


async def _window(pid: int, seconds: float) -> tuple[float, float]:
    """(share of a core used, resident MB at the end) over a window of `seconds`."""
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0), rss_mb(pid)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.url:
        raise SystemExit("capacity reads the service's /proc entries: let it start its own service")
    if args.full:
        args.seconds = args.seconds or 75.0
        return await run_full(args)
    args.seconds = args.seconds or 20.0
    server_args = ["--greeting", "", "--max-calls", str(args.callers + 2), *args.server_arg]
    log_path = Path(args.server_log) if args.server_log else None
    with Service(server_args, log_path=log_path) as service:
        assert service.process is not None
        pid = service.process.pid
        async with new_caller(
            args, service.base_url, service
        ) as warm:  # the engines' first-use allocations, made once
            _, asked = await warm.say(trim(espeak(QUESTIONS[0])))
            await warm.wait_for_event("agent_done", timeout=60, after=asked)
        await asyncio.sleep(1.0)
        idle_core, idle_rss = await _window(pid, min(5.0, args.seconds))
        callers = [new_caller(args, service.base_url, service) for _ in range(args.callers)]
        for caller in callers:
            await caller.connect()
            caller.mic.play(line_noise(args.seconds + 30))
        await asyncio.sleep(2.0)
        window_start = time.monotonic()
        busy_core, busy_rss = await _window(pid, args.seconds)
        gaps = [_gaps(caller.heard.times, window_start) for caller in callers]
        dropped = service.metrics_text().count("parley_frames_dropped_total{")
        for caller in callers:
            await caller.hangup()
    per_call_core = max(1e-9, (busy_core - idle_core) / args.callers)
    per_call_mb = (busy_rss - idle_rss) / args.callers
    summary = {
        "transport": args.transport,
        "callers": args.callers,
        "service idle (% of a core)": round(100 * idle_core, 1),
        "media + VAD per call (% of a core)": round(100 * per_call_core, 2),
        "calls per core (media + VAD)": round(1 / per_call_core, 1),
        "memory per call (MB)": round(per_call_mb, 1),
        "service rss MB (idle -> with calls)": f"{idle_rss:.0f} -> {busy_rss:.0f}",
        "received audio gaps > 40 ms (all callers)": sum(g[0] for g in gaps),
        "longest gap (s)": max((g[1] for g in gaps), default=0.0),
    }
    return {"summary": summary, "dropped_series": dropped}
