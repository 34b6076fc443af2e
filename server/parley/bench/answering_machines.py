"""Answering-machine detection: who answered an outbound call, and how soon that is known.

In this process, with the service's VAD and Whisper, no call: each answer is fed, 20 ms at a time, to
the detector an outbound call runs (amd_listener.py, amd.py), as the call's answering stage feeds it.

The labelled set is made here, the same way on every run:
- people answering (`human`): a pick-up delay of 0.4-1.0 s, a short answer ("Hello?", "Hi, this is
  Dana.", "Dana speaking, who's calling?"), then the silence of someone waiting for the caller, and a
  second "Hello?" after 3 s of it, as a person says when nobody answers;
- voicemail greetings (`machine`): 0.2-0.6 s, a recorded-style greeting of 3-8 s, then after a gap of
  0.3-0.8 s a beep (a sine of 440-1400 Hz, mostly near 1 kHz, lasting 0.3-1.0 s, as machines sound
  it), then the silence of the recording; two greetings have no beep;
- phone menus (`ivr`): a menu's opening ("For sales, press one.") of 4-8 s, then silence.
Two sets of phrases: `tuned`, on which the rules were tuned, and `held-out`, written after that and never
tuned on (`--phrases`).
Each is spoken by several voices, round-robin: the packaged Piper voice (its prosody drawn anew each
run) and espeak-ng's English voices; then sent down a SIP caller's line (8 kHz u-law, back to 16 kHz
through the call's own resampler: bench/backchannels.py's `over_the_phone`).

Measured: the verdicts against the labels (accuracy, a confusion matrix), the time to the verdict in
seconds of audio since the answer, and as a call on this machine would see it (the audio arriving in
real time, the detector's Whisper and VAD work delaying what comes after it); for the voicemails, when
the message would start against the beep's end (never before it, nor inside the greeting).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from parley.amd import RESULTS
from parley.amd_listener import AmdListener
from parley.audio import PIPELINE_RATE, samples_per_frame
from parley.bench import percentiles, progress, settings_from_flags
from parley.bench.backchannels import over_the_phone
from parley.bench.corpus import PIPER_VOICE
from parley.bench.speech import espeak, piper, silence_ms, trim
from parley.engines.stt import SttEngine
from parley.engines.vad import VadEngine

NAME = "amd"
HELP = "answering-machine detection: verdicts and time to decision on people, voicemails and menus"

VOICES = (PIPER_VOICE, "en-us", "en-gb", "en-us+f3", "en-029", "en-gb-scotland", "en-us-nyc")
FRAME = samples_per_frame(PIPELINE_RATE)

HUMAN = (
    "Hello?",
    "Hi, this is Dana.",
    "Hello, Dana speaking.",
    "Yeah, hello?",
    "Good morning, this is Sam.",
    "Hello, who's calling?",
    "Dana Smith speaking, who's this?",
    "Yes?",
)
# (greeting, beep Hz or 0 for none)
MACHINE = (
    (
        "Hi, you've reached Dana. I can't take your call right now. Please leave a message after the tone.",
        1000,
    ),
    (
        "Hello, this is Sam. Sorry I missed your call. Leave your name and number and I'll get back to you.",
        1400,
    ),
    ("You have reached the voicemail of Alex Johnson. Please leave a message.", 1000),
    ("The person you are calling is not available. Please record your message after the tone.", 850),
    ("Hi, it's Chris. I'm away from my phone at the moment. Leave a message and I'll call you back.", 440),
    ("Hey, this is Jordan. I'm not around right now, so you know what to do.", 1000),
    ("Hello. You've reached five five five, zero one zero zero. Please leave a message.", 0),
    ("Thanks for calling. Nobody can come to the phone right now. Leave a message after the beep.", 0),
)
IVR = (
    "Thank you for calling Acme. For sales, press one. For support, press two.",
    "Welcome to First Bank. For account balances, press one. To speak to an agent, press zero.",
    "You have reached the city clinic. For appointments, press one. For prescriptions, press two.",
    "Thanks for calling. Please listen carefully, as our menu options have changed. For billing, press one.",
)

# Held out: written once the rules had been tuned on the phrases above, and never tuned on. Their share
# right is the fairer estimate of how the rules carry over to phrases nobody looked at.
HELD_OUT_HUMAN = (
    "Hello, this is Maria.",
    "Yeah?",
    "Hi there.",
    "Hello, Robert Chen speaking.",
    "This is Kim, hello?",
    "Good afternoon, how can I help you?",
)
HELD_OUT_MACHINE = (
    ("Hi, you've reached Maria Lopez. Leave me a message and I'll call you back as soon as I can.", 1000),
    (
        "Hello, you have reached the office of Doctor Patel. The office is now closed. "
        "Please leave your name and number after the tone.",
        1000,
    ),
    ("This is Robert. I can't answer right now. Please leave a message.", 950),
    (
        "Your call has been forwarded to an automated voice messaging system. "
        "The person you are trying to reach is not available.",
        1400,
    ),
    ("Hey, it's Kim! Leave a message!", 1000),
    ("Hi, this is Tom. I'm probably out on a job, so just tell me who you are and what you need.", 1000),
)
HELD_OUT_IVR = (
    "Thank you for calling Metro Energy. To report an outage, press one. For billing questions, press two.",
    "Hello and welcome to Sunrise Dental. If you know your party's extension, you may dial it at any time.",
    "You've reached customer service. Please say or enter your account number, followed by the pound sign.",
    "Welcome. For English, press one. Para espanol, oprima dos.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--voices", default=",".join(VOICES), help="voices, round-robin over the phrases (comma-separated)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="how many voices say each phrase")
    parser.add_argument(
        "--phrases", choices=("tuned", "held-out", "both"), default="both", help="which phrases are said"
    )


@dataclass(frozen=True)
class Sample:
    phrases: str  # tuned, held-out
    label: str  # human, machine, ivr
    text: str
    voice: str
    audio: np.ndarray  # 16 kHz, as the call hears it
    speech_end_s: float  # where the answer's (first) speech ends
    beep_s: tuple[float, float] | None = None  # the beep's start and end


def say(text: str, voice: str) -> np.ndarray:
    return trim(piper(text) if voice == PIPER_VOICE else espeak(text, voice=voice))


def beep(hz: float, seconds: float) -> np.ndarray:
    t = np.arange(int(PIPELINE_RATE * seconds)) / PIPELINE_RATE
    ramp = np.minimum(1.0, np.minimum(t, seconds - t) / 0.005)  # no click at either end
    return (np.sin(2 * np.pi * hz * t) * ramp * 9000).astype(np.int16)


def make_set(voices: list[str], repeats: int, phrases: str = "both") -> list[Sample]:
    """The labelled answers, each in `repeats` voices taken round-robin; the same set every run but for
    Piper's prosody."""
    sets = {"tuned": (HUMAN, MACHINE, IVR), "held-out": (HELD_OUT_HUMAN, HELD_OUT_MACHINE, HELD_OUT_IVR)}
    chosen = list(sets) if phrases == "both" else [phrases]
    return [sample for name in chosen for sample in _made(name, *sets[name], voices, repeats)]


