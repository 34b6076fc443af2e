"""What every scripted caller shares: a mouth that speaks queued clips in real time, and ears that keep
what came back (one entry per 20 ms frame) and answer questions about it: when did the reply start,
when did it fall silent, what did it say.

Used by the WebRTC caller (bench/caller.py) and the SIP caller (bench/sip_caller.py), so benchmarks and
tests measure every transport the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import aiohttp
import numpy as np

from parley.audio import PIPELINE_RATE, resample, samples_per_frame

SPEECH_DBFS = -45.0  # reply audio louder than this is speech; coded digital silence sits far below


class CallFailed(RuntimeError):
    pass


@dataclass
class Playback:
    """A clip being spoken: `started` and `finished` resolve to time.monotonic() of its first/last sample."""

    pcm: np.ndarray  # at the mouth's rate
    started: asyncio.Future[float]
    finished: asyncio.Future[float]
    offset: int = 0


class Mouth:
    """Queued clips, handed out one frame at a time at `rate`; silence between them. A `frame_filter`
    changes every frame handed out, silent ones too (a scenario's line adds its background noise)."""

    def __init__(self, rate: int, *, frame_filter: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.rate = rate
        self.frame_samples = samples_per_frame(rate)
        self.frame_filter = frame_filter
        self._clips: deque[Playback] = deque()

    def play(self, pcm16k: np.ndarray) -> Playback:
        """Queue a clip (16 kHz); it is spoken after those queued before it."""
        loop = asyncio.get_running_loop()
        playback = Playback(
            resample(pcm16k, PIPELINE_RATE, self.rate), loop.create_future(), loop.create_future()
        )
        self._clips.append(playback)
        return playback

    def next_frame(self, now: float) -> np.ndarray:
        """The next frame; `now` is when it goes out (time.monotonic())."""
        frame = np.zeros(self.frame_samples, dtype=np.int16)
        filled = 0
        while filled < self.frame_samples and self._clips:
            clip = self._clips[0]
            if not clip.started.done():
                clip.started.set_result(now + filled / self.rate)
            take = min(self.frame_samples - filled, clip.pcm.size - clip.offset)
            frame[filled : filled + take] = clip.pcm[clip.offset : clip.offset + take]
            filled += take
            clip.offset += take
            if clip.offset >= clip.pcm.size:
                self._clips.popleft()
                clip.finished.set_result(now + filled / self.rate)
        return frame if self.frame_filter is None else self.frame_filter(frame)


@dataclass
class Heard:
    """Reply audio as received: one entry per 20 ms frame."""

    times: list[float] = field(default_factory=list)
    levels: list[float] = field(default_factory=list)
    pcm: list[np.ndarray] = field(default_factory=list)


P = TypeVar("P")


class LineConditions(Protocol):
    """What a scripted caller's line does to what it sends (a scenario's line, scenarios/line.py): the
    codec it asks for, noise under every frame, and losses, jitter and stalls on every packet."""

    def codec_for(self, transport: str) -> str: ...

    def names_codec(self) -> bool: ...

    def noisy(self, rate: int) -> Callable[[np.ndarray], np.ndarray]: ...

    def impair(self, send: Callable[[P], object]) -> Callable[[P], None]: ...

    def close(self) -> None: ...


class Microphone(Protocol):
    def play(self, pcm16k: np.ndarray) -> Playback: ...


class Ears:
    """A scripted caller's senses: its microphone (`mic`, set by the caller), the reply audio it heard
    (`heard`, frames at `rate`) and the call's events."""

    mic: Microphone

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.heard = Heard()
        self.events: list[tuple[float, dict[str, Any]]] = []

    async def follow_events(self, base_url: str, call_id: str, token: str = "") -> None:
        """Keep the call's events (`GET /api/calls/<id>/events`, Server-Sent Events) until it ends: how a
        caller without the page's data channel (SIP, a carrier stream) sees what the service decided."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = f"{base_url.rstrip('/')}/api/calls/{call_id}/events"
        # The stream lasts as long as the call: aiohttp's default (5 minutes in all) cut a longer call's
        # events off, and its caller waited for an agent_done that had been sent.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(url, headers=headers) as response,
            ):
                async for line in response.content:
                    if line.startswith(b"data: "):
                        with contextlib.suppress(ValueError):
                            self.events.append((time.monotonic(), json.loads(line[6:])))

    async def say(self, pcm16k: np.ndarray) -> tuple[float, float]:
        """Speak a clip; returns (speech started, speech ended) once it is sent."""
        playback = self.mic.play(pcm16k)
        return await playback.started, await playback.finished

    async def wait_for_audio(self, after: float, timeout: float = 15.0) -> float:
        """When reply audio (speech level) first arrived after `after`."""
        deadline = time.monotonic() + timeout
        index = 0
        while time.monotonic() < deadline:
            times, levels = self.heard.times, self.heard.levels
            while index < len(times):
                if times[index] >= after and levels[index] > SPEECH_DBFS:
                    return times[index]
                index += 1
            await asyncio.sleep(0.01)
        raise TimeoutError("no reply audio")

    async def wait_for_silence(self, after: float, hold_s: float = 0.3, timeout: float = 30.0) -> float:
        """When the reply audio fell silent (and stayed silent for `hold_s`) after `after`."""
        deadline = time.monotonic() + timeout
        index = 0
        silent_since: float | None = None
        while time.monotonic() < deadline:
            times, levels = self.heard.times, self.heard.levels
            while index < len(times):
                t, level = times[index], levels[index]
                index += 1
                if t < after:
                    continue
                if level > SPEECH_DBFS:
                    silent_since = None
                elif silent_since is None:
                    silent_since = t
                if silent_since is not None and t - silent_since >= hold_s:
                    return silent_since
            await asyncio.sleep(0.01)
        raise TimeoutError("the reply did not fall silent")

    def latest_event(self, kind: str, **match: Any) -> dict[str, Any] | None:
        """The last event of `kind` (with these fields) so far: a turn's final transcript, say."""
        found: dict[str, Any] | None = None
        for _, payload in self.events:
            if payload.get("type") == kind and all(payload.get(k) == v for k, v in match.items()):
                found = payload
        return found

    async def wait_for_event(
        self, kind: str, timeout: float = 15.0, after: float = 0.0, **match: Any
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, payload in self.events:
                if (
                    t >= after
                    and payload.get("type") == kind
                    and all(payload.get(k) == v for k, v in match.items())
                ):
                    return payload
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no {kind} event")

    def audio_between(self, start: float, end: float) -> np.ndarray:
        """Reply audio received in [start, end), at 16 kHz (for transcribing what the caller heard)."""
        chunks = [p for t, p in zip(self.heard.times, self.heard.pcm, strict=False) if start <= t < end]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        return resample(np.concatenate(chunks), self.rate, PIPELINE_RATE)

    def gap_after(self, start: float, within_s: float) -> float | None:
        """A gap in the reply audio that began within `within_s` of `start`: its length, once the audio came
        back; 0.0 when there was no gap; None when the audio never came back (the reply had ended)."""
        gap_start: float | None = None
        for t, level in zip(self.heard.times, self.heard.levels, strict=False):
            if t < start:
                continue
            if level <= SPEECH_DBFS:
                if gap_start is None and t <= start + within_s:
                    gap_start = t
            elif gap_start is not None:
                return t - gap_start
            elif t > start + within_s:
                return 0.0
        return None if gap_start is not None else 0.0

    def longest_pause_between(self, start: float, end: float) -> float:
        """The longest silence between two stretches of reply audio heard in [start, end): dead air inside a
        reply (Piper leaves ~0.2 s between sentences)."""
        sounding = [
            t
            for t, lv in zip(self.heard.times, self.heard.levels, strict=False)
            if start <= t < end and lv > SPEECH_DBFS
        ]
        return max((b - a for a, b in itertools.pairwise(sounding)), default=0.0)

    def speech_seconds_between(self, start: float, end: float) -> float:
        frames = sum(
            1
            for t, lv in zip(self.heard.times, self.heard.levels, strict=False)
            if start <= t < end and lv > SPEECH_DBFS
        )
        return frames * 0.02
