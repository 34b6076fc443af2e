"""A caller who never stops talking: `max_turn_s` caps each utterance, so the transcription work per turn
stays bounded however long the speech goes on (each capped turn is transcribed once, never grown and
transcribed again as a revision of itself)."""

from __future__ import annotations

import time

import numpy as np

from parley.config import Settings
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.pipeline.turntaking import TurnTaker
from tests.unit.test_turntaking import Control

CHUNK = np.ones(512, dtype=np.int16)  # 32 ms at 16 kHz
CHUNK_MS = 32.0


def test_continuous_speech_is_cut_into_capped_turns_never_grown_revisions() -> None:
    settings = Settings(max_turn_s=1.0, min_speech_ms=96, end_of_turn_ms=256, reopen_grace_ms=500)
    control = Control()
    turns = TurnTaker(settings, SpeculativeTurnTracker(), control, CHUNK_MS)
    start = time.monotonic()
    for i in range(int(8000 / CHUNK_MS)):  # 8 s of speech without a pause
        turns.process(CHUNK, 1.0, start + i * CHUNK_MS / 1000)
    assert len(control.ended) >= 5, control.ended
    cap = int(settings.max_turn_s * 16000) + 2 * CHUNK.size  # the cap, within a chunk or two
    for turn_id, revision, samples in control.ended:
        assert revision == 0, f"{turn_id} was reopened as revision {revision}: {control.ended}"
        assert samples <= cap, f"{turn_id} holds {samples / 16000:.2f} s: {control.ended}"
    assert sum(samples for _, _, samples in control.ended) <= 8 * 16000 + len(control.ended) * CHUNK.size * 10
