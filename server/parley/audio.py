"""Audio format conversion, in one place.

Inside a call, audio is mono int16 numpy arrays: 16 kHz towards the stages, and the transport's own
rate (48 kHz for WebRTC, 8 kHz for telephony) from the Outbound. Transports convert at the edge with
these helpers and nothing else.
"""

from __future__ import annotations

import math

import numpy as np
import soxr

PIPELINE_RATE = 16000
FRAME_MS = 20


def samples_per_frame(rate: int, frame_ms: int = FRAME_MS) -> int:
    return rate * frame_ms // 1000


def to_float32(pcm: np.ndarray) -> np.ndarray:
    """int16 -> float32 in [-1, 1]; float input passes through as float32."""
    if pcm.dtype == np.int16:
        return np.asarray(pcm.astype(np.float32) / 32768.0)
    return np.asarray(pcm, dtype=np.float32)


def first_channel(interleaved: np.ndarray, channels: int) -> np.ndarray:
    """Interleaved int16 -> its first channel, contiguous (for channels known to carry the same sound)."""
    flat = interleaved.reshape(-1)
    return flat if channels == 1 else np.ascontiguousarray(flat[0::channels])


SILENCE_DBFS = -120.0  # the level given to digital silence


def rms_dbfs(pcm: np.ndarray) -> float:
    """RMS level of int16 audio in dB full scale (`SILENCE_DBFS` for digital silence)."""
    if pcm.size == 0:
        return SILENCE_DBFS
    x = pcm.astype(np.float64)
    mean_square = float(np.dot(x, x)) / x.size
    if mean_square <= 0.0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, 10.0 * math.log10(mean_square / (32768.0 * 32768.0)))


