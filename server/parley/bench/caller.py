"""A scripted WebRTC caller (aiortc): speaks clips into a call and listens to what comes back.

Used by `parley bench` and by the integration tests. It measures at the caller: when its own speech
started and ended (the moment the frames carrying it went to the encoder) and when the reply audio it
receives starts and falls silent.

Given a scenario's `line` (scenarios/line.py), its noise is under every frame and the RTP of its audio
goes through the line's losses, jitter and stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.rtp import is_rtcp
from aiortc.sdp import SessionDescription

from parley.audio import rms_dbfs
from parley.bench.listening import CallFailed, Ears, LineConditions, Mouth, Playback
from parley.transports.opus_inbound import InlineDecoding, decode_inline
from parley.transports.webrtc_signaling import configure_ice
from parley.transports.webrtc_tracks import WEBRTC_RATE, PacedAudioTrack, audio_frames, set_jitter_prefetch

# aiortc's receiver holds 4 frames (80 ms) before playing; a browser's adaptive jitter buffer on a
# clean loopback link sits near its floor of about one frame, which is what the benchmark caller mimics.
BROWSER_JITTER_FRAMES = 1


class MicTrack(PacedAudioTrack):
    """The caller's microphone: queued clips at real-time pace, silence between them."""

    def __init__(self) -> None:
        super().__init__(WEBRTC_RATE)
        self.mouth = Mouth(WEBRTC_RATE)

    def play(self, pcm16k: np.ndarray) -> Playback:
        return self.mouth.play(pcm16k)

    def next_frame(self, now: float) -> np.ndarray:
        return self.mouth.next_frame(now)


class Caller(Ears):
    mic: MicTrack

    def __init__(
        self,
        base_url: str,
        *,
        token: str = "",
        ice_addresses: tuple[str, ...] = ("127.0.0.1",),
        jitter_frames: int = BROWSER_JITTER_FRAMES,
        line: LineConditions | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.jitter_frames = jitter_frames
        self.token = token
        configure_ice(ice_addresses)
        super().__init__(WEBRTC_RATE)
        self.mic = MicTrack()
        self.line = line
        if line is not None:
            line.codec_for("webrtc")  # WebRTC audio is Opus here: a line asking for another is refused
            self.mic.mouth.frame_filter = line.noisy(WEBRTC_RATE)
        self.call_id = ""
        self.pc: RTCPeerConnection | None = None
        self.channel: RTCDataChannel | None = None  # the page's data channel ("events")
        self._reader: asyncio.Task[None] | None = None
        self.inbound: InlineDecoding | None = None  # the reply's audio, decoded as it arrives

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def connect(
        self, timeout: float = 20.0, *, agent: str | None = None, context: dict[str, str] | None = None
    ) -> str:
        pc = self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        channel = self.channel = pc.createDataChannel("events")
        channel.on("message", self._on_message)
        pc.addTrack(self.mic)
        pc.on("track", self._on_track)
        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession() as session:
            payload: dict[str, object] = {"sdp": pc.localDescription.sdp, "type": "offer"}
            if agent is not None:
                payload["agent"] = agent
            if context is not None:
                payload["context"] = context
            async with session.post(f"{self.base_url}/offer", json=payload, headers=self._headers()) as r:
                body = await r.json()
                if r.status != 200:
                    raise CallFailed(f"offer refused: {r.status} {body}")
        self.call_id = body["call_id"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="answer"))
        if self.line is not None:
            self._put_on_line(pc, self.line, body["sdp"])
        set_jitter_prefetch(pc, self.jitter_frames)
        deadline = time.monotonic() + timeout
        while pc.connectionState != "connected":
            if time.monotonic() > deadline or pc.connectionState in ("failed", "closed"):
                raise CallFailed(f"not connected: {pc.connectionState}")
            await asyncio.sleep(0.02)
        return self.call_id

    def _put_on_line(self, pc: RTCPeerConnection, line: LineConditions, answer: str) -> None:
        """Send the microphone's RTP through the line. aiortc's audio sender hands each packet to its
        DTLS transport's `_send_rtp` coroutine, which encrypts and sends it: wrapped there (once the
        answer has settled which transport that is), a packet is lost or late after it was numbered,
        as on a real network. RTCP, which shares the transport, goes as it is."""
        wanted = line.codec_for("webrtc")
        audio = [m for m in SessionDescription.parse(answer).media if m.kind == "audio"]
        answered = audio[0].rtp.codecs[0].mimeType.split("/")[-1] if audio and audio[0].rtp.codecs else ""
        if line.names_codec() and answered.lower() != wanted.lower():
            raise CallFailed(f"line.codec {wanted} was asked for, but the service answered {answered!r}")
        sender = next((s for s in pc.getSenders() if s.kind == "audio"), None)
        if sender is None or sender.transport is None:
            raise CallFailed("the WebRTC call has no audio sender to put the line's impairments on")
        transport = sender.transport
        send_rtp = transport._send_rtp
        impaired = line.impair(send_rtp)

        async def through_line(data: bytes) -> None:
            if is_rtcp(data):
                await send_rtp(data)
            else:
                impaired(data)

        setattr(transport, "_send_rtp", through_line)  # noqa: B010 (an instance's method, replaced)

    async def hangup(self) -> None:
        if self.line is not None:
            self.line.close()
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
        # As the service does (transports/opus_inbound.py): many callers share the service's cores here.
        if track.kind != "audio" or self.pc is None:
            return
        self.inbound = InlineDecoding(self._hear, lambda: None)
        # Its jitter buffer stays aiortc's, holding a frame as a browser's does on a clean link.
        if not decode_inline(self.pc, track, self.inbound, in_order=False):
            self.inbound = None
            self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        async for rate, pcm in audio_frames(track):
            self._hear(pcm, rate)

    def _hear(self, pcm: np.ndarray, rate: int) -> None:
        # Opus, which this caller offers first, always decodes at WEBRTC_RATE (the `rate` given).
        self.heard.times.append(time.monotonic())
        self.heard.levels.append(rms_dbfs(pcm))
        self.heard.pcm.append(pcm)

    def _on_message(self, message: str | bytes) -> None:
        with contextlib.suppress(ValueError):
            self.events.append((time.monotonic(), json.loads(message)))
