"""A scripted WebRTC caller (aiortc): speaks clips into a call and listens to what comes back.

Used by `parley bench` and by the integration tests. It measures at the caller: when its own speech
started and ended (the moment the frames carrying it went to the encoder) and when the reply audio it
receives starts and falls silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from parley.audio import PIPELINE_RATE, resample, rms_dbfs
from parley.transports.webrtc import (
    WEBRTC_RATE,
    PacedAudioTrack,
    audio_frames,
    configure_ice,
    set_jitter_prefetch,
)

# aiortc's receiver holds 4 frames (80 ms) before playing; a browser's adaptive jitter buffer on a
# clean loopback link sits near its floor of about one frame, which is what the benchmark caller mimics.
BROWSER_JITTER_FRAMES = 1
SPEECH_DBFS = -45.0  # reply audio louder than this is speech; Opus-coded digital silence sits far below


class CallFailed(RuntimeError):
    pass


@dataclass
class Playback:
    """A clip being spoken: `started` and `finished` resolve to time.monotonic() of its first/last sample."""

    pcm: np.ndarray  # 48 kHz
    started: asyncio.Future[float]
    finished: asyncio.Future[float]
    offset: int = 0


class MicTrack(PacedAudioTrack):
    """The caller's microphone: queued clips at real-time pace, silence between them."""

    def __init__(self) -> None:
        super().__init__(WEBRTC_RATE)
        self._clips: deque[Playback] = deque()

    def play(self, pcm16k: np.ndarray) -> Playback:
        """Queue a clip (16 kHz); it is spoken after those queued before it."""
        loop = asyncio.get_running_loop()
        playback = Playback(
            resample(pcm16k, PIPELINE_RATE, WEBRTC_RATE), loop.create_future(), loop.create_future()
        )
        self._clips.append(playback)
        return playback

    def next_frame(self, now: float) -> np.ndarray:
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
        return frame


@dataclass
class Heard:
    """Reply audio as received: one entry per 20 ms frame."""

    times: list[float] = field(default_factory=list)
    levels: list[float] = field(default_factory=list)
    pcm: list[np.ndarray] = field(default_factory=list)


class Caller:
    def __init__(
        self,
        base_url: str,
        *,
        token: str = "",
        ice_addresses: tuple[str, ...] = ("127.0.0.1",),
        jitter_frames: int = BROWSER_JITTER_FRAMES,
    ):
        self.base_url = base_url.rstrip("/")
        self.jitter_frames = jitter_frames
        self.token = token
        configure_ice(ice_addresses)
        self.mic = MicTrack()
        self.heard = Heard()
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.call_id = ""
        self.pc: RTCPeerConnection | None = None
        self._reader: asyncio.Task[None] | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def connect(self, timeout: float = 20.0) -> str:
        pc = self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        channel = pc.createDataChannel("events")
        channel.on("message", self._on_message)
        pc.addTrack(self.mic)
        pc.on("track", self._on_track)
        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession() as session:
            payload = {"sdp": pc.localDescription.sdp, "type": "offer"}
            async with session.post(f"{self.base_url}/offer", json=payload, headers=self._headers()) as r:
                body = await r.json()
                if r.status != 200:
                    raise CallFailed(f"offer refused: {r.status} {body}")
        self.call_id = body["call_id"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="answer"))
        set_jitter_prefetch(pc, self.jitter_frames)
        deadline = time.monotonic() + timeout
        while pc.connectionState != "connected":
            if time.monotonic() > deadline or pc.connectionState in ("failed", "closed"):
                raise CallFailed(f"not connected: {pc.connectionState}")
            await asyncio.sleep(0.02)
        return self.call_id

    async def hangup(self) -> None:
        if self.call_id:
            with contextlib.suppress(aiohttp.ClientError):
                async with (
                    aiohttp.ClientSession() as session,
                    session.delete(f"{self.base_url}/whip/{self.call_id}", headers=self._headers()),
                ):
                    pass
        if self.pc is not None:
            await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def __aenter__(self) -> Caller:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.hangup()

    # listening

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        async for _, pcm in audio_frames(track):
            self.heard.times.append(time.monotonic())
            self.heard.levels.append(rms_dbfs(pcm))
            self.heard.pcm.append(pcm)

    def _on_message(self, message: str | bytes) -> None:
        with contextlib.suppress(ValueError):
            self.events.append((time.monotonic(), json.loads(message)))

    # speaking

    async def say(self, pcm16k: np.ndarray) -> tuple[float, float]:
        """Speak a clip; returns (speech started, speech ended) once it is sent."""
        playback = self.mic.play(pcm16k)
        return await playback.started, await playback.finished

    # waiting

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
        return resample(np.concatenate(chunks), WEBRTC_RATE, PIPELINE_RATE)

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

    def speech_seconds_between(self, start: float, end: float) -> float:
        frames = sum(
            1
            for t, lv in zip(self.heard.times, self.heard.levels, strict=False)
            if start <= t < end and lv > SPEECH_DBFS
        )
        return frames * 0.02
