"""The agent's voice as Opus packets made by its track: silence is a fixed packet, sound is encoded, and a
browser's decoder (aiortc's, here) hears the sound back."""

from __future__ import annotations

import numpy as np
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame

from parley.audio import first_channel
from parley.transports.opus_packets import (
    FRAME_SAMPLES,
    SILENCE_PACKET,
    TAIL_FRAMES,
    OpusPackets,
    first_audio_codec,
)


def tone(frames: int) -> list[np.ndarray]:
    t = np.arange(frames * FRAME_SAMPLES) / 48000
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    return list(pcm.reshape(frames, FRAME_SAMPLES))


def test_silence_is_a_fixed_packet_and_sound_is_encoded_and_heard_back() -> None:
    opus = OpusPackets()
    decoder = OpusDecoder()
    silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
    frames = [silence] * 3 + tone(10) + [silence] * (TAIL_FRAMES + 3)
    packets = [opus.packet(pcm, i * FRAME_SAMPLES) for i, pcm in enumerate(frames)]

    assert [p.pts for p in packets] == [i * FRAME_SAMPLES for i in range(len(frames))]
    assert all(bytes(p) == SILENCE_PACKET for p in packets[:3])
    assert all(len(bytes(p)) > len(SILENCE_PACKET) for p in packets[3:13])
    assert all(bytes(p) == SILENCE_PACKET for p in packets[-3:])  # after a tail of encoded silence
    assert opus.encoded == 10 + TAIL_FRAMES

    heard = []
    for packet in packets:
        for frame in decoder.decode(JitterFrame(data=bytes(packet), timestamp=int(packet.pts))):
            heard.append(first_channel(frame.to_ndarray(), 2))
    levels = [float(np.sqrt(np.mean(f.astype(np.float64) ** 2))) for f in heard]
    assert len(heard) == len(frames)
    assert max(levels[:3]) < 10 and min(levels[6:12]) > 2000 and max(levels[-2:]) < 10


def test_the_answer_s_first_audio_codec_decides() -> None:
    sdp = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\na=rtpmap:111 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\n"
    assert first_audio_codec(sdp) == "opus"
    assert first_audio_codec(sdp.replace("SAVPF 111 0", "SAVPF 0 111")) == "pcmu"
    assert first_audio_codec("v=0\r\nm=video 9 RTP/AVP 96\r\n") == ""
