"""Noise: what `--denoise` buys on a noisy line: questions heard right, and noise that cuts the agent.

In this process, with the service's VAD, Whisper, turn-taker and backchannel check, no call. The
benchmarks' questions (bench/common.py), in each of `--voices` (espeak-ng's and the packaged Piper
voice), are mixed with street, babble and music noise (bench/noises.py says how each is made) at each
of `--snrs`, and sent down the line a SIP caller's audio takes (`--line g711`: 8 kHz u-law, back to
16 kHz through the call's own resampler) or a browser's (`wideband`). Each denoiser of `--denoise` then
runs as a call's denoise stage runs it (pipeline/denoise_stage.py: a stream per call, fed the 16 kHz
frames of 20 ms the call's inbox holds), and what comes out goes to the VAD stage's path: silero over
32 ms chunks and the service's turn-taker (pipeline/turntaking.py), whose turns Whisper transcribes as
the STT stage does. The same noisy audio goes to every denoiser, `off` included.

Two kinds of trial:
- a question: a second of noise, the question over the noise, two seconds of noise. Counted: the word
  error rate of what Whisper made of the turns (their words against the question's), the questions
  heard right (at most one word in five wrong), turns that ended while the noise went on (else the
  agent would not have answered; digital silence then lets the turn end, to read its words), and turns
  that began in the noise before the question (the agent would have answered the noise);
- a stretch of noise alone, heard while the agent talks: it cuts the agent when the turn-taker confirms
  a barge-in (the backchannel check asked on whatever speech the VAD heard, as in a call); it pauses it
  when a check was asked but the agent went on.
No trial is left out. The CPU cost is the process CPU time spent in each denoiser per second of audio.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parley.audio import PIPELINE_RATE, samples_per_frame
from parley.bench import progress, settings_from_flags
from parley.bench.backchannels import TalkingAgent, heard_over_the_agent, over_the_phone
from parley.bench.common import QUESTIONS
from parley.bench.noises import NOISES, alone, make, mixed, write
from parley.bench.speech import espeak, piper, trim
from parley.engines.denoise import Denoiser, load_denoiser
from parley.engines.stt import SttEngine
from parley.engines.vad import VadEngine
from parley.pipeline.backchannels import BackchannelJudge
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.pipeline.turntaking import TurnTaker
from parley.turn_settings import TurnSettings

NAME = "noise"
HELP = "questions and agent replies over street, babble and music noise, with and without --denoise"

CHUNK = 512  # the VAD's chunk at 16 kHz (32 ms)
FRAME = samples_per_frame(PIPELINE_RATE)  # what the call's inbox holds: 20 ms frames
LEAD_S = 1.0  # noise before a question
TAIL_S = 2.0  # noise after it, in which the turn should end
FLUSH_S = 2.0  # digital silence after that, in which a turn the noise kept open ends
STRETCH_S = 4.0  # a stretch of noise alone, over the agent's reply
RIGHT_WER = 0.2  # a question is heard right with at most this share of its words wrong


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--denoise", default="off,rnnoise,deepfilternet", help="denoisers compared (comma-separated)"
    )
    parser.add_argument("--noises", default=",".join(NOISES), help="noises mixed in (comma-separated)")
    parser.add_argument("--snrs", default="5,10,15", help="speech-to-noise ratios in dB (comma-separated)")
    parser.add_argument(
        "--questions", type=int, default=3, help=f"how many of the {len(QUESTIONS)} questions are asked"
    )
    parser.add_argument(
        "--voices", default="en-us,piper", help="espeak-ng voices and/or 'piper' saying the questions"
    )
    parser.add_argument(
        "--line",
        choices=("g711", "wideband"),
        default="g711",
        help="g711: a SIP or carrier caller's 8 kHz u-law (default); wideband: a browser's 16 kHz",
    )
    parser.add_argument(
        "--stretches",
        type=int,
        default=3,
        help="stretches of noise alone heard over the agent, per noise and SNR",
    )
    parser.add_argument("--keep-audio", default="", help="write each noisy question and stretch here (WAV)")


@dataclass
class Listener:
    """The call, as the turn-taker sees it while the agent is silent: the turns it takes, by id, with
    their latest audio (a reopened turn is heard again whole), and when each began."""

    now: float = 0.0
    turns: dict[str, np.ndarray] = field(default_factory=dict)
    opened_at: dict[str, float] = field(default_factory=dict)
    ended_at: list[float] = field(default_factory=list)

    def agent_active(self) -> bool:
        return False

    def open_turn(self) -> str:
        turn_id = f"t{len(self.opened_at) + 1}"
        self.opened_at[turn_id] = self.now
        return turn_id

    def turn_ended(self, turn_id: str, revision: int, audio: np.ndarray, speech_end: float) -> None:
        self.turns[turn_id] = audio
        self.ended_at.append(self.now)

    def pause_agent(self) -> float:
        return self.now

    def resume_agent(self, heard: str) -> None: ...
    def interrupt_agent(self, onset_arrived_at: float) -> None: ...
    def user_started_speaking(self) -> None: ...
    def speech_paused(self, *args: Any, **kwargs: Any) -> None: ...
    def speech_resumed(self, turn_id: str, revision: int) -> None: ...
    def judge_turn_end(self, speech_end: float, audio: np.ndarray) -> None: ...
    def reopen_confirmed(self, turn_id: str, base: int, candidate: int) -> None: ...
    def check_backchannel(self, request: int, audio: np.ndarray, speech_ms: float) -> None: ...


class Cleaner:
    """A denoiser as a call's denoise stage runs it: a fresh stream per trial (a call), fed 20 ms frames."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.denoiser: Denoiser | None = load_denoiser(name)
        self.cpu: dict[str, float] = {}

    def clean(self, pcm: np.ndarray) -> np.ndarray:
        if self.denoiser is None:
            return pcm
        stream = self.denoiser.new_stream()
        try:
            out = [stream.process(pcm[i : i + FRAME]) for i in range(0, pcm.size, FRAME)]
        finally:
            stream.close()
        return np.concatenate(out)

    def measure(self, pcm: np.ndarray, rounds: int = 3) -> None:
        """The process CPU time it takes, per second of `pcm` and to make a call's state (the least of
        `rounds`). Run before Whisper first works: its threads spin a while after each transcription,
        and the process's CPU time would count that."""
        if self.denoiser is None:
            self.cpu = {"s_per_audio_s": 0.0, "ms_per_20ms_frame": 0.0, "s_to_make_a_call's_state": 0.0}
            return
        making, cleaning = [], []
        for _ in range(rounds):
            started = time.process_time()
            stream = self.denoiser.new_stream()
            made = time.process_time()
            for i in range(0, pcm.size, FRAME):
                stream.process(pcm[i : i + FRAME])
            cleaning.append(time.process_time() - made)
            making.append(made - started)
            stream.close()
        per_s = min(cleaning) / (pcm.size / PIPELINE_RATE)
        self.cpu = {
            "s_per_audio_s": round(per_s, 4),
            "ms_per_20ms_frame": round(20 * per_s, 3),
            "s_to_make_a_call's_state": round(min(making), 3),
        }


