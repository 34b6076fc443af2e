"""What recording calls costs: the taps on the media path, and the writer's CPU per call.

    .venv/bin/python scripts/recording_cost.py --calls 20 --seconds 30 --format ogg

Feeds `--calls` calls' worth of audio through the same taps and writer a live call uses (the caller's
16 kHz packets and the agent's 8 kHz frames pulled by a SIP leg, 20 ms each, speech-like noise in bursts
so the encoder has work), as fast as the writer takes it, into a temporary folder. Reports the time one
tap takes on the transport's thread, and the CPU the process spent per second of recorded call: the share
of a core one recorded call costs.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from parley.config import Settings
from parley.recording import Recordings

FRAME_S = 0.02


class Outbound:
    rate = 8000

    def __init__(self) -> None:
        self.listen = None

    def tap(self, listen) -> None:  # type: ignore[no-untyped-def]
        self.listen = listen


class Agent:
    record_audio = True
    recording_notice = ""


def talk(seconds: float, rate: int, rng: np.random.Generator, offset: float) -> np.ndarray:
    """Noise shaped like speech: 1.5 s bursts on, 1.5 s off, shifted by `offset` for the other side."""
    t = np.arange(int(seconds * rate)) / rate
    on = ((t + offset) % 3.0) < 1.5
    return (rng.normal(0, 3000, t.size) * on).astype(np.int16)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--format", choices=("ogg", "wav"), default="ogg")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    caller = talk(args.seconds, 16000, rng, 0.0)
    agent = talk(args.seconds, 8000, rng, 1.5)
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(record_audio=args.format, recordings_dir=folder)
        frames = int(args.seconds / FRAME_S)
        recordings = Recordings(
            settings, Path(folder), lambda call_id, value: None, queue_size=2 * frames * args.calls + 10
        )
        started_cpu, started = cpu_s(), time.perf_counter()
        tapped = 0.0
        made = []
        for number in range(args.calls):
            outbound = Outbound()
            recording = recordings.record(f"c-{number}", Agent(), outbound)  # type: ignore[arg-type]
            assert outbound.listen is not None
            for n in range(frames):
                t0 = time.perf_counter()
                recording.caller(caller[n * 320 : (n + 1) * 320])
                outbound.listen(agent[n * 160 : (n + 1) * 160])
                tapped += time.perf_counter() - t0
            recording.close()
            made.append(recording)
        while any(r.describe()["state"] not in ("saved", "failed", "dropped") for r in made):
            time.sleep(0.05)  # the writer catches up with audio fed faster than real time
        recordings.close()
        cpu, wall = cpu_s() - started_cpu, time.perf_counter() - started
        size = sum(p.stat().st_size for p in Path(folder).rglob(f"*.{args.format}"))
        files = len(list(Path(folder).rglob(f"*.{args.format}")))
    recorded_s = args.calls * args.seconds
    print(f"{files} of {args.calls} calls recorded, {recorded_s:.0f} s of calls in {wall:.1f} s")
    print(f"one tap on the media path: {1e6 * tapped / (2 * args.calls * frames):.1f} us")
    print(f"CPU per recorded call: {100 * cpu / recorded_s:.2f} % of a core (taps and writer)")
    print(f"file size: {size / recorded_s / 1000:.1f} KB a second of call")


if __name__ == "__main__":
    main()
