"""The caller's WebRTC audio decoded on the event loop, sample for sample as aiortc's decoder thread did:
in place of that thread, on a real aiortc receiver and in a real call over loopback."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection, RTCRtpCodecParameters
from aiortc.codecs.opus import OpusDecoder as AiortcOpusDecoder
from aiortc.jitterbuffer import JitterBuffer as AiortcJitterBuffer
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtp import RtpPacket
from av import AudioFrame

from parley.app import RUNTIME, create_app
from parley.audio import first_channel, ulaw_encode
from parley.bench.caller import Caller
from parley.config import Settings
from parley.engines.stt import Transcription
from parley.transports import opus_inbound
from parley.transports.opus_inbound import DECODE_RATE, InlineDecoding, InOrderAudio, decode_inline, libopus
from parley.transports.opus_packets import FRAME_SAMPLES, OpusPackets
from parley.transports.sip.rtp import is_rtcp
from parley.transports.webrtc import WebRtcPeer
from tests.doubles import ScriptedStt, make_engines

OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)
PCMU = RTCRtpCodecParameters(mimeType="audio/PCMU", clockRate=8000, channels=1, payloadType=0)


def tone(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * hz * t) * 8000).astype(np.int16)


def loudest_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    return float(np.argmax(spectrum) * rate / pcm.size)


class Heard:
    def __init__(self) -> None:
        self.frames: list[tuple[np.ndarray, int]] = []
        self.ended = 0

    def deliver(self, pcm: np.ndarray, rate: int) -> None:
        self.frames.append((pcm, rate))

    def end(self) -> None:
        self.ended += 1

    def audio(self) -> np.ndarray:
        return np.concatenate([pcm for pcm, _ in self.frames])


def test_libopus_is_found_where_pyav_ships_it() -> None:
    assert libopus() is not None  # else every call would take the slower fallback


def test_opus_frames_arrive_the_moment_they_are_put_as_aiortc_s_decoder_made_them() -> None:
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    opus = OpusPackets()
    sent = tone(1.0, 48000).reshape(-1, FRAME_SAMPLES)
    for i, pcm in enumerate(sent):
        decoding.put((OPUS, JitterFrame(bytes(opus.packet(pcm, i * FRAME_SAMPLES)), i * FRAME_SAMPLES)))
        assert len(heard.frames) == i + 1  # no thread, no wait: decoded within put()
    assert all(rate == DECODE_RATE and pcm.size == DECODE_RATE // 50 for pcm, rate in heard.frames)
    audio = heard.audio()
    assert abs(loudest_hz(audio[4800:], DECODE_RATE) - 440) < 5
    assert 4000 < np.sqrt(np.mean(audio[4800:].astype(np.float64) ** 2)) < 7000  # the tone's level, 5657
    assert decoding.decoded == len(sent) and decoding.failed == 0
    # The very samples aiortc's own decoder (through PyAV) gives, so the call hears what it heard before.
    theirs = AiortcOpusDecoder()
    opus = OpusPackets()
    packets = [bytes(opus.packet(pcm, i * FRAME_SAMPLES)) for i, pcm in enumerate(sent)]
    reference = [
        first_channel(frame.to_ndarray(), 2)
        for i, packet in enumerate(packets)
        for frame in theirs.decode(JitterFrame(packet, i * FRAME_SAMPLES))
        if isinstance(frame, AudioFrame)
    ]
    assert np.array_equal(np.concatenate(reference), audio)


def test_g711_is_decoded_inline_by_aiortc_s_own_decoder() -> None:
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    for i, pcm in enumerate(tone(0.5, 8000).reshape(-1, 160)):
        decoding.put((PCMU, JitterFrame(ulaw_encode(pcm), i * 160)))
    assert {rate for _, rate in heard.frames} == {8000}
    assert abs(loudest_hz(heard.audio(), 8000) - 440) < 5


def test_without_libopus_aiortc_s_decoder_decodes_inline_at_48khz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opus_inbound, "libopus", lambda: None)
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    opus = OpusPackets()
    for i, pcm in enumerate(tone(0.5, 48000).reshape(-1, FRAME_SAMPLES)):
        decoding.put((OPUS, JitterFrame(bytes(opus.packet(pcm, i * FRAME_SAMPLES)), i * FRAME_SAMPLES)))
    assert {rate for _, rate in heard.frames} == {48000} and len(heard.frames) == 25  # through PyAV
    assert abs(loudest_hz(heard.audio()[4800:], 48000) - 440) < 5


def test_a_packet_that_does_not_decode_costs_only_itself() -> None:
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    opus = OpusPackets()
    frames = tone(0.1, 48000).reshape(-1, FRAME_SAMPLES)
    decoding.put((OPUS, JitterFrame(bytes(opus.packet(frames[0], 0)), 0)))
    decoding.put((OPUS, JitterFrame(b"\x03", 960)))  # a code-3 packet without its frame count
    decoding.put((OPUS, JitterFrame(b"", 1920)))  # libopus would conceal 120 ms for it
    decoding.put((OPUS, JitterFrame(bytes(opus.packet(frames[1], 2880)), 2880)))
    assert decoding.failed == 2 and decoding.decoded == 2
    assert [pcm.size for pcm, _ in heard.frames] == [FRAME_SAMPLES, FRAME_SAMPLES]


def test_the_stream_s_end_releases_aiortc_s_waiting_decoder_thread_once() -> None:
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    got: list[str] = []

    def decoder_thread() -> None:  # as aiortc's: it ends when get() gives None
        decoding.get()
        got.append("released")

    thread = threading.Thread(target=decoder_thread)
    thread.start()
    time.sleep(0.1)
    assert thread.is_alive() and not got  # waits, idle, while the stream goes on
    decoding.put(None)
    decoding.put(None)
    thread.join(timeout=2)
    assert not thread.is_alive() and got == ["released"] and heard.ended == 1


def test_at_the_end_it_lets_go_of_whoever_it_delivered_to() -> None:
    # The receiver holds it, and the transport holds the receiver: kept callbacks would make a cycle that
    # keeps the whole peer connection alive until a full garbage collection.
    for end in ("stream end", "transport close"):
        heard = Heard()
        owner = weakref.ref(heard)
        decoding = InlineDecoding(heard.deliver, heard.end)
        decoding.put((OPUS, JitterFrame(bytes(OpusPackets().packet(tone(0.02, 48000), 0)), 0)))
        if end == "stream end":
            decoding.put(None)
            assert heard.ended == 1
        else:
            decoding.close()
        del heard
        assert owner() is None, end
        decoding.put((OPUS, JitterFrame(bytes(OpusPackets().packet(tone(0.02, 48000), 0)), 0)))
        assert decoding.decoded == 1  # nothing is decoded after the end


def opus_packets(frames: np.ndarray) -> list[RtpPacket]:
    """RTP packets as aiortc's receiver has them once depayloaded (`_data`: the Opus packet)."""
    opus, packets = OpusPackets(), []
    for i, pcm in enumerate(frames):
        packet = RtpPacket(payload_type=111, sequence_number=(65530 + i) % 65536, timestamp=i * FRAME_SAMPLES)
        packet.ssrc = 0x1234
        packet._data = bytes(opus.packet(pcm, i * FRAME_SAMPLES))  # type: ignore[attr-defined]
        packets.append(packet)
    return packets


