"""What Whisper's output means: timestamped segments, the odds of a first word, and text to keep.

The STT engine (`engines/stt.py`) batches and runs the model; this module reads what comes back. It also
knows where to cut a long utterance between two windows and where the speech in a window really ends,
since both decide which of Whisper's segments are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parley.text import normalise_words

SAMPLE_RATE = 16000
TIME_PRECISION = 0.02  # seconds per Whisper timestamp token
SEGMENT_SLACK_S = 0.2
CUT_FRAME = 320  # 20 ms
CUT_SEARCH = 100 * CUT_FRAME  # look for a pause in the last 2 s of a window
SILENT_PEAK = 1e-3  # about -60 dBFS: nothing Whisper could hear
MAX_TEXT_CHARS = 2000

# What Whisper says when it hears nothing: its training data had these under silent video ends.
HALLUCINATIONS = frozenset(
    {
        "you",
        "thank you",
        "thanks",
        "thank you very much",
        "thanks for watching",
        "thank you for watching",
        "thank you so much for watching",
        "please subscribe",
        "subtitles by the amara org community",
    }
)


@dataclass(frozen=True)
class Segment:
    start: float  # seconds into the window
    text: str
    complete: bool  # closed by an end timestamp; an open one ran past the end of the window


def quiet_cut(samples: np.ndarray, end: int) -> int:
    """The quietest 20 ms in the 2 s before `end`: where a long utterance is cut between two windows."""
    frames = samples[end - CUT_SEARCH : end].reshape(-1, CUT_FRAME)
    quietest = int(np.argmin(np.square(frames).mean(axis=1)))
    return end - CUT_SEARCH + quietest * CUT_FRAME + CUT_FRAME // 2


def speech_end(samples: np.ndarray) -> float:
    """Seconds until the last sound within 34 dB of the peak, plus Whisper's timestamp slack.

    Whisper's timestamps are coarse: after "thank you" it may close the segment at 1.00 s and start the
    same words again there, in the trailing silence. A segment that starts after the last sound is that.
    On a noisy line the floor reaches the end and nothing is dropped.
    """
    level = max(SILENT_PEAK, 0.02 * float(np.max(np.abs(samples))))
    loud = np.flatnonzero(np.abs(samples) >= level)
    last = int(loud[-1]) if loud.size else samples.size
    return last / SAMPLE_RATE + SEGMENT_SLACK_S


def clean(text: str, no_speech_prob: float, avg_logprob: float) -> str:
    """The text as the caller said it, or "" where Whisper heard silence or invented its usual words."""
    text = " ".join(text.split())[:MAX_TEXT_CHARS]
    # Whisper's own rule for a silent window, then its usual inventions on noise.
    if no_speech_prob > 0.6 and avg_logprob < -1.0:
        return ""
    if no_speech_prob > 0.3 and normalise_words(text) in HALLUCINATIONS:
        return ""
    return text


class WhisperTokens:
    """Reads Whisper's token ids with its tokenizer (a `tokenizers.Tokenizer`)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.eot: int = tokenizer.token_to_id("<|endoftext|>")
        self.timestamp_begin: int = tokenizer.token_to_id("<|notimestamps|>") + 1
        self._tokens_of: dict[str, tuple[int, ...]] = {}

    def segments(self, ids: Sequence[int]) -> tuple[Segment, ...]:
        """Split a timestamped decode (<|t0|> text <|t1|><|t1|> text <|t2|> ...) into segments."""
        segments: list[Segment] = []
        text: list[int] = []
        start: float | None = None
        for token in ids:
            if token >= self.timestamp_begin:
                at = (token - self.timestamp_begin) * TIME_PRECISION
                if start is None:
                    start = at
                else:
                    segments.append(Segment(start, self._tokenizer.decode(text).strip(), True))
                    text, start = [], None
            elif token < self.eot:
                text.append(token)
        if start is not None or text:
            segments.append(Segment(start or 0.0, self._tokenizer.decode(text).strip(), False))
        return tuple(segments)

    def first_word_odds(self, weigh: tuple[str, ...], result: Any) -> dict[str, float]:
        """The odds Whisper gave each word of `weigh` to be the first it wrote: its distribution over text
        tokens where the decode (a CTranslate2 WhisperGenerationResult with logits) wrote its first one."""
        ids = result.sequences_ids[0]
        first = next((i for i, token in enumerate(ids) if token < self.eot), None)
        if not weigh or first is None or first >= len(result.logits[0]):
            return {}
        logits = np.asarray(result.logits[0][first], dtype=np.float64).reshape(-1)[: self.eot]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return {word: float(sum(p[t] for t in self.word_tokens(word))) for word in weigh}

    def word_tokens(self, word: str) -> tuple[int, ...]:
        """The tokens that write `word` whole at the start of a text: " Stop" and " stop"; none when
        the word takes more than one token (its first piece would stand for other words too)."""
        tokens = self._tokens_of.get(word)
        if tokens is None:
            spelt = {
                tuple(self._tokenizer.encode(f" {form}", add_special_tokens=False).ids)
                for form in (word.capitalize(), word)
            }
            tokens = tuple(ids[0] for ids in spelt if len(ids) == 1)
            self._tokens_of[word] = tokens
        return tokens