def on_the_line(pcm: np.ndarray, line: str) -> np.ndarray:
    return over_the_phone(pcm) if line == "g711" else pcm


def listen(audio: np.ndarray, vad: VadEngine, settings: TurnSettings) -> tuple[Listener, float]:
    """Play `audio` then FLUSH_S of digital silence to the turn-taker of a silent agent; the listener,
    and when the silence began."""
    listener = Listener()
    chunk_ms = 1000 * CHUNK / PIPELINE_RATE
    taker = TurnTaker(settings, SpeculativeTurnTracker(), listener, chunk_ms)
    stream = vad.new_stream()
    played = np.concatenate([audio, np.zeros(int(FLUSH_S * PIPELINE_RATE), dtype=np.int16)])
    for index in range(played.size // CHUNK):
        listener.now = (index + 1) * chunk_ms / 1000
        chunk = played[index * CHUNK : (index + 1) * CHUNK]
        taker.process(chunk, stream.probability(chunk), listener.now)
    return listener, audio.size / PIPELINE_RATE


def ask(
    question: str, audio: np.ndarray, vad: VadEngine, stt: SttEngine, settings: TurnSettings
) -> dict[str, Any]:
    listener, silence_at = listen(audio, vad, settings)
    heard = " ".join(stt.transcribe(listener.turns[t]).text for t in sorted(listener.turns, key=_number))
    errors = word_errors(heard, question)
    return {
        "heard": heard.strip(),
        "word_errors": errors,
        "words": len(normalised(question)),
        "right": errors <= RIGHT_WER * len(normalised(question)),
        "ended": any(at <= silence_at for at in listener.ended_at),
        "turns": len(listener.opened_at),
        "noise_turn": any(at <= LEAD_S for at in listener.opened_at.values()),
    }


def over_the_agent(
    audio: np.ndarray, vad: VadEngine, stt: SttEngine, settings: TurnSettings
) -> dict[str, Any]:
    agent = TalkingAgent(stt, BackchannelJudge.for_settings(settings))
    heard_over_the_agent(audio, vad, agent, settings)
    cut = "cut" in agent.decisions
    return {"outcome": "cut" if cut else ("paused" if agent.checks else "untouched"), "heard": agent.heard}


def normalised(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(heard: str, said: str) -> int:
    """Substitutions, insertions and deletions between the words (edit distance): what a WER counts."""
    a, b = normalised(said), normalised(heard)
    row = list(range(len(b) + 1))
    for i, word in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, other in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != other))
    return row[-1]


