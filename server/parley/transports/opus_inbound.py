"""The caller's voice put in order and decoded on the event loop as each packet arrives.

Profiled with py-spy under `parley bench capacity --callers 10`: aiortc hands every received 20 ms frame
to a decoder thread of its own (a queue, a wake-up), which decodes it to 48 kHz stereo and hands it
back through `run_coroutine_threadsafe` (a future, a wake-up of the event loop, a task); then the call
took one channel and resampled it to 16 kHz. Here the receiver's decoder queue is replaced by one that
decodes at once, on the event loop where the frame was put, with libopus as aiortc has it (48 kHz
stereo, ~40 us a frame), and hands the first channel to the call, which resamples it as before. (libopus
can decode straight to 16 kHz mono for the same cost and no resampling, but those samples differ from
these, and Whisper's verdict on a laugh or a cough over the agent can turn on such a difference: the
audio the call hears stays what it was.) aiortc's decoder thread is still started, and waits, idle,
until the receiver stops: the end of the stream is told as before.

libopus is called through ctypes (PyAV's wheel ships it): through PyAV each frame would cost a packet and
a frame object more. Where it cannot be found, and for other codecs (G.711, G.722), aiortc's own decoder
runs, inline too.

The receiver's jitter buffer is replaced too (`InOrderAudio`). aiortc's, built for video frames that
span packets, lets a frame out only when a packet of the next one has come: every audio frame 20 ms late.
And a lost packet stops it: nothing comes out until 16 more have queued behind the gap (320 ms), and then
one frame for each packet that arrives, so the caller is heard 14 frames (280 ms) late for the rest of
the call: every barge-in and every end of turn after one lost packet. Ours is the SIP stream's (in
order at once, a gap waited for while two packets queue behind it, then concealed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc import RTCPeerConnection
from aiortc.codecs import get_decoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamTrack
from av import AudioFrame

from parley.audio import first_channel
from parley.log import event
from parley.transports.sip.rtp import JitterBuffer

log = logging.getLogger(__name__)

DECODE_RATE = 48000
CHANNELS = 2  # as aiortc decodes: a microphone's mono stream comes out as two equal channels
MAX_FRAME_SAMPLES = DECODE_RATE * 120 // 1000  # Opus packets hold at most 120 ms
_QUEUE = "_RTCRtpReceiver__decoder_queue"
_THREAD = "_RTCRtpReceiver__decoder_thread"
_JITTER = "_RTCRtpReceiver__jitter_buffer"
FRAME_SAMPLES = DECODE_RATE // 50  # what a lost packet is concealed as until a packet has told its length

Deliver = Callable[[np.ndarray, int], None]  # (mono int16 samples, their rate)


def _find_libopus() -> ctypes.CDLL | None:
    import av

    package = os.path.dirname(av.__file__)
    bundled = glob.glob(os.path.join(package, os.pardir, "av.libs", "libopus*.so*"))
    bundled += glob.glob(os.path.join(package, ".dylibs", "libopus*.dylib"))
    system = ctypes.util.find_library("opus")
    for path in [*sorted(bundled), *([system] if system else [])]:
        try:
            lib = ctypes.CDLL(path)
            _declare(lib)
        except (OSError, AttributeError):  # not loadable, or not a libopus decoder
            continue
        return lib
    return None


def _declare(lib: ctypes.CDLL) -> None:
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.opus_decode.restype = ctypes.c_int
    lib.opus_decode.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.opus_decoder_destroy.restype = None
    lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]


@functools.cache
def libopus() -> ctypes.CDLL | None:
    lib = _find_libopus()
    if lib is None:
        event(log, "libopus_not_found", logging.WARNING, fallback="aiortc decoder")
    return lib


class OpusStreamDecoder:
    """One stream's libopus decoder: 48 kHz, the first channel, int16, whatever the sender encoded."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        error = ctypes.c_int()
        self._state = lib.opus_decoder_create(DECODE_RATE, CHANNELS, ctypes.byref(error))
        if not self._state or error.value != 0:
            raise RuntimeError(f"opus_decoder_create failed ({error.value})")
        self._out = np.zeros(MAX_FRAME_SAMPLES * CHANNELS, dtype=np.int16)

    def decode(self, payload: bytes) -> np.ndarray | None:
        """The packet's samples (a copy), or None for a packet libopus refuses (it says why: < 0). An
        empty one is refused here: libopus would take it for a lost packet and conceal 120 ms."""
        if not payload:
            return None
        out = self._out
        n = self._lib.opus_decode(self._state, payload, len(payload), out.ctypes.data, MAX_FRAME_SAMPLES, 0)
        return out[: n * CHANNELS : CHANNELS].copy() if n > 0 else None

    def conceal(self, samples: int) -> np.ndarray | None:
        """`samples` of what libopus makes up for a lost packet (its packet loss concealment)."""
        n = self._lib.opus_decode(self._state, None, 0, self._out.ctypes.data, samples, 0)
        return self._out[: n * CHANNELS : CHANNELS].copy() if n > 0 else None

    def close(self) -> None:
        if self._state:
            self._lib.opus_decoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()


