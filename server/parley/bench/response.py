"""Response latency: from the end of the caller's question to the first reply audio at the caller.

One call; the caller waits for the greeting, then asks N questions (espeak-ng speech), one after the
other, each once the previous reply has finished. Also reports the longest pause inside each reply
(dead air while the model writes the next piece), the server's own per-stage timings and, when it
started the service itself, the service's CPU use per call and memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from parley.bench import percentiles, progress
from parley.bench.common import QUESTIONS, add_transport_arguments, caller_for, service_for, word_overlap
from parley.bench.cpu import cpu_seconds, rss_mb
from parley.bench.service import Service, speculation_counts
from parley.bench.speech import espeak, piper, trim

NAME = "response"
HELP = "end of the caller's speech -> first reply audio at the caller"
DEAD_AIR_S = 0.5  # a pause inside a reply longer than this sounds like the agent lost its thread


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=10, help="questions asked (default 10)")
    parser.add_argument("--label", default="", help="this run's name in the plot (default: its settings)")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="JSON",
        help="an earlier run's results to draw beside this one (repeatable)",
    )
    parser.add_argument(
        "--voice",
        choices=("espeak", "piper"),
        default="espeak",
        help="the caller's voice: espeak-ng (default) or Piper's packaged voice, whose intonation is nearer "
        "a person's (what an end-of-turn model hears)",
    )
    add_transport_arguments(parser)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with service_for(args) as (url, service):
        pid = service.process.pid if service and service.process else None
        results = await measure(args, url, service, args.trials, pid)
    voice = ["piper voice"] if args.voice == "piper" else []
    results["label"] = args.label or " ".join([args.transport, *voice, *args.server_arg]).strip()
    plot = _plot(args, results)
    if plot is not None:
        results["summary"]["plot"] = str(plot)
    return results


def _plot(args: argparse.Namespace, results: dict[str, Any]) -> Path | None:
    """The distribution of this run's response times (and of the runs to compare), as a PNG beside the
    JSON."""
    from parley.bench.plots import plot_latency_distribution

    series = {results["label"]: [t["response_s"] for t in results["trials"]]}
    for path in args.compare:
        earlier = json.loads(Path(path).read_text())
        series[earlier.get("label") or Path(path).stem] = [t["response_s"] for t in earlier["trials"]]
    out = Path(args.json or "bench-response.json").with_suffix(".png")
    return plot_latency_distribution(series, out, "End of question -> first reply audio")


async def measure(
    args: argparse.Namespace, url: str, service: Service | None, trials: int, server_pid: int | None = None
) -> dict[str, Any]:
    # Trimmed: the clock starts when the speech ends, not after the silence espeak-ng appends.
    speak = piper if getattr(args, "voice", "espeak") == "piper" else espeak
    clips = [trim(speak(QUESTIONS[i % len(QUESTIONS)])) for i in range(trials)]
    rows: list[dict[str, Any]] = []
    idle_rss = rss_mb(server_pid) if server_pid else None
    async with caller_for(args, url, service) as caller:
        await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        cpu_start, wall_start = (cpu_seconds(server_pid) if server_pid else 0.0), time.monotonic()
        for i, clip in enumerate(clips):
            await asyncio.sleep(0.5)
            _, spoken_end = await caller.say(clip)
            heard_at = await caller.wait_for_audio(after=spoken_end, timeout=20)
            # The reply ends when the service says so (after its last audio went out), so that a long
            # pause inside it is measured as one, not taken for its end.
            done = await caller.wait_for_event("agent_done", timeout=60, after=spoken_end)
            done_at = await caller.wait_for_silence(after=time.monotonic(), hold_s=0.3, timeout=30)
            server = await caller.wait_for_event("latency", timeout=5, after=spoken_end)
            pause = caller.longest_pause_between(heard_at, done_at)
            said = caller.latest_event("user_transcript", turn_id=done.get("turn_id"))
            progress(
                f"question {i + 1}/{len(clips)}: reply audio after {heard_at - spoken_end:.3f} s, "
                f"longest pause inside it {pause:.2f} s"
            )
            rows.append(
                {
                    "question": QUESTIONS[i % len(QUESTIONS)],
                    "response_s": round(heard_at - spoken_end, 4),
                    "reply_s": round(done_at - heard_at, 2),
                    "longest_pause_s": round(pause, 3),
                    # What was said tells runs apart: a reply whose first words were said before costs
                    # no synthesis (the phrase cache), and the history makes each call's replies differ.
                    "reply": done["text"],
                    "transcript": said["text"] if said else None,  # what the service heard asked
                    "server": server,
                }
            )
        wall = time.monotonic() - wall_start
        cpu = (cpu_seconds(server_pid) - cpu_start) if server_pid else None
        call_rss = rss_mb(server_pid) if server_pid else None
        setup_s = getattr(caller, "setup_s", None)  # a SIP caller's INVITE -> 200 OK
    latencies = [r["response_s"] for r in rows]
    stage = {
        key: percentiles([r["server"][key] for r in rows if r["server"].get(key) is not None])
        for key in ("stt_s", "llm_first_token_s", "tts_first_audio_s", "response_s")
    }
    pauses = [r["longest_pause_s"] for r in rows]
    # A reply can only be as right as what was heard: over G.711 espeak-ng's voice loses words to Whisper
    # (a reply to "what is my mother like in Paris" is the model's best, not a fault of the pipeline).
    verbatim = sum(
        r["transcript"] is not None and word_overlap(r["transcript"], r["question"]) == 1.0 for r in rows
    )
    summary: dict[str, Any] = {
        "response_s (caller)": percentiles(latencies),
        "longest pause inside a reply (s)": percentiles(pauses),
        f"replies with a pause over {DEAD_AIR_S} s": f"{sum(p > DEAD_AIR_S for p in pauses)}/{len(pauses)}",
        "questions heard word for word": f"{verbatim}/{len(rows)}",
    }
    summary.update({f"server {k}": v for k, v in stage.items()})
    if setup_s is not None:
        summary["call set-up: INVITE -> 200 OK (s)"] = round(setup_s, 4)
    if service is not None:
        summary["speculative replies used / wasted"] = speculation_counts(service.metrics_text())
    if cpu is not None:
        summary["server cpu per call (% of a core)"] = round(100 * cpu / wall, 1)
        summary["server rss MB (idle -> in call)"] = f"{idle_rss:.0f} -> {call_rss:.0f}"
    return {"summary": summary, "trials": rows}
