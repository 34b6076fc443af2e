"""What answering-machine detection hears in a call's audio, chunk by chunk: steady tones (a voicemail's
beep) and speech segments (from the VAD's probabilities). Times are seconds of audio, chunk-exact.

A beep is one frequency: nearly all of a chunk's energy sits in one narrow band of the voice band, and
stays at that frequency from chunk to chunk. Speech never holds one pure frequency that long; a keypad
tone is two frequencies; a ringback tone is two (or pulses of 0.4 s, and it is over once answered).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TONE_BAND_HZ = (300.0, 2500.0)  # beeps are 400-2000 Hz, most near 1 kHz; the phone band carries all
TONE_PURITY = 0.75  # share of the chunk's energy within a few bins of its peak
TONE_MIN_DBFS = -45.0  # quieter than this is line noise, whatever its spectrum
TONE_DRIFT_HZ = 45.0  # a tone's chunks stay this close to its first frequency

SPEECH_ON = 0.5  # the VAD's probability for speech
SPEECH_OFF = 0.35  # ... and below which it ended (hysteresis, as the turn-taker's)
SPEECH_MIN_CHUNKS = 2  # a click is not speech
SPEECH_HANGOVER_CHUNKS = 5  # quiet chunks before speech counts as ended (its end is the last speech chunk)


@dataclass(frozen=True)
class ToneChunk:
    hz: float
    purity: float


def tone_in(chunk: np.ndarray, rate: int) -> ToneChunk | None:
    """The steady tone a chunk of int16 audio holds, if it holds one."""
    x = chunk.astype(np.float64)
    if x.size < 64:
        return None
    mean_square = float(np.dot(x, x)) / x.size
    if mean_square <= 0 or 10 * np.log10(mean_square / 32768.0**2) < TONE_MIN_DBFS:
        return None
    power = np.abs(np.fft.rfft(x * np.hanning(x.size))) ** 2
    total = float(power[1:].sum())
    if total <= 0:
        return None
    bin_hz = rate / x.size
    low, high = int(TONE_BAND_HZ[0] / bin_hz), int(TONE_BAND_HZ[1] / bin_hz) + 1
    peak = low + int(np.argmax(power[low:high]))
    purity = float(power[max(1, peak - 2) : peak + 3].sum()) / total
    if purity < TONE_PURITY:
        return None
    # The peak's frequency, refined between bins (a parabola through the log power of three bins).
    a, b, c = np.log(power[peak - 1 : peak + 2] + 1e-12)
    offset = 0.5 * (a - c) / (a - 2 * b + c) if (a - 2 * b + c) != 0 else 0.0
    return ToneChunk((peak + float(np.clip(offset, -0.5, 0.5))) * bin_hz, purity)


class ToneTracker:
    """Runs of chunks holding the same tone: `push` returns ("tone", start_s) while one sounds and
    ("ended", at_s) the chunk after it stopped; None otherwise."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._start_s: float | None = None
        self._hz = 0.0

    def push(self, chunk: np.ndarray, start_s: float) -> tuple[str, float] | None:
        found = tone_in(chunk, self.rate)
        if found is not None and self._start_s is not None and abs(found.hz - self._hz) <= TONE_DRIFT_HZ:
            return "tone", self._start_s
        if self._start_s is not None:
            self._start_s = None
            if found is None:
                return "ended", start_s
            self._start_s, self._hz = start_s, found.hz  # a new tone at once (a two-tone beep)
            return "ended", start_s
        if found is not None:
            self._start_s, self._hz = start_s, found.hz
            return "tone", start_s
        return None


class SpeechTracker:
    """Speech segments from the VAD's per-chunk probabilities: `push` returns ("began", at_s) at a
    segment's first chunk (once it proved more than a click) and ("ended", at_s) at the end of its last
    speech chunk (once the quiet after it lasted the hangover); None otherwise."""

    def __init__(self, chunk_s: float) -> None:
        self.chunk_s = chunk_s
        self._speaking = False
        self._run = 0  # speech chunks in a row (before a segment began) or quiet ones (inside one)
        self._run_start = 0.0
        self._last_speech_end = 0.0

    def push(self, probability: float, start_s: float) -> tuple[str, float] | None:
        end_s = start_s + self.chunk_s
        if not self._speaking:
            if probability >= SPEECH_ON:
                if self._run == 0:
                    self._run_start = start_s
                self._run += 1
                if self._run >= SPEECH_MIN_CHUNKS:
                    self._speaking, self._run, self._last_speech_end = True, 0, end_s
                    return "began", self._run_start
            else:
                self._run = 0
            return None
        if probability >= SPEECH_OFF:
            self._run, self._last_speech_end = 0, end_s
            return None
        self._run += 1
        if self._run >= SPEECH_HANGOVER_CHUNKS:
            self._speaking, self._run = False, 0
            return "ended", self._last_speech_end
        return None