def frames_out_per_packet(buffer: object, decoding: InlineDecoding, packets: list[RtpPacket]) -> list[int]:
    """How many frames the caller's audio holds after each packet arrives, through `buffer` as aiortc's
    receiver uses it (add, then the decoder queue's put)."""
    heard = []
    for packet in packets:
        _, frame = buffer.add(packet)  # type: ignore[attr-defined]
        if frame is not None:
            decoding.put((OPUS, frame))
        heard.append(decoding.decoded)
    return heard


def test_each_packet_in_sequence_is_heard_the_moment_it_arrives() -> None:
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    packets = opus_packets(tone(0.4, 48000).reshape(-1, FRAME_SAMPLES))  # wraps the sequence number
    assert frames_out_per_packet(InOrderAudio(), decoding, packets) == list(range(1, 21))
    # aiortc's own buffer (even told to hold one frame, not four) lets each out one packet later.
    theirs = AiortcJitterBuffer(capacity=16, prefetch=1)
    elsewhere = InlineDecoding(Heard().deliver, Heard().end)
    assert frames_out_per_packet(theirs, elsewhere, packets) == list(range(20))


def test_after_a_lost_packet_the_caller_is_heard_late_for_two_packets_and_then_not_at_all() -> None:
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    sent = tone(1.6, 48000).reshape(-1, FRAME_SAMPLES)
    packets = opus_packets(sent)
    arrived = packets[:10] + packets[11:]  # the 11th is lost on the way
    out = frames_out_per_packet(InOrderAudio(), decoding, arrived)
    behind = [i + 1 + (i >= 10) - n for i, n in enumerate(out)]  # frames sent but not yet heard
    assert behind[:10] == [0] * 10 and behind[10:12] == [2, 3] and set(behind[12:]) == {0}
    # The lost one is made up (libopus conceals 20 ms), so the audio's time stays whole and in tune.
    assert [pcm.size for pcm, _ in heard.frames] == [FRAME_SAMPLES] * len(sent)
    assert abs(loudest_hz(heard.audio()[4800:], DECODE_RATE) - 440) < 5
    # aiortc's: nothing until 16 packets queue behind the gap, then 14 frames (280 ms) behind for the rest
    # of the call, and the frame before the gap dropped with it (16 never heard at each packet).
    aiortc = frames_out_per_packet(
        AiortcJitterBuffer(capacity=16, prefetch=1), InlineDecoding(Heard().deliver, Heard().end), arrived
    )
    assert [i + 1 + (i >= 10) - n for i, n in enumerate(aiortc)][-20:] == [16] * 20


