"""WebRTC audio tracks over aiortc: the agent's voice paced out (Opus packets encoded here), a received
track's audio as mono frames, and what aiortc gets replaced for speed (its audio level, its jitter
prefetch where our own buffer cannot take over)."""

from __future__ import annotations

import fractions
import time
from collections.abc import AsyncIterator
from typing import Any

import aiortc.rtp
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from parley.audio import audio_level_dbov, first_channel, samples_per_frame
from parley.outbound import Outbound
from parley.transports.base import FrameClock
from parley.transports.opus_packets import OPUS_RATE, OpusPackets

WEBRTC_RATE = 48000


def _fast_audio_level(frame: AudioFrame) -> int:
    return audio_level_dbov(frame.to_ndarray().reshape(-1))


# aiortc computes the RFC 6465 audio level of every outgoing frame in pure Python over a 120 ms buffer:
# measured here, ~1.2 ms per 20 ms frame, most of a call's media cost. The numpy version takes ~0.02 ms.
aiortc.rtp.compute_audio_level_dbov = _fast_audio_level


def set_jitter_prefetch(pc: RTCPeerConnection, frames: int) -> None:
    """Hold incoming audio for `frames` frames instead of aiortc's fixed 4 (80 ms), where its decoder
    could not be replaced (where it is, its jitter buffer is too: transports/opus_inbound.py).

    aiortc delays every received audio frame until 4 more have arrived: a playout cushion that a
    listener needs on a jittery network, but that our VAD does not (it only needs order, which the
    buffer still restores). Measured here: speech onset reached the VAD ~60 ms sooner with 1. aiortc has
    no setting for it, so the receiver's buffer is replaced before the first packet arrives.
    """
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if transceiver.kind == "audio" and hasattr(receiver, "_RTCRtpReceiver__jitter_buffer"):
            receiver._RTCRtpReceiver__jitter_buffer = JitterBuffer(capacity=16, prefetch=frames)


class PacedAudioTrack(MediaStreamTrack):
    """A sending track that produces one 20 ms mono frame per frame period, on the track's own clock.

    aiortc asks for the next frame as soon as it has sent the last one; pacing here is what makes the
    stream real-time. Subclasses say what the next frame holds.
    """

    kind = "audio"

    def __init__(self, rate: int) -> None:
        super().__init__()
        self.rate = rate
        self.frame_samples = samples_per_frame(rate)
        self._time_base = fractions.Fraction(1, rate)
        self._clock = FrameClock()
        self._pts = 0

    def next_frame(self, now: float) -> np.ndarray:
        """The next `frame_samples` of int16 audio; `now` is when it goes out (time.monotonic())."""
        raise NotImplementedError

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._clock.tick()
        pcm = self.next_frame(time.monotonic())
        frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        frame.time_base = self._time_base
        self._pts += self.frame_samples
        return frame


class OutboundTrack(PacedAudioTrack):
    """The agent's voice: frames pulled from the call's Outbound; with Opus, packets encoded here
    (transports/opus_packets.py: silence then costs no encoding)."""

    def __init__(self, outbound: Outbound) -> None:
        super().__init__(outbound.rate)
        self.outbound = outbound
        self.opus: OpusPackets | None = None

    def encode_opus(self) -> None:
        """The call was negotiated with Opus first: hand aiortc packets (set before the first frame)."""
        if self.rate == OPUS_RATE:
            self.opus = OpusPackets()

    def next_frame(self, now: float) -> np.ndarray:
        return self.outbound.pull_frame()

    async def recv(self) -> Any:
        if self.opus is None:
            return await super().recv()
        if self.readyState != "live":
            raise MediaStreamError
        await self._clock.tick()
        frame = self.next_frame(time.monotonic())
        # The Outbound's own silence frame is known silent: no pass over it (~3 us a frame, 4 % of media CPU).
        packet = self.opus.packet(frame, self._pts, silent=True if frame is self.outbound.silence else None)
        self._pts += self.frame_samples
        return packet


async def audio_frames(track: MediaStreamTrack) -> AsyncIterator[tuple[int, np.ndarray]]:
    """A received track's audio as (sample rate, mono int16) per frame, until the track ends.

    aiortc decodes every Opus stream to stereo, a mono one (a microphone) into two equal channels, so one
    channel is the caller's voice: 1.6 us a frame, where averaging the two took 9.8 us.
    """
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if isinstance(frame, AudioFrame):
            yield frame.sample_rate, first_channel(frame.to_ndarray(), len(frame.layout.channels))
