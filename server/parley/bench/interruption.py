"""Interruption: how fast the agent stops when the caller talks over it, and whether blips cut it.

Barge-in trials: the caller asks for a story; while the reply plays it speaks over it. Measured at the
caller: from the onset of its speech to the moment the reply audio it receives falls silent.
Blip trials: while a reply plays, a 100-150 ms cough-like noise. A blip must never cut the reply for
good; the benchmark counts those that did and how long the reply paused.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import numpy as np

from parley.bench import percentiles, progress
from parley.bench.common import add_transport_arguments, caller_for, service_for
from parley.bench.listening import Ears
from parley.bench.speech import cough, espeak, join, silence_ms, trim

NAME = "interruption"
HELP = "caller speech onset -> reply silent at the caller; blips that cut replies"

STORY_PROMPTS = (
    "tell me a story about a brave little dragon",
    "tell me a story about a ship lost at sea",
    "describe a walk through a busy city market",
    "tell me a story about a robot who learns to paint",
)
INTERRUPTION = "sorry to stop you, can you tell me the time in london instead"
ONSET_DBFS = -40.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=20, help="barge-in trials (default 20)")
    parser.add_argument("--blips", type=int, default=20, help="blip trials (default 20)")
    parser.add_argument("--pauses", type=int, default=10, help="mid-sentence pause trials (default 10)")
    parser.add_argument("--pause-ms", type=int, default=400, help="the pause in those trials (default 400)")
    parser.add_argument("--seed", type=int, default=7)
    add_transport_arguments(parser)


def speech_onset_s(pcm: np.ndarray, rate: int = 16000) -> float:
    """Where speech starts in a clip (first 10 ms window above ONSET_DBFS)."""
    window = rate // 100
    for i in range(0, pcm.size - window, window):
        chunk = pcm[i : i + window].astype(np.float64)
        if 10 * np.log10(max(1e-12, float(np.mean(chunk * chunk))) / 32768.0**2) > ONSET_DBFS:
            return i / rate
    return 0.0


async def _reply_playing(caller: Ears, prompt: str) -> float:
    """Ask for a reply and return once its audio has been playing for a moment."""
    _, spoken_end = await caller.say(espeak(prompt))
    started = await caller.wait_for_audio(after=spoken_end, timeout=30)
    return started


async def _settle(caller: Ears) -> None:
    """Wait until the agent has been quiet for a while (its answer to the last turn included)."""
    await caller.wait_for_silence(after=time.monotonic(), hold_s=1.5, timeout=60)


async def barge_in_trial(
    caller: Ears, prompt: str, delay_s: float, clip: np.ndarray
) -> dict[str, Any] | None:
    started = await _reply_playing(caller, prompt)
    await asyncio.sleep(delay_s)
    playback = caller.mic.play(clip)
    onset = await playback.started + speech_onset_s(clip)
    await asyncio.sleep(0.05)  # the frames received up to the onset are in
    if caller.speech_seconds_between(onset - 0.1, onset) < 0.08:
        await playback.finished
        await _settle(caller)
        return None  # the reply was between words or over: nothing audible to interrupt
    silent_at = await caller.wait_for_silence(after=onset, hold_s=0.5, timeout=10)
    finished = await playback.finished
    done = await caller.wait_for_event("agent_done", timeout=30, after=started, interrupted=True)
    barge = await caller.wait_for_event("barge_in", timeout=5, after=started)
    await caller.wait_for_event("agent_done", timeout=60, after=finished)  # its answer to the interruption
    await _settle(caller)
    return {
        "stop_s": round(silent_at - onset, 4),
        "detect_s": round(barge["heard_at"] - onset, 4),  # caller onset -> the server has the deciding audio
        "server_stop_s": barge["stop_s"],  # -> outbound paused
        "deliver_s": round(silent_at - barge["paused_at"], 4),  # -> silence reaches the caller
        "heard": done["text"],
    }


async def blip_trial(caller: Ears, prompt: str, delay_s: float, noise: np.ndarray) -> dict[str, Any] | None:
    started = await _reply_playing(caller, prompt)
    await asyncio.sleep(delay_s)
    blip_start, _ = await caller.say(noise)
    if caller.speech_seconds_between(blip_start - 0.2, blip_start) < 0.06:
        await _settle(caller)
        return None
    done = await caller.wait_for_event("agent_done", timeout=60, after=started)
    await _settle(caller)
    gap = caller.gap_after(blip_start, 0.4)
    return {"cut": bool(done["interrupted"]), "pause_s": None if gap is None else round(gap, 3)}


PAUSED_QUESTIONS = (
    ("what is the weather like", "in paris today"),
    ("can you recommend a good book", "about the sea"),
    ("how far is it from london", "to madrid by train"),
)


async def pause_trial(caller: Ears, first: np.ndarray, rest: np.ndarray, pause_ms: int) -> dict[str, Any]:
    """A question with a pause in the middle: it must get one reply, to the whole question."""
    _, asked = await caller.say(join(first, silence_ms(pause_ms), rest, silence_ms(200)))
    done = await caller.wait_for_event("agent_done", timeout=60, after=asked)
    await _settle(caller)
    replies = [e for t, e in caller.events if t >= asked and e["type"] == "agent_done"]
    said = [e for t, e in caller.events if t >= asked and e["type"] == "user_transcript"]
    return {
        "replies": len(replies),
        "turns": len({e["turn_id"] for e in said}),
        "revision": max((e["revision"] for e in said if e["turn_id"] == done["turn_id"]), default=0),
        "heard_as": said[-1]["text"] if said else "",
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    clip = espeak(INTERRUPTION)
    stops: list[dict[str, Any]] = []
    blips: list[dict[str, Any]] = []
    pauses: list[dict[str, Any]] = []
    with service_for(args) as (url, service):
        async with caller_for(args, url, service) as caller:
            await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
            attempts = 0
            while len(stops) < args.trials and attempts < args.trials * 3:
                attempts += 1
                trial = await barge_in_trial(caller, rng.choice(STORY_PROMPTS), rng.uniform(0.3, 1.0), clip)
                if trial is not None:
                    stops.append(trial)
                    progress(f"barge-in {len(stops)}/{args.trials}: silent after {trial['stop_s']:.3f} s")
            attempts = 0
            while len(blips) < args.blips and attempts < args.blips * 3:
                attempts += 1
                noise = cough(rng.uniform(100, 150), seed=rng.randrange(1 << 30))
                trial = await blip_trial(caller, rng.choice(STORY_PROMPTS), rng.uniform(0.3, 1.0), noise)
                if trial is not None:
                    blips.append(trial)
                    progress(f"blip {len(blips)}/{args.blips}: cut={trial['cut']} pause {trial['pause_s']} s")
            for i in range(args.pauses):
                first, rest = PAUSED_QUESTIONS[i % len(PAUSED_QUESTIONS)]
                trial = await pause_trial(caller, trim(espeak(first)), trim(espeak(rest)), args.pause_ms)
                pauses.append(trial)
                progress(
                    f"pause {i + 1}/{args.pauses}: {trial['replies']} reply, heard {trial['heard_as']!r}"
                )
    cut = sum(1 for b in blips if b["cut"])
    one_reply = sum(1 for p in pauses if p["replies"] == 1 and p["turns"] == 1)
    summary = {
        "stop_s (onset -> silent, caller)": percentiles([s["stop_s"] for s in stops]),
        "  detect_s (onset -> deciding audio in)": percentiles([s["detect_s"] for s in stops]),
        "  server stop_s (audio in -> paused)": percentiles([s["server_stop_s"] for s in stops]),
        "  deliver_s (paused -> silent at caller)": percentiles([s["deliver_s"] for s in stops]),
        "blips that cut a reply": f"{cut}/{len(blips)}",
        "blip pause_s (reply resumed)": percentiles(
            [b["pause_s"] for b in blips if b["pause_s"] is not None]
        ),
        f"{args.pause_ms} ms pauses giving one reply": f"{one_reply}/{len(pauses)}",
        "of which reopened": sum(1 for p in pauses if p["revision"] >= 1),
    }
    return {
        "summary": summary,
        "barge_ins": stops,
        "blips": blips,
        "pauses": pauses,
        "ok": cut == 0 and one_reply == len(pauses),
    }
