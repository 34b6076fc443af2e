"""Simultaneous callers: N callers ask different questions at the same moment.

Checks that every caller got its own question transcribed and a reply to it (not another caller's),
and reports each caller's response latency, plus the service's CPU use while the calls ran. The callers
run on the same machine as the service: over WebRTC (aiortc) they take a good share of a small CPU,
over SIP (`--transport sip`) far less, which shows more nearly what the service alone does.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from parley.bench import percentiles, progress
from parley.bench.common import QUESTIONS, add_transport_arguments, caller_for, service_for, word_overlap
from parley.bench.cpu import cpu_seconds, rss_mb
from parley.bench.response import DEAD_AIR_S
from parley.bench.service import Service, speculation_counts
from parley.bench.speech import espeak, trim

NAME = "calls"
HELP = "N simultaneous callers: right replies, latency, CPU per call"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--callers", type=int, default=3, help="simultaneous callers (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="questions each caller asks (default 2)")
    add_transport_arguments(parser)


async def _one_caller(
    args: argparse.Namespace,
    url: str,
    service: Service | None,
    index: int,
    rounds: int,
    together: asyncio.Barrier,
) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    async with caller_for(args, url, service) as caller:
        await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
        for round_no in range(rounds):
            question = QUESTIONS[(index + round_no * 3) % len(QUESTIONS)]
            clip = trim(espeak(question))
            await asyncio.wait_for(together.wait(), 90)  # every caller speaks at the same moment
            asked, spoken_end = await caller.say(clip)
            heard_at = await caller.wait_for_audio(after=spoken_end, timeout=30)
            said = await caller.wait_for_event("user_transcript", timeout=10, after=asked)
            done = await caller.wait_for_event("agent_done", timeout=60, after=asked)
            ended = await caller.wait_for_silence(after=time.monotonic(), hold_s=0.3, timeout=30)
            server = await caller.wait_for_event("latency", timeout=5, after=spoken_end)
            overlap = word_overlap(said["text"], question)
            results.append(
                {
                    "question": question,
                    "transcript": said["text"],
                    "transcript_overlap": round(overlap, 2),
                    "reply": done["text"],
                    "right_turn": done["turn_id"] == said["turn_id"],
                    "response_s": round(heard_at - spoken_end, 4),
                    # Dead air inside the reply: what a busy service costs a caller already listening.
                    "longest_pause_s": round(caller.longest_pause_between(heard_at, ended), 3),
                    "server": server,  # the service's own timeline of the reply
                }
            )
            progress(f"caller {index} round {round_no + 1}: reply after {heard_at - spoken_end:.3f} s")
            await caller.wait_for_silence(after=heard_at, hold_s=1.0, timeout=60)
        return {"caller": index, "call_id": caller.call_id, "rounds": results}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with service_for(args) as (url, service):
        results = await measure(url, args.callers, args.rounds, service, args.transport, args.sip_uri)
    results["summary"]["transport"] = args.transport
    return results


async def measure(
    url: str,
    callers: int,
    rounds: int,
    service: Service | None = None,
    transport: str = "webrtc",
    sip_uri: str = "",
) -> dict[str, Any]:
    """`service`: the one started here, if any, for its CPU use and (over SIP) its address."""
    args = argparse.Namespace(transport=transport, sip_uri=sip_uri)  # what `caller_for` reads
    pid = service.process.pid if service and service.process else None
    together = asyncio.Barrier(callers)
    cpu0, wall0 = (cpu_seconds(pid) if pid else 0.0), time.monotonic()
    per_caller = await asyncio.gather(
        *(_one_caller(args, url, service, i, rounds, together) for i in range(callers))
    )
    wall = time.monotonic() - wall0
    rows = [r for c in per_caller for r in c["rounds"]]
    right = [r for r in rows if r["transcript_overlap"] >= 0.6 and r["reply"] and r["right_turn"]]
    summary: dict[str, Any] = {
        "callers": callers,
        "replies right": f"{len(right)}/{len(rows)}",
        "response_s (caller)": percentiles([r["response_s"] for r in rows]),
        "longest pause inside a reply (s)": percentiles([r["longest_pause_s"] for r in rows]),
        f"replies with a pause over {DEAD_AIR_S} s": f"{sum(r['longest_pause_s'] > DEAD_AIR_S for r in rows)}"
        f"/{len(rows)}",
    }
    for stage in ("stt_s", "llm_first_token_s", "tts_first_audio_s"):
        summary[f"server {stage}"] = percentiles([r["server"][stage] for r in rows if r["server"].get(stage)])
    if service is not None:
        summary["speculative replies used / wasted"] = speculation_counts(service.metrics_text())
    if pid:
        summary["server cpu per call (% of a core)"] = round(
            100 * (cpu_seconds(pid) - cpu0) / wall / callers, 1
        )
        summary["server rss MB"] = round(rss_mb(pid))
    return {"summary": summary, "callers": per_caller, "ok": len(right) == len(rows)}