class Frames(JitterFrame):
    """The frames one packet let out of `InOrderAudio`, oldest first; None for each packet given up on."""

    def __init__(self, frames: list[JitterFrame | None]) -> None:
        timestamp = next((f.timestamp for f in reversed(frames) if f is not None), 0)
        super().__init__(data=b"", timestamp=timestamp)
        self.frames = frames


class InOrderAudio:
    """Stands in for an aiortc receiver's audio jitter buffer (see the module's docstring): a packet in
    sequence goes out as it arrives; a missing one is waited for while `depth` packets queue behind it,
    then given up (None in the `Frames`: the decoder conceals it), and what waited goes out with it."""

    def __init__(self, depth: int = 2) -> None:
        self.order: JitterBuffer[Any] = JitterBuffer(depth)

    def add(self, packet: Any) -> tuple[bool, Frames | None]:
        """aiortc's call for each packet: (whether to ask for a picture, what is due)."""
        due = self.order.push(packet)
        if not due:
            return False, None
        return False, Frames([None if p is None else JitterFrame(p._data, p.timestamp) for p in due])


def _no_audio(pcm: np.ndarray, rate: int) -> None:
    pass


def _nothing() -> None:
    pass


class InlineDecoding:
    """Stands in for an aiortc receiver's decoder queue: `put` decodes on the caller's (the event loop's)
    thread and delivers the samples; `get`, which aiortc's decoder thread calls, waits for the end."""

    def __init__(self, deliver: Deliver, on_end: Callable[[], None]) -> None:
        self._deliver = deliver
        self._on_end = on_end
        self._ended = threading.Event()
        self._codec = ""
        self._opus: OpusStreamDecoder | None = None
        self._other: Any = None  # aiortc's decoder, for a codec libopus does not decode
        self.decoded = 0  # frames delivered
        self._last = (FRAME_SAMPLES, DECODE_RATE)  # the last frame's samples and rate
        self.failed = 0  # packets that did not decode
        self._closed = False

    def close(self) -> None:
        """Free the decoder and let go of the callbacks (idempotent). They hold the transport, which holds
        the receiver that holds this: left in place, that cycle would keep the whole peer connection
        (and the threads of its encoder's resampler) until the garbage collector's next full pass."""
        self._closed = True
        if self._opus is not None:
            self._opus.close()
        self._opus, self._other = None, None
        self._deliver, self._on_end = _no_audio, _nothing

    # the receiver's side (the event loop)

    def put(self, task: tuple[Any, JitterFrame] | None) -> None:
        if task is None:
            if not self._ended.is_set():
                on_end = self._on_end
                self.close()
                self._ended.set()
                on_end()
            return
        if self._closed:
            return
        codec, frame = task
        name = str(codec.mimeType).lower()
        for one in frame.frames if isinstance(frame, Frames) else [frame]:
            self._decode(codec, name, one)

    def _decode(self, codec: Any, name: str, frame: JitterFrame | None) -> None:
        """One frame, or for a packet given up on (None), as much made up as the last frame held."""
        try:
            if name != self._codec:
                self._switch(codec, name)
            if self._opus is not None:
                opus = self._opus
                pcm = opus.decode(frame.data) if frame is not None else opus.conceal(self._last[0])
                if pcm is None:
                    self.failed += 1
                    return
                self._heard(pcm, DECODE_RATE)
                return
            if frame is None:
                samples, rate = self._last
                self._heard(np.zeros(samples, dtype=np.int16), rate)
                return
            for decoded in self._other.decode(frame):
                if isinstance(decoded, AudioFrame):
                    mono = first_channel(decoded.to_ndarray(), len(decoded.layout.channels))
                    self._heard(mono, decoded.sample_rate)
        except Exception:
            # One bad packet costs its 20 ms, never the call (aiortc's own thread logs and goes on too).
            self.failed += 1
            if self.failed == 1 or self.failed % 500 == 0:
                event(log, "decode_failed", logging.WARNING, codec=name, failed=self.failed)

    def _heard(self, pcm: np.ndarray, rate: int) -> None:
        self.decoded += 1
        self._last = (pcm.size, rate)
        self._deliver(pcm, rate)

    def _switch(self, codec: Any, name: str) -> None:
        self._codec = name
        if self._opus is not None:
            self._opus.close()
        self._opus, self._other = None, None
        lib = libopus() if name == "audio/opus" else None
        if lib is not None:
            self._opus = OpusStreamDecoder(lib)
        else:
            self._other = get_decoder(codec)

    # aiortc's decoder thread: nothing to decode, so it waits; None tells it the stream ended

    def get(self) -> None:
        self._ended.wait()
        return None


def decode_inline(
    pc: RTCPeerConnection, track: MediaStreamTrack, decoding: InlineDecoding, *, in_order: bool = True
) -> bool:
    """Give `track`'s receiver `decoding` as its decoder queue, and (`in_order`) `InOrderAudio` as its
    jitter buffer; False (nothing changed) when the receiver is not found, has started decoding already,
    or this aiortc keeps its queue elsewhere."""
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if receiver.track is not track:
            continue
        if not hasattr(receiver, _QUEUE) or getattr(receiver, _THREAD, True) is not None:
            return False
        setattr(receiver, _QUEUE, decoding)
        if in_order and hasattr(receiver, _JITTER):
            setattr(receiver, _JITTER, InOrderAudio())
        return True
    return False
