"""Backchannels: what the backchannel check decides for each sound of the interruption corpus.

In this process, with the service's VAD, Whisper and judge, no call: each sound (words in each of
`--voices`, espeak-ng's or Piper's, or the synthetic cough) is heard wideband and over G.711 (8 kHz
u-law, what SIP and carrier callers send), at `--phases` offsets against the VAD's 32 ms chunks (where a
chunk boundary falls changes what the check is given). The service's own turn-taker
(pipeline/turntaking.py) hears each sound over an agent that is talking, asks its checks where it would,
and gets each verdict as many chunks later as Whisper took; a sound cuts the agent when the turn-taker
cuts it at any point ("uh, | wait" may resume it, then cut it). Sounds it never checks are blips, counted
apart. A fast companion to `bench interruption`, whose live trials each see one phase.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from parley.audio import (
    PIPELINE_RATE,
    StreamResampler,
    resample,
    samples_per_frame,
    ulaw_decode,
    ulaw_encode,
)
from parley.bench import progress, settings_from_flags
from parley.bench.corpus import (
    ENGLISH_VOICES,
    INTERRUPTIONS,
    NOT_INTERRUPTIONS,
    PIPER_VOICE,
    Sound,
)
from parley.bench.speech import ESPEAK_VOICE
from parley.engines.stt import SttEngine
from parley.engines.vad import VadEngine
from parley.pipeline.backchannels import BackchannelJudge
from parley.pipeline.messages import BargeVerdict
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.pipeline.turntaking import TurnTaker
from parley.turn_settings import TurnSettings

NAME = "backchannels"
HELP = "the backchannel check's verdicts on the interruption corpus, wideband and over 8 kHz G.711"

CHUNK = 512  # the VAD's chunk at 16 kHz (32 ms)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phases", type=int, default=8, help="offsets of each sound within a chunk")
    parser.add_argument(
        "--voices",
        default=ESPEAK_VOICE,
        help=f"comma-separated espeak-ng voices the words are said in, '{PIPER_VOICE}' for Piper's, "
        f"or 'all' ({len(ENGLISH_VOICES)} English espeak-ng voices and Piper's); coughs and noise once",
    )


def voices_of(flag: str) -> list[str]:
    if flag.strip() == "all":
        return [*ENGLISH_VOICES, PIPER_VOICE]
    voices = [v.strip() for v in flag.split(",") if v.strip()]
    if not voices:
        raise ValueError("--voices names no voice")
    return voices


def over_the_phone(pcm: np.ndarray) -> np.ndarray:
    """What a G.711 (u-law) line leaves of 16 kHz speech, back at 16 kHz as the service hears it: in
    20 ms frames through the call's own resampler."""
    narrow = ulaw_decode(ulaw_encode(resample(pcm, PIPELINE_RATE, 8000)))
    inbound = StreamResampler(8000, PIPELINE_RATE)
    frame = samples_per_frame(8000)
    heard = [inbound.process(narrow[i : i + frame]) for i in range(0, narrow.size, frame)]
    return np.concatenate([*heard, inbound.process(narrow[:0], last=True)])


class TalkingAgent:
    """The call, as the turn-taker sees it, while the agent talks on: every backchannel check it asks is
    answered by the service's Whisper and judge, the verdict delivered as many chunks later as the
    transcription took (as the VAD queue would deliver it); what the turn-taker then decides is kept."""

    def __init__(self, stt: SttEngine, judge: BackchannelJudge) -> None:
        self.stt = stt
        self.judge = judge
        self.talking = True
        self.decisions: list[str] = []  # "resumed" / "cut", in order
        self.checks: list[tuple[np.ndarray, float]] = []  # (audio, speech_ms) asked
        self.heard: list[str] = []
        self.logprobs: list[float] = []  # how sure Whisper was of each (its mean token log-probability)
        self.command_odds: list[float] = []  # the odds it gave a command word ("stop") to open each
        self.due: list[tuple[float, BargeVerdict]] = []  # (when it is delivered, the verdict)
        self.now = 0.0

    def agent_active(self) -> bool:
        return self.talking

    def pause_agent(self) -> float:
        return self.now

    def resume_agent(self, heard: str) -> None:
        self.decisions.append("resumed")

    def interrupt_agent(self, onset_arrived_at: float) -> None:
        self.decisions.append("cut")
        self.talking = False

    def check_backchannel(self, request: int, audio: np.ndarray, speech_ms: float) -> None:
        heard = self.stt.transcribe(audio, urgent=True, weigh=self.judge.weigh)
        verdict = self.judge.judge(heard, speech_ms)
        self.checks.append((audio, speech_ms))
        self.heard.append(heard.text)
        self.logprobs.append(round(heard.avg_logprob, 2))
        self.command_odds.append(round(heard.odds_of(self.judge.weigh), 4))
        self.due.append(
            (self.now + heard.seconds, BargeVerdict(request, verdict.backchannel, verdict.reason, heard))
        )

    # once the agent is cut, the caller's words are a turn: nothing of it matters here
    def open_turn(self) -> str:
        return "turn"

    def user_started_speaking(self) -> None: ...
    def speech_paused(self, *args: Any, **kwargs: Any) -> None: ...
    def speech_resumed(self, turn_id: str, revision: int) -> None: ...
    def judge_turn_end(self, speech_end: float, audio: np.ndarray) -> None: ...
    def turn_ended(self, turn_id: str, revision: int, audio: np.ndarray, speech_end: float) -> None: ...
    def reopen_confirmed(self, turn_id: str, base: int, candidate: int) -> None: ...


