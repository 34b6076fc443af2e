"""The agent's voice as Opus packets made by its track, so that silence costs next to nothing.

Profiled with py-spy under `parley bench capacity --callers 10`: aiortc's sending path handles every
20 ms frame the same way (an audio-level pass, a hop to a thread pool and back to the event loop, Opus
encoding), and most frames of a call are digital silence (the agent is listening). A track may hand
aiortc encoded packets instead of frames, which it then only packetises (its documented pass-through,
`Encoder.pack`). This one sends a fixed Opus packet for silence and encodes only frames with sound, on
the event loop (~0.2 ms a frame; the thread-pool hop it replaces cost about as much in wake-ups).

Timestamps come from the track's own sample count, as aiortc's would: every frame yields one packet.
A few frames of real encoded silence follow any sound, so the far end's decoder and this encoder settle
on the same state before the fixed packets take over.
"""

from __future__ import annotations

import fractions

import numpy as np
from av import AudioFrame, CodecContext, Packet
from av.stream import Stream

OPUS_RATE = 48000
FRAME_SAMPLES = 960  # 20 ms
TIME_BASE = fractions.Fraction(1, OPUS_RATE)
# What libopus (voip, 48 kHz stereo, 20 ms) makes of digital silence: a TOC byte and two bytes of frame.
SILENCE_PACKET = bytes.fromhex("fcfffe")
TAIL_FRAMES = 5


class OpusPackets:
    """Encodes one call's outgoing 48 kHz mono frames into Opus packets (stereo, as aiortc sends)."""

    def __init__(self) -> None:
        codec = CodecContext.create("libopus", "w")
        # As aiortc's own OpusEncoder, so a browser hears the same stream.
        codec.bit_rate = 96000
        codec.format = "s16"
        codec.layout = "stereo"
        codec.options = {"application": "voip"}
        codec.sample_rate = OPUS_RATE
        codec.time_base = TIME_BASE
        self._codec = codec
        self._quiet_frames = TAIL_FRAMES + 1  # a call starts silent
        self.encoded = 0  # frames that needed the encoder (the rest were silence)

    def packet(self, pcm: np.ndarray, pts: int, *, silent: bool | None = None) -> Packet[Stream]:
        """The packet for one frame; `silent` when the caller knows it is digital silence (saves a pass)."""
        if pcm.size != FRAME_SAMPLES:
            raise ValueError(f"Opus frames hold {FRAME_SAMPLES} samples, not {pcm.size}")
        quiet = silent if silent is not None else not pcm.any()
        self._quiet_frames = self._quiet_frames + 1 if quiet else 0
        data = SILENCE_PACKET if self._quiet_frames > TAIL_FRAMES else self._encode(pcm, pts)
        packet: Packet[Stream] = Packet(data)
        packet.pts = pts
        packet.time_base = TIME_BASE
        return packet

    def _encode(self, pcm: np.ndarray, pts: int) -> bytes:
        self.encoded += 1
        stereo = np.repeat(pcm.astype(np.int16, copy=False), 2)  # interleaved, left = right
        frame = AudioFrame.from_ndarray(stereo.reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = OPUS_RATE
        frame.pts = pts
        frame.time_base = TIME_BASE
        packets = self._codec.encode(frame)
        return bytes(packets[0]) if packets else SILENCE_PACKET


def first_audio_codec(sdp: str) -> str:
    """The codec an SDP puts first for audio ("opus", "pcmu", ...), lower case; "" when it has none."""
    lines = sdp.splitlines()
    media = next((line.split() for line in lines if line.startswith("m=audio")), [])
    if len(media) < 4:
        return ""
    first = media[3]
    for line in lines:
        if line.startswith(f"a=rtpmap:{first} "):
            return line.split(" ", 1)[1].split("/", 1)[0].strip().lower()
    return ""
