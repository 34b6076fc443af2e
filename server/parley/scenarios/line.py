"""What a phone line does to the caller's audio on its way to the agent, repeatably.

A scenario's `Line` names the codec, the background noise under the caller and what the network does to
its packets: some lost, each delayed a little (so some overtake others), and stalls that hold every
packet for a while and then deliver them at once. `CallerLine` does all of it for one call, every
random draw taken from the scenario's seed, so a failing run can be replayed exactly:

- `level` sets each of the caller's clips to a phone call's speech level and `noisy(rate)` adds the
  noise to every frame the caller's mouth hands out (between turns too: a street does not go quiet);
- `impair(send)` wraps whatever sends one packet (an RTP datagram, a carrier's `media` message) so
  that it loses, delays and holds them on the way;
- `codec_for(transport)` says which codec the caller offers, or why the line cannot be had there.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import soundfile
import soxr

from parley.audio import PIPELINE_RATE, SILENCE_DBFS, rms_dbfs
from parley.bench import noises
from parley.scenarios.scenario import Line, ScenarioError

P = TypeVar("P")

# Each transport's codecs, its own (what "" means) first.
CODECS: dict[str, tuple[str, ...]] = {"sip": ("PCMU", "PCMA"), "webrtc": ("opus",), "carrier": ("mulaw",)}

# Speech is measured over its 10 ms windows above this (trim_silence's floor): pauses inside a clip
# ("[pause 900ms]") would otherwise lower its measured level and have it played louder than the rest.
ACTIVE_FLOOR_DBFS = -50.0

# Making a noise takes seconds (babble is six voices speaking), and every scenario of a run may ask for it.
_noises: dict[tuple[str, int, int], np.ndarray] = {}


class CallerLine:
    """One call's line, from the scenario's `line` and `seed`.

    Counters, for tests and the report: `sent` packets given to the line, of which `lost` never arrived,
    `delayed` arrived late by jitter alone, `held` waited for a stall's end; `failed` could not be sent
    once due (the call had ended under them).
    """

    def __init__(self, line: Line, seed: int) -> None:
        if not 0.0 <= line.loss < 1.0:
            raise ScenarioError(f"line.loss must be a share of packets, 0 to below 1, not {line.loss}")
        if line.jitter_ms < 0 or any(s.ms < 0 or s.at_s < 0 for s in line.stalls):
            raise ScenarioError("line.jitter_ms and each stall's at_s and ms cannot be negative")
        self.line = line
        self.seed = seed
        self.sent = 0
        self.lost = 0
        self.delayed = 0
        self.held = 0
        self.failed = 0
        self._timers: set[asyncio.TimerHandle] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._closed = False

    # the codec

    def names_codec(self) -> bool:
        """Whether the scenario asks for a codec (else each transport uses its own)."""
        return bool(self.line.codec)

    def codec_for(self, transport: str) -> str:
        """The codec the caller uses over `transport` (the line's, else the transport's own); ScenarioError
        when the line's codec is not spoken there."""
        codecs = CODECS.get(transport)
        if codecs is None:
            raise ScenarioError(f"unknown transport {transport!r}: one of {', '.join(CODECS)}")
        if not self.line.codec:
            return codecs[0]
        for codec in codecs:
            if codec.lower() == self.line.codec.lower():
                return codec
        where = next((t for t, cs in CODECS.items() if self.line.codec.lower() in map(str.lower, cs)), "")
        elsewhere = f" ({self.line.codec} is {where}'s)" if where else ""
        raise ScenarioError(
            f"line.codec {self.line.codec!r} cannot be had over {transport}, which speaks "
            f"{' or '.join(codecs)}{elsewhere}"
        )

    # the caller's sound

    def level(self, pcm16k: np.ndarray) -> np.ndarray:
        """A clip of the caller's (16 kHz int16) with its speech at a phone call's level (noises.SPEECH_DBFS),
        the level the noise is set against; on a clean line too, so that a run with noise differs from one
        without by the noise alone."""
        speech = _active_dbfs(pcm16k)
        if speech is None:
            return pcm16k
        gain = 10 ** ((noises.SPEECH_DBFS - speech) / 20)
        return _int16(pcm16k.astype(np.float64) * gain)

    def prepare(self) -> None:
        """Make the line's noise (seconds for babble): run in a thread before the call, so that `noisy`,
        which a caller asks for on the event loop, finds it made."""
        if self.line.noise:
            _noise(self.line.noise)

    def noisy(self, rate: int) -> Callable[[np.ndarray], np.ndarray]:
        """What adds the line's noise to each outgoing frame (int16 at `rate`), one frame after the other:
        the noise runs on from a point drawn from the seed, `snr_db` under the caller's speech level.
        A clean line's leaves the frames as they are."""
        if not self.line.noise:
            return _as_is
        source = _noise(self.line.noise)
        level = rms_dbfs(source)
        if level <= SILENCE_DBFS:
            raise ScenarioError(f"line.noise {self.line.noise!r} is silent")
        gain = 10 ** ((noises.SPEECH_DBFS - self.line.snr_db - level) / 20)
        noise = _int16(_resampled(source * gain, PIPELINE_RATE, rate)).astype(np.int32)
        # Drawn as a share of the noise, so that one seed starts at the same moment at any rate.
        at = int(np.random.default_rng(self.seed).random() * noise.size)

        def add(frame: np.ndarray) -> np.ndarray:
            nonlocal at
            stretch = np.take(noise, np.arange(at, at + frame.size), mode="wrap")
            at = (at + frame.size) % noise.size
            return np.asarray(np.clip(frame.astype(np.int32) + stretch, -32768, 32767), dtype=np.int16)

        return add

    # the packets

    def impair(self, send: Callable[[P], object]) -> Callable[[P], None]:
        """`send` (one packet on; it may return an awaitable, which then runs as a task) behind this line:
        a share `loss` of packets dropped, each delayed by 0..jitter_ms, and those due during a stall
        (timed from the first packet) held to its end and then sent in a burst, in the order given.
        Drawn from the seed packet by packet: the n-th packet meets the same fate in every run."""
        draws = random.Random(self.seed)
        stalls = sorted((s.at_s, s.at_s + s.ms / 1000) for s in self.line.stalls)
        held: list[list[P]] = [[] for _ in stalls]
        started: float | None = None

        def deliver(packet: P) -> None:
            if self._closed:
                return
            result = send(packet)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._tasks.add(task)
                task.add_done_callback(self._sent)

        def deliver_late(packet: P) -> None:
            try:
                deliver(packet)
            except Exception:  # the transport closed under a late packet: a real network does not say
                self.failed += 1

        def release(stall: int) -> None:
            due, held[stall] = held[stall], []
            for packet in due:
                deliver_late(packet)

        def impaired(packet: P) -> None:
            nonlocal started
            if self._closed:
                return
            loop = asyncio.get_running_loop()
            now = loop.time()
            if started is None:
                started = now
            self.sent += 1
            # Both drawn for every packet, so that each packet's fate depends on its number alone.
            lost = draws.random() < self.line.loss
            delay = draws.uniform(0.0, self.line.jitter_ms) / 1000
            if lost:
                self.lost += 1
                return
            arrives = now - started + delay
            for i, (begin, end) in enumerate(stalls):
                if begin <= arrives < end:
                    self.held += 1
                    if not held[i]:
                        self._later(loop, started + end - now, release, i)
                    held[i].append(packet)
                    return
            if delay > 0:
                self.delayed += 1
                self._later(loop, delay, deliver_late, packet)
            else:
                deliver(packet)

        return impaired

    def close(self) -> None:
        """The call is over: packets still delayed or held are dropped, sends under way cancelled."""
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()

    def describe(self) -> str:
        """The line in words, for the report: "PCMU, 2% loss, jitter 0-40 ms, 1 stall (800 ms at 4 s),
        street noise at 10 dB SNR, seed 7"."""
        line = self.line
        said = [line.codec] if line.codec else []
        if line.loss:
            said.append(f"{line.loss * 100:g}% loss")
        if line.jitter_ms:
            said.append(f"jitter 0-{line.jitter_ms} ms")
        if line.stalls:
            each = ", ".join(f"{s.ms} ms at {s.at_s:g} s" for s in line.stalls)
            said.append(f"{len(line.stalls)} stall{'s' if len(line.stalls) > 1 else ''} ({each})")
        if line.noise:
            what = f"{line.noise} noise" if line.noise in noises.NOISES else f"noise {Path(line.noise).name}"
            said.append(f"{what} at {line.snr_db:g} dB SNR")
        if not (line.loss or line.jitter_ms or line.stalls or line.noise):
            said.append("clean line")
        return ", ".join([*said, f"seed {self.seed}"])

    def _later(
        self, loop: asyncio.AbstractEventLoop, delay: float, act: Callable[[Any], None], arg: Any
    ) -> None:
        def fire() -> None:
            self._timers.discard(timer)
            act(arg)

        timer = loop.call_later(delay, fire)
        self._timers.add(timer)

    def _sent(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.failed += 1


def _as_is(frame: np.ndarray) -> np.ndarray:
    return frame


def _noise(name: str) -> np.ndarray:
    """The noise `name` (one of noises.NOISES, else a WAV file's path) at 16 kHz, float at int16 scale."""
    if name in noises.NOISES:
        key = (name, 0, 0)
        if key not in _noises:
            _noises[key] = noises.make(name)
        return _noises[key]
    path = Path(name)
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        if key in _noises:
            return _noises[key]
        data, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    except (OSError, RuntimeError) as exc:  # soundfile's errors are RuntimeErrors
        raise ScenarioError(
            f"line.noise {name!r} is neither one of {', '.join(noises.NOISES)} nor a readable WAV: {exc}"
        ) from None
    if data.size == 0:
        raise ScenarioError(f"line.noise {name!r} holds no audio")
    _noises[key] = _resampled(data.mean(axis=1) * 32767, int(rate), PIPELINE_RATE)
    return _noises[key]


def _resampled(pcm: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Float samples at another rate. Not parley.audio.resample: soxr dithers what it rounds to int16,
    and two calls then differ by a sample value or two, where one seed must give the same noise."""
    if rate_in == rate_out:
        return pcm.astype(np.float64)
    return np.asarray(
        soxr.resample(pcm.astype(np.float64), rate_in, rate_out, quality="HQ"), dtype=np.float64
    )


def _active_dbfs(pcm: np.ndarray) -> float | None:
    """The level of a clip's speech (its 10 ms windows above ACTIVE_FLOOR_DBFS), None when it has none."""
    window = PIPELINE_RATE // 100
    count = pcm.size // window
    if count == 0:
        return None
    frames = pcm[: count * window].astype(np.float64).reshape(count, window)
    power = (frames**2).mean(axis=1)
    loud = power[10 * np.log10(np.maximum(power, 1e-12) / 32768.0**2) > ACTIVE_FLOOR_DBFS]
    if loud.size == 0:
        return None
    return float(10 * np.log10(loud.mean() / 32768.0**2))


def _int16(pcm: np.ndarray) -> np.ndarray:
    return np.clip(np.round(pcm), -32768, 32767).astype(np.int16)