def _made(
    name: str,
    human: tuple[str, ...],
    machine: tuple[tuple[str, int], ...],
    ivr: tuple[str, ...],
    voices: list[str],
    repeats: int,
) -> list[Sample]:
    rng = np.random.default_rng(44)
    turn = iter(range(1 << 30))
    samples: list[Sample] = []

    def voices_for() -> list[str]:
        return [voices[next(turn) % len(voices)] for _ in range(repeats)]

    for text in human:
        for voice in voices_for():
            lead = silence_ms(rng.uniform(400, 1000))
            speech = say(text, voice)
            again = say("Hello?", voice)
            audio = np.concatenate([lead, speech, silence_ms(3000), again, silence_ms(2500)])
            samples.append(
                Sample(name, "human", text, voice, audio, (lead.size + speech.size) / PIPELINE_RATE)
            )
    for text, hz in machine:
        for voice in voices_for():
            lead, speech = silence_ms(rng.uniform(200, 600)), say(text, voice)
            gap, length = silence_ms(rng.uniform(300, 800)), float(rng.uniform(0.3, 1.0))
            tone = beep(hz, length) if hz else np.zeros(0, np.int16)
            audio = np.concatenate([lead, speech, gap, tone, silence_ms(4000)])
            end = (lead.size + speech.size) / PIPELINE_RATE
            start = end + gap.size / PIPELINE_RATE
            samples.append(
                Sample(name, "machine", text, voice, audio, end, (start, start + length) if hz else None)
            )
    for text in ivr:
        for voice in voices_for():
            lead, speech = silence_ms(rng.uniform(200, 600)), say(text, voice)
            audio = np.concatenate([lead, speech, silence_ms(2500)])
            samples.append(Sample(name, "ivr", text, voice, audio, (lead.size + speech.size) / PIPELINE_RATE))
    return samples


