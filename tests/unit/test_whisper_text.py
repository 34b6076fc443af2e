"""Reading Whisper's output: segments from timestamp tokens, which text is kept, where speech ends."""

from __future__ import annotations

import numpy as np

from parley.engines.whisper_text import SAMPLE_RATE, WhisperTokens, clean, quiet_cut, speech_end

EOT = 50256
NO_TIMESTAMPS = 50362
T0 = NO_TIMESTAMPS + 1  # <|0.00|>; each next id is 20 ms later


class _Tokenizer:
    """Words are ids 1..n of a small vocabulary; the special tokens sit where Whisper's English ones do."""

    words = ("", " hello", " there", " again")

    def token_to_id(self, token: str) -> int:
        return {"<|endoftext|>": EOT, "<|notimestamps|>": NO_TIMESTAMPS}[token]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)


def test_a_timestamped_decode_splits_into_closed_segments_and_an_open_last_one() -> None:
    tokens = WhisperTokens(_Tokenizer())
    ids = [T0, 1, 2, T0 + 50, T0 + 60, 3, EOT]
    segments = tokens.segments(ids)
    assert [(s.start, s.text, s.complete) for s in segments] == [
        (0.0, "hello there", True),
        (1.2, "again", False),
    ]


def test_silence_and_whispers_usual_inventions_are_not_kept() -> None:
    assert clean("  Thank   you. ", no_speech_prob=0.5, avg_logprob=-0.3) == ""
    assert clean("Thank you.", no_speech_prob=0.1, avg_logprob=-0.3) == "Thank you."
    assert clean("Anything at all", no_speech_prob=0.9, avg_logprob=-1.5) == ""
    assert clean("What  time is it?", no_speech_prob=0.9, avg_logprob=-0.2) == "What time is it?"


def test_speech_ends_at_the_last_sound_and_a_long_utterance_is_cut_in_its_quietest_moment() -> None:
    samples = np.zeros(4 * SAMPLE_RATE, dtype=np.float32)
    samples[:SAMPLE_RATE] = 0.3  # one second of sound, then silence
    assert abs(speech_end(samples) - 1.2) < 0.01
    loud = np.full(4 * SAMPLE_RATE, 0.3, dtype=np.float32)
    loud[3 * SAMPLE_RATE : 3 * SAMPLE_RATE + 640] = 0.0  # a 40 ms gap one second before the end
    cut = quiet_cut(loud, loud.size)
    assert 3 * SAMPLE_RATE <= cut <= 3 * SAMPLE_RATE + 640