def test_packets_swapped_on_the_way_are_heard_in_order() -> None:
    heard = Heard()
    decoding = InlineDecoding(heard.deliver, heard.end)
    sent = tone(0.2, 48000, hz=300).reshape(-1, FRAME_SAMPLES)
    packets = opus_packets(sent)
    swapped = [packets[0], packets[2], packets[1], *packets[3:]]
    assert frames_out_per_packet(InOrderAudio(), decoding, swapped) == [1, 1, 3, *range(4, 11)]
    in_order = Heard()
    frames_out_per_packet(InOrderAudio(), InlineDecoding(in_order.deliver, in_order.end), packets)
    assert np.array_equal(heard.audio(), in_order.audio())


async def test_a_receiver_gets_the_inline_decoding_before_it_starts_and_not_after() -> None:
    caller, answerer = RTCPeerConnection(), RTCPeerConnection()
    try:
        caller.addTransceiver("audio", direction="sendonly")
        caller.addTransceiver("audio", direction="sendonly")
        tracks: list[MediaStreamTrack] = []
        answerer.on("track", tracks.append)  # as the service's peer learns of the caller's track
        await caller.setLocalDescription(await caller.createOffer())
        await answerer.setRemoteDescription(caller.localDescription)
        assert len(tracks) == 2
        decoding = InlineDecoding(Heard().deliver, Heard().end)
        assert decode_inline(answerer, tracks[0], decoding)
        first, second = (t.receiver for t in answerer.getTransceivers())
        assert first._RTCRtpReceiver__decoder_queue is decoding  # type: ignore[attr-defined]
        assert isinstance(first._RTCRtpReceiver__jitter_buffer, InOrderAudio)  # type: ignore[attr-defined]

        started = threading.Thread(target=lambda: None)
        second._RTCRtpReceiver__decoder_thread = started  # type: ignore[attr-defined]
        assert not decode_inline(answerer, tracks[1], InlineDecoding(Heard().deliver, Heard().end))
        assert second._RTCRtpReceiver__decoder_queue is not decoding  # type: ignore[attr-defined]
        assert not isinstance(second._RTCRtpReceiver__jitter_buffer, InOrderAudio)  # type: ignore[attr-defined]
        second._RTCRtpReceiver__decoder_thread = None  # type: ignore[attr-defined]
    finally:
        await caller.close()
        await answerer.close()


