"""Interruption: how fast the agent stops when the caller talks over it, and what does not stop it.

Barge-in trials: the caller asks for a story; while the reply plays it says something that must cut it
("wait", "no", "uh, wait", a question). Measured at the caller: from the onset of its speech to the
moment the reply audio it receives falls silent; a reply that went on is a missed interruption.
Sound trials: while a reply plays, a filler ("uh", "hmm"), an exclamation ("oh wow"), a backchannel, a
laugh, a voiced cough or a noise burst. None may cut the reply or become a turn. Each trial keeps its
evidence: whether the VAD fired (the agent paused), whether the reply resumed or was cut, and what
`parley_false_interruptions_total` and `parley_barge_ins_total` did meanwhile.
Pause trials: a question with a pause in the middle must get one reply, counted from the start of the
clip, to a reopened turn whose transcript has words from both halves.
Trials where the reply was not audible when the caller spoke are excluded, and counted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from typing import Any

import numpy as np

from parley.bench import percentiles, progress
from parley.bench.common import add_transport_arguments, caller_for, service_for, words
from parley.bench.corpus import (
    INTERRUPTIONS,
    NOT_INTERRUPTIONS,
    PAUSED_QUESTIONS,
    STORY_PROMPTS,
    UNFINISHED_PAUSED_QUESTIONS,
    Sound,
)
from parley.bench.listening import Ears
from parley.bench.service import metric_value, metrics_text, speculation_counts
from parley.bench.speech import espeak, join, silence_ms, trim

NAME = "interruption"
HELP = "caller speech onset -> reply silent at the caller; fillers, coughs and blips that cut replies"

ONSET_DBFS = -40.0
COUNTERS = {"false": "parley_false_interruptions_total", "barge": "parley_barge_ins_total"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=14, help="barge-in trials (default 14)")
    parser.add_argument(
        "--blips",
        type=int,
        default=len(NOT_INTERRUPTIONS),
        help=f"sound trials: fillers, exclamations, backchannels, coughs (default {len(NOT_INTERRUPTIONS)})",
    )
    parser.add_argument("--pauses", type=int, default=6, help="mid-sentence pause trials (default 6)")
    parser.add_argument("--pause-ms", type=int, default=400, help="the pause in those trials (default 400)")
    parser.add_argument(
        "--pause-after",
        choices=("phrase", "unfinished"),
        default="phrase",
        help="where those pauses fall: between two phrases (default), or after a word no sentence ends on "
        "('can you tell me the way to | the nearest station')",
    )
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


class Counters:
    """The service's barge-in counters, read from /metrics around each trial."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _read(self) -> dict[str, float]:
        text = metrics_text(self.url)
        return {key: metric_value(text, name) for key, name in COUNTERS.items()}

    async def read(self) -> dict[str, float]:
        return await asyncio.to_thread(self._read)

    def speculation(self) -> dict[str, str]:
        """Replies started at a pause over the whole run: used (the turn ended there), or wasted."""
        return {"speculative replies used / wasted (whole run)": speculation_counts(metrics_text(self.url))}


async def _reply_playing(caller: Ears, prompt: str) -> float:
    """Ask for a reply and return once its audio has been playing for a moment."""
    _, spoken_end = await caller.say(espeak(prompt))
    return await caller.wait_for_audio(after=spoken_end, timeout=30)


async def _settle(caller: Ears) -> None:
    """Wait until the agent has been quiet for a while (its answer to the last turn included)."""
    await caller.wait_for_silence(after=time.monotonic(), hold_s=1.5, timeout=60)


def _events(caller: Ears, kind: str, after: float) -> list[dict[str, Any]]:
    return [e for t, e in caller.events if t >= after and e.get("type") == kind]


async def barge_in_trial(
    caller: Ears, counters: Counters, prompt: str, delay_s: float, sound: Sound
) -> dict[str, Any] | None:
    clip = sound.clip()
    started = await _reply_playing(caller, prompt)
    before = await counters.read()
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
    done = await caller.wait_for_event("agent_done", timeout=60, after=started)
    trial: dict[str, Any] = {"said": sound.label, "cut": bool(done["interrupted"]), "heard": done["text"]}
    if trial["cut"]:
        barge = await caller.wait_for_event("barge_in", timeout=5, after=started)
        trial.update(
            stop_s=round(silent_at - onset, 4),
            detect_s=round(barge["heard_at"] - onset, 4),  # caller onset -> the server has the audio
            server_stop_s=barge["stop_s"],  # -> outbound paused
            deliver_s=round(silent_at - barge["paused_at"], 4),  # -> silence reaches the caller
        )
        try:  # its answer to the interruption
            await caller.wait_for_event("agent_done", timeout=60, after=finished)
        except TimeoutError:
            trial["answered"] = False
    await _settle(caller)
    after = await counters.read()
    said = _events(caller, "user_transcript", onset)
    trial["transcript"] = said[0]["text"] if said else ""
    if not trial["cut"]:  # what the backchannel check heard, that let the reply go on
        trial["verdict"] = [e.get("heard", "") for e in _events(caller, "agent_resumed", onset)]
    trial["barge_ins"] = after["barge"] - before["barge"]
    trial["false_interruptions"] = after["false"] - before["false"]
    return trial


