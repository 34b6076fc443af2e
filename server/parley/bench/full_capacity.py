"""Full-pipeline capacity (`parley bench capacity --full`): callers that keep asking, level after level.

At each level N callers run in N separate processes (so the callers' own Opus work is not the
service's event loop's), each one call that asks a question every 8-12 s, starting at a random phase,
for `--seconds`. Measured per level, at the callers: end of question -> first reply audio (p50, p95),
wrong or missing replies (the transcript must hold the question's words, the reply must answer that
turn), and gaps in the received audio over 40 ms; at the service (its /proc entries): CPU and memory per
call. The capacity is the largest N whose p95 is within `--max-p95` with no wrong or missing reply.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from parley.bench import percentiles, progress
from parley.bench.common import QUESTIONS, word_overlap
from parley.bench.cpu import cpu_seconds, rss_mb
from parley.bench.service import Service
from parley.bench.speech import espeak, trim

GAP_S = 0.04  # received audio frames further apart than this are a gap the caller hears
FIRST_ASK_S = 8.0  # a caller's first question comes at a random moment within this
ANSWER_TIMEOUT_S = 20.0


def add_full_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--full", action="store_true", help="the whole pipeline: callers asking questions")
    parser.add_argument(
        "--levels", default="1,2,4,6", help="with --full: callers at each level (default 1,2,4,6)"
    )
    parser.add_argument("--max-p95", type=float, default=1.5, help="with --full: p95 a level may reach (s)")
    parser.add_argument("--seed", type=int, default=11, help="with --full: the callers' random phases")
    parser.add_argument(
        "--plots", default="", help="with --full: folder for the PNG plots (default: beside --json)"
    )


async def _ask_and_listen(
    url: str, index: int, clips: list[np.ndarray], seconds: float, seed: int
) -> dict[str, Any]:
    from parley.bench.caller import Caller

    rng = random.Random(seed * 1000 + index)
    rows: list[dict[str, Any]] = []
    async with Caller(url) as caller:
        await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
        started = time.monotonic()
        next_at = started + rng.uniform(0.0, FIRST_ASK_S)
        n = 0
        while next_at < started + seconds:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            question_no = (index + n * 3) % len(QUESTIONS)
            n += 1
            asked, spoken_end = await caller.say(clips[question_no])
            next_at = asked + rng.uniform(8.0, 12.0)
            row: dict[str, Any] = {"question": QUESTIONS[question_no], "asked_at": asked - started}
            try:
                heard_at = await caller.wait_for_audio(after=spoken_end, timeout=ANSWER_TIMEOUT_S)
                said = await caller.wait_for_event("user_transcript", timeout=5, after=asked)
                done = await caller.wait_for_event("agent_done", timeout=ANSWER_TIMEOUT_S, after=asked)
            except TimeoutError:
                row.update(missing=True, right=False)
                rows.append(row)
                continue
            overlap = word_overlap(said["text"], QUESTIONS[question_no])
            row.update(
                missing=False,
                response_s=round(heard_at - spoken_end, 4),
                transcript=said["text"],
                reply=done["text"],
                right=overlap >= 0.6 and bool(done["text"]) and done["turn_id"] == said["turn_id"],
            )
            rows.append(row)
        times = caller.heard.times
    deltas = np.diff(np.asarray(times)) if len(times) > 1 else np.zeros(0)
    return {
        "caller": index,
        "rows": rows,
        "gaps_over_40ms": int(np.sum(deltas > GAP_S)),
        "longest_gap_s": round(float(deltas.max()), 4) if deltas.size else 0.0,
    }


def _caller_process(
    url: str, index: int, clips: list[np.ndarray], seconds: float, seed: int, out: Any
) -> None:
    try:
        out.put(asyncio.run(_ask_and_listen(url, index, clips, seconds, seed)))
    except Exception as exc:  # reported as a caller with every question missing
        out.put({"caller": index, "rows": [], "error": repr(exc), "gaps_over_40ms": 0, "longest_gap_s": 0.0})


async def _reports(out: Any, callers: int, deadline: float) -> list[dict[str, Any]]:
    """Each caller's report; a caller that has sent none by the deadline counts as one whose every
    question went unanswered (a saturated service can leave a caller stuck), not as the bench's end."""
    results: list[dict[str, Any]] = []
    while len(results) < callers:
        try:
            results.append(await asyncio.to_thread(out.get, True, max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            break
    missing = callers - len(results)
    results += [
        {
            "caller": None,
            "rows": [],
            "error": "no report by the deadline",
            "gaps_over_40ms": 0,
            "longest_gap_s": 0.0,
        }
    ] * missing
    return results


async def _level(
    service: Service, callers: int, clips: list[np.ndarray], args: argparse.Namespace
) -> dict[str, Any]:
    assert service.process is not None
    pid = service.process.pid
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    processes = [
        context.Process(
            target=_caller_process, args=(service.base_url, i, clips, args.seconds, args.seed, out)
        )
        for i in range(callers)
    ]
    rss0 = rss_mb(pid)
    for process in processes:
        process.start()
    await asyncio.sleep(3.0)  # connected and greeted: the window measures the questions
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    results = await _reports(out, len(processes), deadline=time.monotonic() + args.seconds + 120)
    wall = time.monotonic() - wall0
    busy_core = (cpu_seconds(pid) - cpu0) / wall
    rss = rss_mb(pid)
    for process in processes:
        process.join(10)
        if process.is_alive():  # a caller stuck past the deadline: it reported nothing
            process.terminate()
            process.join(5)
    rows = [row for result in results for row in result["rows"]]
    latencies = [r["response_s"] for r in rows if not r["missing"]]
    wrong = sum(not r["right"] for r in rows)
    return {
        "callers": callers,
        "questions": len(rows),
        "response_s": percentiles(latencies),
        "wrong_or_missing": wrong,
        "errors": [r["error"] for r in results if "error" in r],
        "cpu_per_call_pct": round(100 * busy_core / callers, 1),
        "service_cpu_pct": round(100 * busy_core, 1),
        "memory_per_call_mb": round(max(0.0, rss - rss0) / callers, 1),
        "service_rss_mb": round(rss),
        "gaps_over_40ms": sum(r["gaps_over_40ms"] for r in results),
        "longest_gap_s": max((r["longest_gap_s"] for r in results), default=0.0),
        "latencies": latencies,
        "rows": rows,
    }


async def run_full(args: argparse.Namespace) -> dict[str, Any]:
    levels = sorted({int(n) for n in args.levels.split(",") if n.strip()})
    clips = [trim(espeak(q)) for q in QUESTIONS]
    server_args = ["--max-calls", str(max(levels) + 2), *args.server_arg]
    log_path = Path(args.server_log) if args.server_log else None
    results: list[dict[str, Any]] = []
    with Service(server_args, log_path=log_path) as service:
        await _warm_up(service.base_url, clips[0])
        for callers in levels:
            progress(f"level {callers}: {callers} callers for {args.seconds:.0f} s")
            level = await _level(service, callers, clips, args)
            results.append(level)
            progress(f"level {callers}: {_line(level)}")
    fit = [r["callers"] for r in results if _fits(r, args.max_p95)]
    summary: dict[str, Any] = {f"{r['callers']} callers": _line(r) for r in results}
    summary[f"capacity (p95 <= {args.max_p95:.2f} s, no wrong reply)"] = max(fit, default=0)
    plots = _plot(results, args)
    if plots:
        summary["plots"] = ", ".join(str(p) for p in plots)
    return {"summary": summary, "levels": results, "capacity": max(fit, default=0)}


async def _warm_up(url: str, clip: np.ndarray) -> None:
    """One question first: the engines' first-use allocations are not any level's memory per call."""
    from parley.bench.caller import Caller

    async with Caller(url) as caller:
        await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
        _, asked = await caller.say(clip)
        await caller.wait_for_event("agent_done", timeout=60, after=asked)


def _fits(level: dict[str, Any], max_p95: float) -> bool:
    p95 = level["response_s"]["p95"]
    return level["wrong_or_missing"] == 0 and not level["errors"] and p95 is not None and p95 <= max_p95


def _line(level: dict[str, Any]) -> str:
    r = level["response_s"]
    return (
        f"p50={r['p50']} p95={r['p95']} n={r['n']} wrong/missing={level['wrong_or_missing']} "
        f"cpu/call={level['cpu_per_call_pct']}% mem/call={level['memory_per_call_mb']}MB "
        f"gaps>40ms={level['gaps_over_40ms']} (longest {level['longest_gap_s']}s)"
    )


def _plot(results: list[dict[str, Any]], args: argparse.Namespace) -> list[Path]:
    from parley.bench.plots import plot_capacity

    folder = Path(args.plots) if args.plots else Path(args.json or "bench-capacity.json").resolve().parent
    return plot_capacity(results, folder)
