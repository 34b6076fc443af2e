"""How loud the caller's speech is, so that the end of a turn counts the silence that really follows it.

Silero's speech probability lags behind the audio: its recurrent state keeps a chunk or two after the
last word at 0.6-0.98, and the hysteresis band below the threshold counts as neither speech nor silence.
Measured on the benchmarks' questions over G.711, the VAD's last "speech" chunk came up to 64 ms after
the speech had stopped, and every turn ended that much later than its `end_of_turn_ms` of silence.

A chunk far quieter than the caller's own speech in this turn (`QUIET_BELOW_DB` under the mean level of
its speech chunks) is taken for silence whatever Silero says. On a clean line that is the lagging chunks
after the last word; on a noisy one (noise within 30 dB of the speech) the rule never fires and Silero
decides alone. Quiet chunks inside a sentence (a stop's closure, a gap between words) count as silence
too, but only a run of them as long as `end_of_turn_ms` ends a turn, and a pause that long is silence
to Silero as well, a chunk or two later.
"""

from __future__ import annotations

QUIET_BELOW_DB = 30.0  # a chunk this far under the turn's mean speech level is silence


class SpeechLevel:
    """The mean level of one stretch of speech (a turn, from its onset), and which chunks are quiet."""

    def __init__(self) -> None:
        self._sum_db = 0.0
        self._chunks = 0

    def heard_speech(self, level: float) -> None:
        """A chunk the VAD called speech, at `level` dB."""
        self._sum_db += level
        self._chunks += 1

    def is_quiet(self, level: float) -> bool:
        """Whether a chunk at `level` dB is far under this speech (False before any speech was heard)."""
        if not self._chunks:
            return False
        return level < self._sum_db / self._chunks - QUIET_BELOW_DB