async def sound_trial(
    caller: Ears, counters: Counters, prompt: str, delay_s: float, sound: Sound, seed: int
) -> dict[str, Any] | None:
    clip = sound.clip(seed)
    started = await _reply_playing(caller, prompt)
    before = await counters.read()
    await asyncio.sleep(delay_s)
    blip_start, _ = await caller.say(clip)
    onset = blip_start + speech_onset_s(clip)  # espeak-ng leads with silence
    if caller.speech_seconds_between(onset - 0.2, onset) < 0.06:
        await _settle(caller)
        return None
    done = await caller.wait_for_event("agent_done", timeout=60, after=started)
    done_at = next(t for t, e in caller.events if e is done)
    await _settle(caller)
    after = await counters.read()
    if done_at < onset + 0.2 and not done["interrupted"]:
        return None  # the reply had been sent in full: the caller heard its tail, the agent was done
    false_delta = after["false"] - before["false"]
    barge_delta = after["barge"] - before["barge"]
    paused = bool(_events(caller, "agent_paused", blip_start)) or false_delta > 0 or barge_delta > 0
    cut = bool(done["interrupted"]) or barge_delta > 0
    turns = _events(caller, "user_transcript", blip_start)
    gap = caller.gap_after(onset, 0.3)  # the pause begins when the VAD hears the sound
    return {
        "kind": sound.kind,
        "said": sound.label,
        "vad_fired": paused,
        "outcome": "cut" if cut else ("resumed" if paused else "vad silent"),
        "became_turn": [e["text"] for e in turns],
        "verdict": [e.get("heard", "") for e in _events(caller, "agent_resumed", blip_start)],
        "false_interruptions": false_delta,
        "barge_ins": barge_delta,
        "pause_s": None if gap is None else round(gap, 3),
    }