class RecordingStt(ScriptedStt):
    def __init__(self) -> None:
        super().__init__()
        self.heard: list[np.ndarray] = []

    def transcribe(
        self,
        audio: np.ndarray,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
        weigh: tuple[str, ...] = (),
    ) -> Transcription:
        self.heard.append(audio)
        return super().transcribe(audio, urgent=urgent, wanted=wanted, weigh=weigh)


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient, RecordingStt]]:  # type: ignore[type-arg]
    stt = RecordingStt()
    app = create_app(Settings(sip="off", greeting=""), make_engines(stt=stt))
    c: TestClient = TestClient(TestServer(app))  # type: ignore[type-arg]
    await c.start_server()
    yield c, stt
    await c.close()
    assert not c.app[RUNTIME].registry.active()


async def test_a_webrtc_caller_s_voice_reaches_the_call_decoded_on_the_event_loop(
    client: tuple[TestClient, RecordingStt],  # type: ignore[type-arg]
) -> None:
    server, stt = client
    async with Caller(f"http://127.0.0.1:{server.port}") as caller:
        call = server.app[RUNTIME].registry.get(caller.call_id)
        assert call is not None and call.line is not None
        peer = call.signals.listener  # the transport hears its call
        assert isinstance(peer, WebRtcPeer) and peer.inbound is not None
        await caller.say(tone(1.0, 16000))
        deadline = time.monotonic() + 10
        while not stt.calls and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert stt.calls and max(stt.calls) > 0.8  # the second of tone became an utterance
        utterance = max(stt.heard, key=len)
        assert abs(loudest_hz(utterance, 16000) - 440) < 5  # at the pipeline's rate, as it was said
        assert peer.inbound.decoded > 50 and peer.inbound.failed == 0
        # The benchmark's caller hears the agent the same way.
        assert caller.inbound is not None and caller.inbound.decoded > 50 and caller.rate == DECODE_RATE
        # aiortc's decoder thread was started, and waits for the end with nothing to do.
        waiting = [t for t in threading.enumerate() if t.name == "audio-decoder"]
        assert waiting
    for thread in waiting:
        thread.join(timeout=5)
        assert not thread.is_alive()


async def test_after_a_packet_lost_on_the_way_the_webrtc_caller_is_still_heard_at_once(
    client: tuple[TestClient, RecordingStt],  # type: ignore[type-arg]
) -> None:
    server, _ = client
    async with Caller(f"http://127.0.0.1:{server.port}") as caller:
        call = server.app[RUNTIME].registry.get(caller.call_id)
        assert call is not None and call.line is not None
        peer = call.signals.listener  # the transport hears its call
        assert isinstance(peer, WebRtcPeer) and peer.inbound is not None and caller.pc is not None
        dtls = caller.pc.getSenders()[0].transport
        send = dtls._send_rtp
        sent = 0

        async def losing_the_fifth(data: bytes) -> None:
            nonlocal sent
            if not is_rtcp(data):
                sent += 1
                if sent == 5:
                    return
            await send(data)

        before = peer.inbound.decoded
        dtls._send_rtp = losing_the_fifth  # type: ignore[method-assign]
        await asyncio.sleep(1.5)  # the microphone sends a frame every 20 ms, silence or not
        receiver = next(t.receiver for t in peer.pc.getTransceivers() if t.kind == "audio")
        assert receiver._RTCRtpReceiver__jitter_buffer.order.lost == 1  # type: ignore[attr-defined]
        # Every frame sent has reached the call (the lost one made up), none waits behind the gap.
        assert sent > 50 and sent - (peer.inbound.decoded - before) <= 1