def _number(turn_id: str) -> int:
    return int(turn_id[1:])


def _list(flag: str) -> list[str]:
    return [v.strip() for v in flag.split(",") if v.strip()]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from parley.engines.stt import load_stt
    from parley.engines.vad import load_vad

    settings = settings_from_flags(list(args.server_arg))
    names, noises, voices = _list(args.denoise), _list(args.noises), _list(args.voices)
    snrs = [float(s) for s in _list(args.snrs)]
    for noise in noises:
        if noise not in NOISES:
            raise SystemExit(f"--noises: {noise!r} is not one of {', '.join(NOISES)}")
    keep = Path(args.keep_audio) if args.keep_audio else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cleaners = [Cleaner(name) for name in names]
    vad, stt = load_vad(settings), load_stt(settings)
    lead, tail = int(LEAD_S * PIPELINE_RATE), int(TAIL_S * PIPELINE_RATE)
    # Made before any trial, so that synthesis never shares the cores with what is measured.
    questions = QUESTIONS[: args.questions]
    said = {
        (q, v): trim(piper(q, steady=True) if v == "piper" else espeak(q, voice=v))
        for q in questions
        for v in voices
    }
    made = {kind: make(kind) for kind in noises}
    sample = mixed(next(iter(said.values())), made[noises[0]] if noises else None, 10.0, 0, lead, tail)
    for cleaner in cleaners:
        cleaner.measure(on_the_line(np.resize(sample, 10 * PIPELINE_RATE), args.line))
    trials: list[dict[str, Any]] = []
    stretches: list[dict[str, Any]] = []
    try:
        for noise in ["clean", *noises]:
            for snr in [None] if noise == "clean" else snrs:
                for n, ((question, voice), speech) in enumerate(said.items()):
                    offset = int((n * 2.3 + (snr or 0)) * PIPELINE_RATE)  # another stretch of noise each
                    clip = mixed(speech, made.get(noise), snr or 0.0, offset, lead, tail)
                    line = on_the_line(clip, args.line)
                    if keep is not None:
                        write(keep / f"{noise}-{snr or 0:g}dB-{n}.wav", line)
                    for cleaner in cleaners:
                        row = ask(question, cleaner.clean(line), vad, stt, settings)
                        row.update(
                            noise=noise, snr_db=snr, voice=voice, question=question, denoise=cleaner.name
                        )
                        trials.append(row)
                        verdict = ("right" if row["right"] else "WRONG") + (
                            "" if row["ended"] else ", kept open"
                        )
                        progress(
                            f"{noise} {snr or '-'} dB {cleaner.name} {voice}: {verdict} {row['heard']!r}"
                        )
                if noise == "clean":
                    continue
                assert snr is not None
                for k in range(args.stretches):
                    offset = int(k * 3.7 * PIPELINE_RATE)
                    line = on_the_line(
                        alone(made[noise], int(STRETCH_S * PIPELINE_RATE), snr, offset), args.line
                    )
                    if keep is not None:
                        write(keep / f"{noise}-{snr:g}dB-alone-{k}.wav", line)
                    for cleaner in cleaners:
                        row = over_the_agent(cleaner.clean(line), vad, stt, settings)
                        row.update(noise=noise, snr_db=snr, stretch=k, denoise=cleaner.name)
                        stretches.append(row)
                        progress(f"{noise} {snr:g} dB alone {cleaner.name}: {row['outcome']} {row['heard']}")
    finally:
        stt.close()
    summary = summarise(trials, stretches, cleaners, args, time.perf_counter() - started)
    return {"summary": summary, "questions": trials, "stretches": stretches}