async def pause_trial(caller: Ears, question: tuple[str, str, str, str], pause_ms: int) -> dict[str, Any]:
    """A question with a pause in the middle: one reply, to the whole question, from the clip's start."""
    first, rest, first_word, rest_word = question
    clip = join(trim(espeak(first)), silence_ms(pause_ms), trim(espeak(rest)), silence_ms(200))
    started, asked = await caller.say(clip)
    done = await caller.wait_for_event("agent_done", timeout=60, after=asked)
    await _settle(caller)
    replies = _events(caller, "agent_done", started)
    said = [e for e in _events(caller, "user_transcript", started) if e["turn_id"] == done["turn_id"]]
    last: dict[str, Any] = said[-1] if said else {"revision": 0, "text": ""}
    whole = {first_word, rest_word} <= words(last["text"])
    # Agent speech while the question was still being asked: a reply to its first half (a superseded
    # revision, or a speculative reply the pause started) that reached the caller.
    early = caller.speech_seconds_between(started, asked)
    return {
        "replies": len(replies),
        "revision": last["revision"],
        "heard_as": last["text"],
        "agent_speech_during_question_s": round(early, 2),
        # Turn-taking right: one reply, to the reopened turn, nothing heard before the question ended.
        "one_reply_to_reopened_turn": len(replies) == 1 and last["revision"] >= 1 and early == 0,
        "both_halves_heard": whole,  # and the transcript has a word of each half (Whisper's part)
        "one_reply_to_whole": len(replies) == 1 and last["revision"] >= 1 and whole and early == 0,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    stops: list[dict[str, Any]] = []
    sounds: list[dict[str, Any]] = []
    pauses: list[dict[str, Any]] = []
    excluded: Counter[str] = Counter()
    with service_for(args) as (url, service):
        counters = Counters(url)
        async with caller_for(args, url, service) as caller:
            await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
            for i in range(args.trials):
                sound = INTERRUPTIONS[i % len(INTERRUPTIONS)]
                for _ in range(3):
                    prompt, delay = rng.choice(STORY_PROMPTS), rng.uniform(0.3, 1.0)
                    trial = await barge_in_trial(caller, counters, prompt, delay, sound)
                    if trial is not None:
                        break
                    excluded["interruptions"] += 1
                if trial is None:
                    continue
                stops.append(trial)
                progress(f"barge-in {i + 1}/{args.trials} {sound.label!r}: cut={trial['cut']} {trial}")
            for i in range(args.blips):
                sound = NOT_INTERRUPTIONS[i % len(NOT_INTERRUPTIONS)]
                for _ in range(3):
                    prompt, delay = rng.choice(STORY_PROMPTS), rng.uniform(0.3, 1.0)
                    result = await sound_trial(caller, counters, prompt, delay, sound, rng.randrange(1 << 20))
                    if result is not None:
                        break
                    excluded["sounds"] += 1
                if result is None:
                    continue
                sounds.append(result)
                progress(f"sound {i + 1}/{args.blips} {sound.label!r}: {result['outcome']} {result}")
            paused = UNFINISHED_PAUSED_QUESTIONS if args.pause_after == "unfinished" else PAUSED_QUESTIONS
            for i in range(args.pauses):
                pause = await pause_trial(caller, paused[i % len(paused)], args.pause_ms)
                pauses.append(pause)
                progress(f"pause {i + 1}/{args.pauses}: {pause}")
        speculation = await asyncio.to_thread(counters.speculation)
    return {
        "summary": {**summarise(stops, sounds, pauses, excluded, _pause_label(args)), **speculation},
        **_details(stops, sounds, pauses),
        "ok": _ok(stops, sounds, pauses),
    }


def _details(
    stops: list[dict[str, Any]], sounds: list[dict[str, Any]], pauses: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"barge_ins": stops, "sounds": sounds, "pauses": pauses}


def _ok(stops: list[dict[str, Any]], sounds: list[dict[str, Any]], pauses: list[dict[str, Any]]) -> bool:
    return (
        all(s["cut"] for s in stops)
        and not any(s["outcome"] == "cut" or s["became_turn"] for s in sounds)
        and all(p["one_reply_to_whole"] for p in pauses)
    )


def summarise(
    stops: list[dict[str, Any]],
    sounds: list[dict[str, Any]],
    pauses: list[dict[str, Any]],
    excluded: Counter[str],
    pause_label: str,
) -> dict[str, Any]:
    cut_stops = [s for s in stops if s["cut"]]
    fired = [s for s in sounds if s["vad_fired"]]
    by_kind: dict[str, str] = {}
    for kind in dict.fromkeys(s["kind"] for s in sounds):
        of_kind = [s for s in sounds if s["kind"] == kind]
        cut = sum(s["outcome"] == "cut" for s in of_kind)
        heard = sum(s["vad_fired"] for s in of_kind)
        by_kind[kind] = f"{cut} cut / {heard} heard by VAD / {len(of_kind)}"
    resumed = sum(s["outcome"] == "resumed" for s in sounds)
    whole = sum(p["one_reply_to_whole"] for p in pauses)
    return {
        "real interruptions missed (reply went on)": f"{len(stops) - len(cut_stops)}/{len(stops)}",
        "stop_s (onset -> silent, caller)": percentiles([s["stop_s"] for s in cut_stops]),
        "  detect_s (onset -> deciding audio in)": percentiles([s["detect_s"] for s in cut_stops]),
        "  server stop_s (audio in -> paused)": percentiles([s["server_stop_s"] for s in cut_stops]),
        "  deliver_s (paused -> silent at caller)": percentiles([s["deliver_s"] for s in cut_stops]),
        "sounds that cut a reply (of those the VAD heard)": f"{sum(s['outcome'] == 'cut' for s in fired)}"
        f"/{len(fired)}",
        "sounds that became a user turn": sum(bool(s["became_turn"]) for s in sounds),
        "sounds by kind": by_kind,
        "sounds the VAD did not hear (exercise nothing)": len(sounds) - len(fired),
        "paused and resumed / false_interruptions_total rose by": f"{resumed} / "
        f"{sum(s['false_interruptions'] for s in sounds):.0f}",
        "resume pause_s (caller)": percentiles(
            [s["pause_s"] for s in sounds if s["outcome"] == "resumed" and s["pause_s"] is not None]
        ),
        f"{pause_label}: one reply to the whole question": f"{whole}/{len(pauses)}",
        "  one reply, to the reopened turn": f"{sum(p['one_reply_to_reopened_turn'] for p in pauses)}"
        f"/{len(pauses)}",
        "  a word of each half in its transcript": f"{sum(p['both_halves_heard'] for p in pauses)}"
        f"/{len(pauses)}",
        "  replies heard for the question's first half (superseded)": sum(
            p["agent_speech_during_question_s"] > 0 for p in pauses
        ),
        "excluded (reply not audible when the caller spoke)": dict(excluded) or 0,
    }


def _pause_label(args: argparse.Namespace) -> str:
    where = " after an unfinished phrase" if args.pause_after == "unfinished" else ""
    return f"{args.pause_ms} ms pauses{where}"
