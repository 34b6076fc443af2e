"""A reply's audio is made just ahead of what the caller hears, not as fast as it can be."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from parley.call import Call
from parley.config import Settings
from parley.pipeline.messages import Response, Tag
from parley.pipeline.pacing import wait_for_playout
from tests.doubles import ScriptedLlm, ScriptedStt, ToneTts, loud, make_engines, quiet
from tests.unit.test_call import RATE, on_a_line

SENTENCE_S = 1.0  # five words at 0.2 s a word
SENTENCES = 6
REPLY = " ".join(f"Sentence {n} has five words." for n in range(1, SENTENCES + 1))


class TimedTts(ToneTts):
    """A ToneTts that notes when it began each sentence."""

    def __init__(self) -> None:
        super().__init__(seconds_per_word=SENTENCE_S / 5)
        self.began: list[float] = []

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        self.began.append(time.monotonic())
        yield from super().synthesize(text)


def play_a_long_reply(speak_ahead_ms: int) -> tuple[float, TimedTts, float, dict[str, Any]]:
    """A six-second reply to one question: when its first audio was heard, when each sentence was begun,
    the longest silence inside it, and its agent_done event."""
    tts, llm = TimedTts(), ScriptedLlm(reply=REPLY, token_s=0.005)
    settings = Settings(
        greeting="",
        end_of_turn_ms=300,
        reopen_grace_ms=300,
        max_reply_sentences=SENTENCES,
        speak_ahead_ms=speak_ahead_ms,
    )
    call = Call(
        "c-pace", "test", settings, make_engines(llm=llm, tts=tts, stt=ScriptedStt()), outbound_rate=RATE
    )
    with on_a_line(call) as line:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None, timeout=20)
        done = line.event("agent_done")
        sounding = [t for t, sound in line.heard if sound]
    assert done is not None and sounding
    longest_gap = max(b - a for a, b in itertools.pairwise(sounding))
    return sounding[0], tts, longest_gap, done


def test_each_sentence_is_synthesised_shortly_before_it_is_heard() -> None:
    heard_at, tts, longest_gap, done = play_a_long_reply(speak_ahead_ms=1500)
    assert done["interrupted"] is False and done["text"].endswith("Sentence 6 has five words.")
    assert len(tts.began) == SENTENCES
    assert longest_gap < 0.3, f"{longest_gap:.2f} s of silence inside the reply"
    for n, began in enumerate(tts.began):
        due = heard_at + n * SENTENCE_S  # when sentence n starts playing
        assert began < due, f"sentence {n + 1} was late"
        if n >= 2:
            assert began > due - 1.5 - 0.3, f"sentence {n + 1} was made {due - began:.2f} s ahead"


@pytest.mark.slow  # the contrast to the lead test above; make test-all runs it
def test_without_a_lead_the_whole_reply_is_made_at_once() -> None:
    heard_at, tts, _, done = play_a_long_reply(speak_ahead_ms=0)
    assert done["interrupted"] is False
    assert tts.began[-1] - heard_at < 0.5


def test_a_reply_cut_early_leaves_the_rest_unsynthesised() -> None:
    tts, llm = TimedTts(), ScriptedLlm(reply=REPLY, token_s=0.005)
    settings = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300, max_reply_sentences=SENTENCES)
    call = Call(
        "c-cut", "test", settings, make_engines(llm=llm, tts=tts, stt=ScriptedStt()), outbound_rate=RATE
    )
    with on_a_line(call) as line:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(line.playing)
        line.say(loud(1000))
        line.wait(lambda: line.event("agent_done", interrupted=True) is not None)
        assert len(tts.began) <= 4, (
            f"{len(tts.began)} of {SENTENCES} sentences made for a reply cut in its first"
        )


def test_waiting_ends_when_the_audio_has_played_down_to_the_lead() -> None:
    response = Response(Tag("t", 0, 1), audio_s=1.0)
    response.first_audio_at = time.monotonic()
    started = time.monotonic()
    wait_for_playout(response, 0.7, lambda: False)
    assert 0.25 < time.monotonic() - started < 0.5
    assert response.unplayed_s() == pytest.approx(0.7, abs=0.06)


def test_before_it_plays_all_of_a_replys_audio_is_unheard_and_a_stale_reply_stops_waiting() -> None:
    response = Response(Tag("t", 0, 1), audio_s=3.0)
    assert response.unplayed_s() == 3.0
    stale = threading.Event()
    threading.Timer(0.2, stale.set).start()
    started = time.monotonic()
    wait_for_playout(response, 1.0, stale.is_set)
    assert 0.15 < time.monotonic() - started < 0.5
    # No lead, or less unheard than the lead: at once.
    for lead in (0.0, 3.0):
        started = time.monotonic()
        wait_for_playout(response, lead, lambda: False)
        assert time.monotonic() - started < 0.05


def test_a_replys_next_words_wait_for_its_first_audio_at_most_the_limit_after_its_first_piece() -> None:
    response = Response(Tag("t", 0, 1))
    assert response.first_audio_wait_s(0.4) == 0.0  # no piece handed to TTS yet
    response.mark("first_piece")
    assert 0.3 < response.first_audio_wait_s(0.4) <= 0.4
    assert response.first_audio_wait_s(0.0) == 0.0  # no waiting asked for
    response.marks["first_piece"] -= 0.5
    assert response.first_audio_wait_s(0.4) == 0.0  # past the limit
    response.marks["first_piece"] += 0.5
    response.audio_ready.set()
    assert response.first_audio_wait_s(0.4) == 0.0  # its first audio is made