def summarise(
    trials: list[dict[str, Any]],
    stretches: list[dict[str, Any]],
    cleaners: list[Cleaner],
    args: argparse.Namespace,
    seconds: float,
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "line": "8 kHz G.711 u-law, through the call's resampler"
        if args.line == "g711"
        else "16 kHz wideband",
        "path": "denoise stream per 20 ms frame -> silero per 32 ms chunk -> turn-taker -> Whisper (and the "
        "backchannel check over the agent)",
        "trials excluded": 0,
    }
    for cleaner in cleaners:
        mine = [r for r in trials if r["denoise"] == cleaner.name]
        clean = [r for r in mine if r["noise"] == "clean"]
        noisy = [r for r in mine if r["noise"] != "clean"]
        cut = [r for r in stretches if r["denoise"] == cleaner.name]
        summary[f"{cleaner.name}: noisy questions"] = {
            "wer": _wer(noisy),
            "right": _count(noisy, "right"),
            "ended_in_noise": _count(noisy, "ended"),
            "noise_turns": _count(noisy, "noise_turn"),
        }
        summary[f"{cleaner.name}: noise over the agent"] = {
            "cut": f"{sum(r['outcome'] == 'cut' for r in cut)}/{len(cut)}",
            "paused": f"{sum(r['outcome'] == 'paused' for r in cut)}/{len(cut)}",
        }
        summary[f"{cleaner.name}: clean questions"] = {"wer": _wer(clean), "right": _count(clean, "right")}
        summary[f"{cleaner.name}: cpu"] = cleaner.cpu
    for noise in sorted({r["noise"] for r in trials} - {"clean"}):
        for snr in sorted({r["snr_db"] for r in trials if r["noise"] == noise}):
            for cleaner in cleaners:
                mine = [
                    r for r in trials if (r["noise"], r["snr_db"], r["denoise"]) == (noise, snr, cleaner.name)
                ]
                cut = [
                    r
                    for r in stretches
                    if (r["noise"], r["snr_db"], r["denoise"]) == (noise, snr, cleaner.name)
                ]
                summary[f"{noise} {snr:g} dB {cleaner.name}"] = {
                    "wer": _wer(mine),
                    "right": _count(mine, "right"),
                    "ended": _count(mine, "ended"),
                    "cut": f"{sum(r['outcome'] == 'cut' for r in cut)}/{len(cut)}",
                }
    summary["seconds"] = round(seconds, 1)
    return summary


def _wer(rows: list[dict[str, Any]]) -> float | None:
    words = sum(r["words"] for r in rows)
    return round(sum(r["word_errors"] for r in rows) / words, 3) if words else None


def _count(rows: list[dict[str, Any]], key: str) -> str:
    return f"{sum(bool(r[key]) for r in rows)}/{len(rows)}"