def detect(sample: Sample, vad: VadEngine, stt: SttEngine) -> dict[str, Any]:
    """Feed one answer as a call's stage would; what it decided, when, and when a message would start."""
    words: list[str] = []
    listener = AmdListener(vad, stt, on_words=lambda text, upto_s: words.append(f"{upto_s:.2f} s: {text}"))
    heard = over_the_phone(sample.audio)
    live_done = 0.0  # when the detector has taken each frame, the audio arriving in real time
    decided_live: float | None = None
    message: tuple[str, float] | None = None
    for i in range(0, heard.size, FRAME):
        started = time.perf_counter()
        listener.hear(heard[i : i + FRAME])
        live_done = max(live_done, (i + FRAME) / PIPELINE_RATE) + time.perf_counter() - started
        verdict = listener.verdict
        if verdict is None:
            continue
        if decided_live is None:
            decided_live = live_done
        if verdict.result != "machine":
            break
        why = listener.message_due()
        if why is not None:
            message = (why, listener.now_s)
            break
    verdict = listener.verdict or listener.classifier.give_up(listener.now_s)
    row: dict[str, Any] = {
        "phrases": sample.phrases,
        "label": sample.label,
        "text": sample.text,
        "voice": sample.voice,
        "result": verdict.result,
        "reason": verdict.reason,
        "decided_s": verdict.decided_s,
        "decided_live_s": round(decided_live, 3) if decided_live is not None else None,
        "speech_end_s": round(sample.speech_end_s, 3),
        "stt_s": round(listener.stt_s, 3),
        "words": words,
    }
    if sample.beep_s is not None:
        row["beep_s"] = [round(sample.beep_s[0], 3), round(sample.beep_s[1], 3)]
        row["beep_heard_s"] = listener.classifier.beep_s
    if message is not None:
        row["message"] = {"reason": message[0], "at_s": round(message[1], 3)}
    return row


def summarise(rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    labels = ("human", "machine", "ivr")
    right = [r for r in rows if r["result"] == r["label"]]
    confusion = {
        label: dict(Counter(r["result"] for r in rows if r["label"] == label).most_common())
        for label in labels
    }
    summary: dict[str, Any] = {
        "samples": len(rows),
        "accuracy": f"{len(right)}/{len(rows)} = {len(right) / max(1, len(rows)):.2f}",
    }
    for name in ("tuned", "held-out"):
        mine = [r for r in rows if r["phrases"] == name]
        if mine:
            ok = [r for r in mine if r["result"] == r["label"]]
            wrong = sorted({f"{r['label']}->{r['result']} {r['text'][:40]!r}" for r in mine if r not in ok})
            share = f"{len(ok)}/{len(mine)} = {len(ok) / len(mine):.2f}"
            summary[f"accuracy, {name} phrases"] = share + (f" (wrong: {'; '.join(wrong)})" if wrong else "")
    for label in labels:
        row = {result: confusion[label].get(result, 0) for result in RESULTS}
        summary[f"answered by {label}: verdicts"] = row
    summary["time to verdict (s of audio)"] = percentiles([r["decided_s"] for r in rows])
    live = [r["decided_live_s"] for r in rows if r["decided_live_s"] is not None]
    summary["time to verdict (s, live on this machine)"] = percentiles(live)
    people = [
        r["decided_live_s"] - r["speech_end_s"]
        for r in rows
        if r["label"] == "human" and r["result"] == "human" and r["decided_live_s"] is not None
    ]
    summary["people: verdict after their answer ended (s, live)"] = percentiles(people)
    beeped = [r for r in rows if r["label"] == "machine" and "beep_s" in r and r["result"] == "machine"]
    after = [r for r in beeped if "message" in r and r["message"]["at_s"] >= r["beep_s"][1] - 0.05]
    summary["voicemails: message after the beep"] = f"{len(after)}/{len(beeped)}"
    delays = [r["message"]["at_s"] - r["beep_s"][1] for r in after]
    summary["voicemails: message start after the beep's end (s)"] = percentiles(delays)
    quiet = [r for r in rows if r["label"] == "machine" and "beep_s" not in r and r["result"] == "machine"]
    past = [r for r in quiet if "message" in r and r["message"]["at_s"] >= r["speech_end_s"]]
    summary["voicemails without a beep: message after the greeting"] = f"{len(past)}/{len(quiet)}"
    summary["whisper per answer (s)"] = percentiles([r["stt_s"] for r in rows])
    summary["seconds"] = round(seconds, 1)
    return summary


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from parley.engines.stt import load_stt
    from parley.engines.vad import load_vad

    settings = settings_from_flags(list(args.server_arg))
    vad, stt = load_vad(settings), load_stt(settings)
    voices = [v.strip() for v in args.voices.split(",") if v.strip()]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    try:
        samples = make_set(voices, args.repeats, args.phrases)
        progress(f"{len(samples)} answers made in {time.perf_counter() - started:.1f} s")
        for sample in samples:
            row = detect(sample, vad, stt)
            rows.append(row)
            mark = "ok " if row["result"] == row["label"] else "BAD"
            verdict = f"{row['result']:<7} {row['reason']:<13} at {row['decided_s']:5.2f} s"
            progress(
                f"{mark} {sample.label:<7} -> {verdict} (live {row['decided_live_s']}) "
                f"{sample.voice}: {sample.text[:50]!r}"
            )
    finally:
        close = getattr(stt, "close", None)
        if callable(close):
            close()
    summary = summarise(rows, time.perf_counter() - started)
    return {"summary": {"voices": ",".join(voices), **summary}, "answers": rows}
