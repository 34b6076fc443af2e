"""Backchannels: what the backchannel check decides for each sound of the interruption corpus.

In this process, with the service's VAD, Whisper and judge, no call: each sound (espeak-ng, or the
synthetic cough) is heard wideband and over G.711 (8 kHz u-law, what SIP and carrier callers send), at
`--phases` offsets against the VAD's 32 ms chunks (where a chunk boundary falls changes what the check
is given). The check is asked as the turn-taker asks it (pipeline/turntaking.py): once
`backchannel_ask_ms` of silence follows the speech, on the audio since the speech began and the
preroll before it, and asked again when more speech follows; the last answer decides. A blip's silence
ends a stretch and later speech is a new one ("uh, | wait"): a sound cuts the agent when any stretch of
it does. Sounds with no stretch of `min_speech_ms` are blips (never checked), counted apart. A fast,
deterministic companion to `bench interruption`, whose live trials each see one phase.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parley.audio import PIPELINE_RATE, resample, ulaw_decode, ulaw_encode
from parley.bench import progress, settings_from_flags
from parley.bench.corpus import INTERRUPTIONS, NOT_INTERRUPTIONS, Sound
from parley.config import Settings
from parley.engines.stt import SttEngine
from parley.engines.vad import VadEngine
from parley.pipeline.backchannels import BackchannelJudge
from parley.pipeline.turntaking import NEGATIVE_THRESHOLD_GAP

NAME = "backchannels"
HELP = "the backchannel check's verdicts on the interruption corpus, wideband and over 8 kHz G.711"

CHUNK = 512  # the VAD's chunk at 16 kHz (32 ms)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phases", type=int, default=8, help="offsets of each sound within a chunk")


def over_the_phone(pcm: np.ndarray) -> np.ndarray:
    """What a G.711 (u-law) line leaves of 16 kHz speech, back at 16 kHz."""
    narrow = ulaw_decode(ulaw_encode(resample(pcm, PIPELINE_RATE, 8000)))
    return resample(narrow, 8000, PIPELINE_RATE)


@dataclass
class Stretch:
    """Speech over the agent up to a blip's silence: what the turn-taker decides on as one."""

    onset: int  # its first speech chunk
    speech_ms: float = 0.0
    silence_ms: float = 0.0
    checks: list[tuple[np.ndarray, float]] = field(default_factory=list)  # (audio, speech_ms) asked