def heard_over_the_agent(
    audio: np.ndarray, vad: VadEngine, agent: TalkingAgent, settings: TurnSettings
) -> None:
    """Play `audio` to the real turn-taker, chunk by chunk, while `agent` talks."""
    chunk_ms = 1000 * CHUNK / PIPELINE_RATE
    taker = TurnTaker(settings, SpeculativeTurnTracker(), agent, chunk_ms)
    stream = vad.new_stream()
    for index in range(audio.size // CHUNK):
        agent.now = (index + 1) * chunk_ms / 1000
        for verdict in [v for at, v in agent.due if at <= agent.now]:
            taker.verdict(verdict)
        agent.due = [(at, v) for at, v in agent.due if at > agent.now]
        chunk = audio[index * CHUNK : (index + 1) * CHUNK]
        taker.process(chunk, stream.probability(chunk), agent.now)


def judge_sound(
    sound: Sound,
    pcm: np.ndarray,
    phase: int,
    vad: VadEngine,
    stt: SttEngine,
    judge: BackchannelJudge,
    settings: TurnSettings,
) -> dict[str, Any]:
    """The outcome for one sound: "words" when it cuts the agent at any point, "backchannel" when the
    agent resumed after each check, "blip" when no check was asked."""
    lead = np.zeros(PIPELINE_RATE + phase, dtype=np.int16)
    audio = np.concatenate([lead, pcm, np.zeros(2 * PIPELINE_RATE, dtype=np.int16)])
    agent = TalkingAgent(stt, judge)
    heard_over_the_agent(audio, vad, agent, settings)
    cut = "cut" in agent.decisions
    outcome = "words" if cut else ("backchannel" if agent.checks else "blip")
    return {
        "said": sound.label,
        "kind": sound.kind,
        "phase_ms": round(1000 * phase / PIPELINE_RATE),
        "heard": agent.heard,
        "logprobs": agent.logprobs,
        "command_odds": agent.command_odds,
        "outcome": outcome,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from parley.engines.stt import load_stt
    from parley.engines.vad import load_vad

    settings = settings_from_flags(list(args.server_arg))
    vad, stt = load_vad(settings), load_stt(settings)
    judge = BackchannelJudge.for_settings(settings)
    started = time.perf_counter()
    voices = voices_of(args.voices)
    rows: list[dict[str, Any]] = []
    try:
        for voice in voices:
            for sound in (*INTERRUPTIONS, *NOT_INTERRUPTIONS):
                if not sound.spoken and voice != voices[0]:
                    continue  # a cough or a noise has no voice: heard once
                wide = sound.clip(voice=voice)
                for line, pcm in (("wideband", wide), ("g711", over_the_phone(wide))):
                    for step in range(args.phases):
                        phase = step * CHUNK // args.phases
                        row = judge_sound(sound, pcm, phase, vad, stt, judge, settings)
                        row.update(line=line, voice=voice if sound.spoken else "")
                        rows.append(row)
                        heard = row.get("heard", "")
                        progress(
                            f"{line} {voice} {sound.label!r} +{row['phase_ms']} ms: {row['outcome']} {heard}"
                        )
    finally:
        stt.close()
    summary = summarise(rows, settings, time.perf_counter() - started)
    return {"summary": {"voices": ",".join(voices), **summary}, "checks": rows}


def summarise(rows: list[dict[str, Any]], settings: TurnSettings, seconds: float) -> dict[str, Any]:
    summary: dict[str, Any] = {"asked after silence of (ms)": settings.backchannel_ask_ms}
    for line in ("wideband", "g711"):
        mine = [r for r in rows if r["line"] == line]
        stops = [r for r in mine if r["kind"] == "interruption" and r["outcome"] != "blip"]
        sounds = [r for r in mine if r["kind"] != "interruption" and r["outcome"] != "blip"]
        missed = [r for r in stops if r["outcome"] == "backchannel"]
        cut = [r for r in sounds if r["outcome"] != "backchannel"]
        summary[f"{line}: interruptions taken for a backchannel"] = f"{len(missed)}/{len(stops)}" + _which(
            missed
        )
        summary[f"{line}: sounds taken for words"] = f"{len(cut)}/{len(sounds)}" + _which(cut)
        summary[f"{line}: blips (never checked, excluded)"] = len(mine) - len(stops) - len(sounds)
    summary["seconds"] = round(seconds, 1)
    return summary


def _which(rows: list[dict[str, Any]]) -> str:
    """The sounds of `rows`, each with how many of its trials there are and in which voices."""
    if not rows:
        return ""
    trials: dict[str, list[str]] = {}
    for row in rows:
        trials.setdefault(row["said"], []).append(row.get("voice", ""))
    named = []
    for said, voices in sorted(trials.items()):
        distinct = sorted({v for v in voices if v})
        named.append(f"{said} x{len(voices)}" + (f" [{', '.join(distinct)}]" if len(distinct) > 1 else ""))
    return f" ({'; '.join(named)})"
