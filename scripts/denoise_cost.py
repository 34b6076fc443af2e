"""What each `--denoise` engine costs a call: CPU per 20 ms frame, making and keeping its state, delay.

    .venv/bin/python scripts/denoise_cost.py --seconds 10

Feeds `--seconds` of noise through one stream of each denoiser, 20 ms frames of 16 kHz audio as a
call's denoise stage does (the resampling to 48 kHz and back included), on this thread alone, and
reports: its CPU time per frame (the process's, which equals this thread's: the models run no threads of
their own), the resampling's share of it, the CPU time and memory it takes to make a call's state (the
mean of five), and how much later the caller's speech comes out (cross-correlation of a spoken phrase
with what is left of it).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from parley.audio import PIPELINE_RATE, Downsampler, Upsampler
from parley.bench.cpu import rss_mb
from parley.bench.speech import espeak, trim
from parley.engines.denoise import DeepFilterNet, Denoiser, DenoiseStream, Rnnoise

FRAME = PIPELINE_RATE // 50


def per_frame_ms(frames: list[np.ndarray], process: object) -> float:
    assert callable(process)
    started = time.process_time()
    for frame in frames:
        process(frame)
    return 1000 * (time.process_time() - started) / len(frames)


def delay_ms(stream: DenoiseStream) -> float:
    speech = trim(espeak("can you recommend a good book to read"))
    pad = np.zeros(PIPELINE_RATE // 2, dtype=np.int16)
    said = np.concatenate([pad, speech, pad])
    heard = np.concatenate([stream.process(said[i : i + FRAME]) for i in range(0, said.size, FRAME)])
    match = np.correlate(heard.astype(np.float64), said.astype(np.float64), "full")
    return 1000 * (int(np.argmax(match)) - (said.size - 1)) / PIPELINE_RATE


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="audio fed through each stream")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(int(args.seconds * PIPELINE_RATE)) * 2000).astype(np.int16)
    frames = [noise[i : i + FRAME] for i in range(0, noise.size, FRAME)]
    up, down = Upsampler(3), Downsampler(3)
    print(
        f"resampling 16 -> 48 -> 16 kHz: {per_frame_ms(frames, lambda f: down.process(up.process(f))):.3f} ms"
    )
    denoisers: list[Denoiser] = [Rnnoise(), DeepFilterNet()]
    for denoiser in denoisers:
        before, started = rss_mb(os.getpid()), time.process_time()
        streams = [denoiser.new_stream() for _ in range(5)]
        made_s = (time.process_time() - started) / len(streams)
        kept_mb = (rss_mb(os.getpid()) - before) / len(streams)
        per_frame_ms(frames[:50], streams[0].process)  # warm
        cost = per_frame_ms(frames, streams[1].process)
        late = delay_ms(streams[2])
        for stream in streams:
            stream.close()
        print(
            f"{denoiser.name}: {cost:.3f} ms per 20 ms frame ({cost / 20:.1%} of a core), "
            f"a call's state {1000 * made_s:.0f} ms and {kept_mb:.1f} MB, speech {late:.0f} ms later"
        )


if __name__ == "__main__":
    main()