def resample(pcm: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample a whole int16 chunk (a TTS sentence, a test file). Not for streams cut in frames."""
    if rate_in == rate_out or pcm.size == 0:
        return pcm.astype(np.int16, copy=False)
    out = soxr.resample(pcm.astype(np.int16, copy=False), rate_in, rate_out, quality="HQ")
    return np.asarray(out, dtype=np.int16)


class StreamResampler:
    """Resamples a stream cut into frames without clicks at frame edges (keeps the filter's state).

    The default (`quality="LQ"`, the low-latency stream a call's inbound audio takes) doubles a rate, as
    telephony's 8 kHz to 16 kHz, through `_Doubler`: every frame comes out at once, delayed 1.4 ms.
    soxr's streams hold frames back at that rate (low quality: three 20 ms frames at a time, 30 ms late
    on average and 55 ms at worst; medium and high: six) and its low quality muffles the top of the band:
    Whisper then heard a G.711 "stop" as a filler at 3 of 8 phases, its odds on "Stop" 0.2-16 % against
    2.5-43 % through the doubler (`bench backchannels` over G.711). Other rates use soxr's low-quality
    (still anti-aliased) stream: from 48 kHz its delay is ~8-11 ms, where the medium and high qualities
    hold back a whole 20 ms frame at a time. `process` returns what is ready, so output lengths vary a
    little around rate_out/rate_in x input.
    """

    def __init__(self, rate_in: int, rate_out: int, quality: str = "LQ") -> None:
        self.rate_in = rate_in
        self.rate_out = rate_out
        self._passthrough = rate_in == rate_out
        self._doubler = _Doubler() if rate_out == 2 * rate_in and quality == "LQ" else None
        self._stream = (
            None
            if self._passthrough or self._doubler is not None
            else soxr.ResampleStream(rate_in, rate_out, 1, dtype="int16", quality=quality)
        )

    def process(self, pcm: np.ndarray, *, last: bool = False) -> np.ndarray:
        """`last`: the stream ends here; what the filter still holds comes out too."""
        if self._doubler is not None:
            return self._doubler.process(pcm, last=last)
        if self._stream is None:
            return pcm.astype(np.int16, copy=False)
        out = self._stream.resample_chunk(pcm.astype(np.int16, copy=False), last=last)
        return np.asarray(out, dtype=np.int16)


class ToRate:
    """A stream of audio at any rate (which may change mid-stream, as a carrier's codec can) converted to
    one rate, with one resampler kept while the rate holds."""

    def __init__(self, rate_out: int) -> None:
        self.rate_out = rate_out
        self._resampler: StreamResampler | None = None

    def convert(self, pcm: np.ndarray, rate: int) -> np.ndarray:
        if rate == self.rate_out:
            return pcm
        if self._resampler is None or self._resampler.rate_in != rate:
            self._resampler = StreamResampler(rate, self.rate_out)
        return self._resampler.process(pcm)


def _halfband_taps(taps: int = 48, beta: float = 8.0, band: float = 0.95) -> np.ndarray:
    """A Kaiser-windowed sinc low-pass at `band` of the input's Nyquist frequency, for doubling the
    rate: flat to 3 kHz from 8 kHz (-0.9 dB at 3.4 kHz), images under -58 dB up to 3.4 kHz."""
    n = np.arange(taps) - (taps - 1) / 2
    h = np.sinc(band * n / 2) * np.kaiser(taps, beta)
    return np.asarray(2.0 * h / h.sum())


class _Doubler:
    """Doubles a stream's rate: each input sample becomes two, from the two phases of a low-pass filter
    (polyphase interpolation). Output is exactly twice the input, frame by frame."""

    _TAPS = _halfband_taps()
    _EVEN, _ODD = _TAPS[0::2], _TAPS[1::2]

    def __init__(self) -> None:
        self._history = np.zeros(self._EVEN.size - 1)

    def process(self, pcm: np.ndarray, *, last: bool = False) -> np.ndarray:
        x = np.concatenate((self._history, pcm.astype(np.float64, copy=False)))
        if last:  # let what the filter holds out
            x = np.concatenate((x, np.zeros(self._history.size)))
        self._history = x[x.size - self._history.size :]
        out = np.empty(2 * (x.size - self._history.size))
        out[0::2] = np.convolve(x, self._EVEN, mode="valid")
        out[1::2] = np.convolve(x, self._ODD, mode="valid")
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)


def _lowpass_taps(factor: int, taps_per_phase: int = 24, beta: float = 8.0, band: float = 0.9) -> np.ndarray:
    """A Kaiser-windowed sinc low-pass at `band` of the lower rate's Nyquist frequency, `factor` phases of
    `taps_per_phase` taps, summing to 1 (a decimation filter; times `factor` it interpolates)."""
    taps = factor * taps_per_phase
    n = np.arange(taps) - (taps - 1) / 2
    h = np.sinc(band * n / factor) * np.kaiser(taps, beta)
    return np.asarray(h / h.sum())


class Upsampler:
    """Multiplies a stream's rate by a whole `factor` (16 kHz to a denoiser's 48 kHz), frame by frame:
    every input sample becomes `factor` at once, from the phases of one low-pass filter. Unlike soxr's
    streams, which hold a whole 20 ms frame back at these rates, it delays the audio under 1 ms."""

    def __init__(self, factor: int) -> None:
        taps = factor * _lowpass_taps(factor)
        self.factor = factor
        self._phases = [taps[p::factor] for p in range(factor)]
        self._history = np.zeros(self._phases[0].size - 1)

    def process(self, pcm: np.ndarray) -> np.ndarray:
        x = np.concatenate((self._history, pcm.astype(np.float64, copy=False)))
        self._history = x[x.size - self._history.size :]
        out = np.empty(self.factor * pcm.size)
        for p, phase in enumerate(self._phases):
            out[p :: self.factor] = np.convolve(x, phase, mode="valid")
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)


class Downsampler:
    """Divides a stream's rate by a whole `factor` (a denoiser's 48 kHz back to 16 kHz), frame by frame:
    one sample out for every `factor` in (what is left over waits for the next frame), low-passed first;
    the audio is delayed under 1 ms. Takes int16 or float samples, gives int16."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self._taps = _lowpass_taps(factor)[::-1].copy()
        self._buffer = np.zeros(self._taps.size - 1)

    def process(self, pcm: np.ndarray) -> np.ndarray:
        x = np.concatenate((self._buffer, pcm.astype(np.float64, copy=False)))
        usable = (x.size - self._taps.size + 1) // self.factor * self.factor
        windows = np.lib.stride_tricks.sliding_window_view(x[: self._taps.size - 1 + usable], self._taps.size)
        out: np.ndarray = windows[self.factor - 1 :: self.factor] @ self._taps
        self._buffer = x[usable:]
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)