def stretches_heard(audio: np.ndarray, vad: VadEngine, settings: Settings) -> list[Stretch]:
    """Each stretch of speech the turn-taker would decide on in this audio, with the backchannel checks it
    would ask for it: once `backchannel_ask_ms` of silence follows speech, on the preroll and all the
    stretch so far, again after more speech. A stretch ends at a blip's silence, or at
    `backchannel_max_ms` of speech (then it cuts the agent unasked)."""
    stream = vad.new_stream()
    chunk_ms = 1000 * CHUNK / PIPELINE_RATE
    negative = max(0.01, settings.vad_threshold - NEGATIVE_THRESHOLD_GAP)
    preroll = max(1, int(settings.preroll_ms / chunk_ms))
    stretches: list[Stretch] = []
    current: Stretch | None = None
    for index in range(0, audio.size // CHUNK):
        probability = stream.probability(audio[index * CHUNK : (index + 1) * CHUNK])
        if probability >= settings.vad_threshold:
            if current is None:
                current = Stretch(index)
                stretches.append(current)
            current.speech_ms += chunk_ms
            current.silence_ms = 0.0
        elif current is not None and probability < negative:
            current.silence_ms += chunk_ms
        if current is None:
            continue
        asked = current.checks[-1][1] if current.checks else 0.0
        if (
            settings.min_speech_ms <= current.speech_ms < settings.backchannel_max_ms
            and current.silence_ms >= settings.backchannel_ask_ms
            and current.speech_ms != asked
        ):
            start = max(0, current.onset - preroll) * CHUNK
            current.checks.append((audio[start : (index + 1) * CHUNK], current.speech_ms))
        if current.silence_ms >= settings.blip_silence_ms or current.speech_ms >= settings.backchannel_max_ms:
            current = None
    return stretches


def judge_sound(
    sound: Sound,
    pcm: np.ndarray,
    phase: int,
    vad: VadEngine,
    stt: SttEngine,
    judge: BackchannelJudge,
    settings: Settings,
) -> dict[str, Any]:
    """The outcome for one sound: "words" when any stretch of it cuts the agent, "backchannel" when each
    one lets it go on, "blip" when none is long enough to be checked."""
    lead = np.zeros(PIPELINE_RATE + phase, dtype=np.int16)
    audio = np.concatenate([lead, pcm, np.zeros(PIPELINE_RATE, dtype=np.int16)])
    row: dict[str, Any] = {
        "said": sound.label,
        "kind": sound.kind,
        "phase_ms": round(1000 * phase / PIPELINE_RATE),
        "heard": [],
    }
    outcomes = []
    for stretch in stretches_heard(audio, vad, settings):
        if stretch.speech_ms < settings.min_speech_ms:
            continue
        if not stretch.checks or stretch.speech_ms >= settings.backchannel_max_ms:
            outcomes.append("words")
            continue
        clip, speech_ms = stretch.checks[-1]  # the last answer decides; earlier ones are partial
        heard = stt.transcribe(clip, urgent=True)
        row["heard"].append(heard.text)
        outcomes.append("backchannel" if judge.judge(heard, speech_ms).backchannel else "words")
    outcome = "blip" if not outcomes else ("words" if "words" in outcomes else "backchannel")
    return {**row, "outcome": outcome}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from parley.engines.stt import load_stt
    from parley.engines.vad import load_vad

    settings = settings_from_flags(list(args.server_arg))
    vad, stt = load_vad(settings), load_stt(settings)
    judge = BackchannelJudge(settings.backchannels, settings.backchannel_min_logprob)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    try:
        for sound in (*INTERRUPTIONS, *NOT_INTERRUPTIONS):
            wide = sound.clip()
            for line, pcm in (("wideband", wide), ("g711", over_the_phone(wide))):
                for step in range(args.phases):
                    row = judge_sound(sound, pcm, step * CHUNK // args.phases, vad, stt, judge, settings)
                    row["line"] = line
                    rows.append(row)
                    heard = row.get("heard", "")
                    progress(f"{line} {sound.label!r} +{row['phase_ms']} ms: {row['outcome']} {heard}")
    finally:
        stt.close()
    return {"summary": summarise(rows, settings, time.perf_counter() - started), "checks": rows}


def summarise(rows: list[dict[str, Any]], settings: Settings, seconds: float) -> dict[str, Any]:
    summary: dict[str, Any] = {"asked after silence of (ms)": settings.backchannel_ask_ms}
    for line in ("wideband", "g711"):
        mine = [r for r in rows if r["line"] == line]
        stops = [r for r in mine if r["kind"] == "interruption" and r["outcome"] != "blip"]
        sounds = [r for r in mine if r["kind"] != "interruption" and r["outcome"] != "blip"]
        missed = [r for r in stops if r["outcome"] == "backchannel"]
        cut = [r for r in sounds if r["outcome"] != "backchannel"]
        summary[f"{line}: interruptions taken for a backchannel"] = f"{len(missed)}/{len(stops)}" + (
            f" ({', '.join(sorted({r['said'] for r in missed}))})" if missed else ""
        )
        summary[f"{line}: sounds taken for words"] = f"{len(cut)}/{len(sounds)}" + (
            f" ({', '.join(sorted({r['said'] for r in cut}))})" if cut else ""
        )
        summary[f"{line}: blips (never checked, excluded)"] = len(mine) - len(stops) - len(sounds)
    summary["seconds"] = round(seconds, 1)
    return summary
