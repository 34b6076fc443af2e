"""Keypad digits as in-band tones, for lines that carry audio but no digit events.

A carrier's media stream takes only `media`, `mark` and `clear` from us (Twilio's and Telnyx's
documented messages), so a digit has to be sound: the two frequencies of ITU-T Q.23 for its key, 100 ms
of tone and 60 ms of silence (Q.24 asks receivers to take 40 ms tones and 40 ms pauses; the margin is for
the carrier's transcoding). G.711 carries them intact, and the far end's detector hears a key press.
"""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np

ROWS_HZ = (697, 770, 852, 941)  # the low group (Q.23)
COLUMNS_HZ = (1209, 1336, 1477, 1633)  # the high group
LAYOUT = ("123A", "456B", "789C", "*0#D")
TONE_MS = 100
GAP_MS = 60
# Levels in dBm0: the high group 2 dB above the low ("positive twist"), as telephones send, both well
# inside Q.24's acceptance window. A full-scale sine is +3.14 dBm0 in G.711.
LOW_DBM0 = -10.0
HIGH_DBM0 = -8.0
FULL_SCALE_DBM0 = 3.14


def _amplitude(dbm0: float) -> float:
    return 32767 * 10 ** ((dbm0 - FULL_SCALE_DBM0) / 20)


def key_frequencies(key: str) -> tuple[int, int]:
    for row, keys in enumerate(LAYOUT):
        column = keys.find(key)
        if column >= 0:
            return ROWS_HZ[row], COLUMNS_HZ[column]
    raise ValueError(f"{key!r} is not a DTMF key")


def dtmf_pcm(keys: str, rate: int) -> np.ndarray:
    """The tones of `keys` (already checked, upper case), each followed by its pause, as int16 at `rate`."""
    tone = np.arange(rate * TONE_MS // 1000) / rate
    gap = np.zeros(rate * GAP_MS // 1000, dtype=np.int16)
    parts = []
    for key in keys:
        low, high = key_frequencies(key)
        wave = _amplitude(LOW_DBM0) * np.sin(2 * np.pi * low * tone)
        wave += _amplitude(HIGH_DBM0) * np.sin(2 * np.pi * high * tone)
        parts += [np.round(wave).astype(np.int16), gap]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)


class KeypadTones:
    """Tone frames waiting to take the place of the agent's audio on a paced sender, and the callers
    waiting for them to go out. Used on the event loop only."""

    def __init__(self, rate: int, frame_samples: int) -> None:
        self.rate = rate
        self.frame_samples = frame_samples
        self.playing = False  # the frame last taken was a tone frame (its pauses are sent too)
        self._frames: deque[tuple[np.ndarray, asyncio.Future[None] | None]] = deque()

    def add(self, keys: str) -> asyncio.Future[None]:
        """Queue the keys' frames; the future is done once the last of them has been taken."""
        pcm = dtmf_pcm(keys, self.rate)
        pcm = np.concatenate([pcm, np.zeros(-pcm.size % self.frame_samples, dtype=np.int16)])
        frames = pcm.reshape(-1, self.frame_samples)
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for i, frame in enumerate(frames):
            self._frames.append((frame, sent if i == len(frames) - 1 else None))
        return sent

    def next_frame(self) -> np.ndarray | None:
        """The next tone frame, or None when no digit is waiting."""
        if not self._frames:
            self.playing = False
            return None
        frame, sent = self._frames.popleft()
        if sent is not None and not sent.done():
            sent.set_result(None)
        self.playing = True
        return frame

    def cancel(self) -> None:
        """The line closed: nobody will take the frames."""
        while self._frames:
            _, sent = self._frames.popleft()
            if sent is not None and not sent.done():
                sent.cancel()
        self.playing = False