class FrameSplitter:
    """Collects audio of any length and hands it out in fixed-size frames."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        data = (
            np.concatenate((self._pending, pcm.astype(np.int16, copy=False))) if self._pending.size else pcm
        )
        count = data.size // self.frame_samples
        frames = [data[i * self.frame_samples : (i + 1) * self.frame_samples] for i in range(count)]
        self._pending = data[count * self.frame_samples :].astype(np.int16, copy=True)
        return frames


def trim_silence(
    pcm: np.ndarray, rate: int, *, floor_dbfs: float = -50.0, leading: bool = True, trailing: bool = True
) -> np.ndarray:
    """Cut the quiet (below `floor_dbfs`, judged per 10 ms) from the start and/or the end of a clip."""
    window = max(1, rate // 100)
    count = pcm.size // window
    if count == 0:
        return pcm
    frames = pcm[: count * window].astype(np.float64).reshape(count, window)
    power = np.maximum(1e-12, (frames**2).mean(axis=1)) / 32768.0**2
    loud = np.flatnonzero(10 * np.log10(power) > floor_dbfs)
    if loud.size == 0:
        return pcm[:0]
    start = loud[0] * window if leading else 0
    end = (loud[-1] + 1) * window if trailing else pcm.size
    return pcm[start:end]


def audio_level_dbov(pcm: np.ndarray) -> int:
    """RFC 6465 audio level (0 loudest .. -127) of int16 audio."""
    return round(max(-127.0, min(0.0, rms_dbfs(pcm))))


# G.711 (ITU-T G.711, bit-exact with its reference code): telephony's 8-bit companding. Each direction
# is one table lookup built at import, since a frame is 160 samples and a call converts 50 frames a
# second each way (measured ~3 us per frame, where a per-sample Python loop costs ~100 us).
_ULAW_BIAS = 0x84
_ULAW_CLIP = 0x1FFF  # largest biased 14-bit magnitude that fits segment 7
_ALAW_CLIP = 0xFFF  # largest 13-bit magnitude


def _ulaw_encode_table() -> np.ndarray:
    # u-law quantises a 14-bit magnitude plus a bias of 33 (G.711 table 2a) in 8 segments of 16 steps.
    x = np.arange(-32768, 32768, dtype=np.int32) >> 2
    magnitude = np.minimum(np.abs(x) + (_ULAW_BIAS >> 2), _ULAW_CLIP)
    segment = np.maximum(np.floor(np.log2(magnitude)).astype(np.int32) - 5, 0)
    code = (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F)
    # u-law sends every bit inverted; the sign bit is set for non-negative samples.
    code ^= np.where(x < 0, 0x7F, 0xFF)
    return _indexed_by_uint16(code)


def _alaw_encode_table() -> np.ndarray:
    # A-law quantises a 13-bit magnitude (one's complement for negatives) in 8 segments of 16 steps;
    # segments 0 and 1 share one step size (G.711 table 1a).
    x = np.arange(-32768, 32768, dtype=np.int32) >> 3
    magnitude = np.minimum(np.where(x < 0, -x - 1, x), _ALAW_CLIP)
    segment = np.maximum(np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 4, 0)
    code = (segment << 4) | ((magnitude >> np.maximum(segment, 1)) & 0x0F)
    # A-law inverts the even bits (0x55) on the line; the sign bit is set for non-negative samples.
    code ^= np.where(x < 0, 0x55, 0xD5)
    return _indexed_by_uint16(code)


def _indexed_by_uint16(code_by_sample: np.ndarray) -> np.ndarray:
    """Reorder a table built for samples -32768..32767 so the uint16 view of a sample indexes it."""
    return np.roll(code_by_sample.astype(np.uint8), -32768)


def _ulaw_decode_table() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    segment = (code >> 4) & 0x07
    magnitude = ((((code & 0x0F) << 3) + _ULAW_BIAS) << segment) - _ULAW_BIAS
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    segment = (code >> 4) & 0x07
    # Each level decodes to the middle of its step: +8 (half a step) in segment 0, +0x108 (the
    # segment's base plus half a step) above it.
    magnitude = np.where(
        segment == 0, ((code & 0x0F) << 4) + 8, (((code & 0x0F) << 4) + 0x108) << np.maximum(segment - 1, 0)
    )
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


_ULAW_ENCODE = _ulaw_encode_table()
_ALAW_ENCODE = _alaw_encode_table()
_ULAW_DECODE = _ulaw_decode_table()
_ALAW_DECODE = _alaw_decode_table()


def _as_uint16(pcm: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(pcm, dtype=np.int16).view(np.uint16)


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples -> G.711 u-law bytes (PCMU), one byte per sample."""
    return bytes(_ULAW_ENCODE[_as_uint16(pcm)].tobytes())


def ulaw_decode(data: bytes) -> np.ndarray:
    """G.711 u-law bytes (PCMU) -> int16 samples."""
    return np.asarray(_ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)])


def alaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples -> G.711 A-law bytes (PCMA), one byte per sample."""
    return bytes(_ALAW_ENCODE[_as_uint16(pcm)].tobytes())


def alaw_decode(data: bytes) -> np.ndarray:
    """G.711 A-law bytes (PCMA) -> int16 samples."""
    return np.asarray(_ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)])
