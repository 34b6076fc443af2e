"""Cuts streamed reply text into pieces worth speaking: an early first clause, then whole sentences.

Speech starts when the first piece is synthesised, so the first piece ends at the first clause
boundary ("Sure, | I can ..."; "I'm sorry, | but ..."), or,
in a sentence without one, before the first word that opens a phrase once four words are in ("The
capital of France | is Paris."); later pieces are sentences, which sound better. The phrase break costs a
little prosody and saves the rest of the sentence's tokens: with Qwen2.5-0.5B on 2 cores (26 tokens/s),
most plain answers are one 6-20 word sentence with no comma.

A first piece ends on its comma or full stop as soon as the model writes it, when it follows a word's
letters ("Sure," "Tokyo."): waiting for the next token to confirm the break costs a decoding step
(~40 ms here) of the caller's wait, and only a number ("1,000", "3.5") or an abbreviation ("Dr.", "e.g.")
goes on after such a mark without a space.

A later piece is cut early too when the audio ahead of it is about to run out (`hurry`): after a short
first piece ("Sure!") a whole 20-word sentence takes the model 1-2 s here, which the caller would hear
as dead air; it gets the first piece's breaks, and failing those, once `HURRY_WORDS` words are in, the
last phrase opener or the last word.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s")
_BOUNDARY = re.compile(r"(?P<sentence>[.!?…]+[\"')\]]*\s)|[,;:—–]\s")
# The last word and the mark the buffer ends on: a letter right before the mark (not a digit).
_MARK_AT_END = re.compile(r"(?:^|\s)(?P<word>\S*[^\W\d_])(?P<mark>[.!?,;:])$")
ABBREVIATIONS = frozenset(
    ("mr", "mrs", "ms", "dr", "st", "vs", "etc", "jr", "sr", "prof", "mt", "no", "approx")
)
_MARKUP = re.compile(r"[*_`#>|]+|\[(.*?)\]\(.*?\)")
_SPACES = re.compile(r"\s+")

# A clause of one word is a phrase of its own ("Sure,", "Yes,", "I'm sorry,"): the model writes on while
# it is said (~0.4 s of audio, a comma's pause after it). At two, "Sure, I can recommend a good book to
# read." waited for its whole sentence, 0.48 s after the first token on a 2-core Xeon (at three, "I'm
# sorry, but ..." waited for the next phrase opener, 6-8 more tokens).
FIRST_CLAUSE_MIN_WORDS = 1
FIRST_PIECE_PHRASE_WORDS = 4  # words before a phrase break may end the first piece
HURRY_OPENER_WORDS = 3  # words before a phrase opener where a hurried later piece may be cut
PHRASE_OPENERS = frozenset((
    "is", "are", "was", "were", "will", "can", "in", "on", "at", "for", "with", "by", "from", "and", "but",
    "or", "because", "which", "that", "who", "when", "where",
))  # fmt: skip
_WORD = re.compile(r"\S+(?=\s)")
LONG_PIECE_WORDS = 28
HURRY_WORDS = 6  # running dry with no break in sight: this many words go out as they are


def _inside_a_name(text: str, mark: int) -> bool:
    """Whether the full stop at `mark` closes an initial or an abbreviation ("F. Scott Fitzgerald", "Dr.
    Seuss", "e.g. tea"), not a sentence: Qwen2.5-Coder-1.5B's book recommendation was cut at "by F."."""
    if text[mark] != ".":
        return False
    word = text[:mark].rsplit(None, 1)[-1] if text[:mark].strip() else ""
    word = word.lstrip("\"'(")
    initial = len(word) == 1 and word.isupper() and word != "I"
    return initial or "." in word or (word.lower() in ABBREVIATIONS and word.lower() != "no")  # "I said no."


def _sentence_ends(text: str) -> Iterator[re.Match[str]]:
    return (m for m in _SENTENCE_END.finditer(text) if not _inside_a_name(text, m.start()))


def split_sentences(text: str) -> list[str]:
    """A piece of reply text as its sentences (the last one may lack its full stop)."""
    sentences, start = [], 0
    for end in _sentence_ends(text + " "):
        sentences.append(text[start : end.end()].strip())
        start = end.end()
    rest = text[start:].strip()
    return [s for s in [*sentences, rest] if s]


def ends_sentence(piece: str) -> bool:
    return piece.rstrip("\"')] ")[-1:] in (".", "!", "?", "…")


def clean_for_speech(text: str) -> str:
    """Drop markdown that a voice cannot say; keep the words."""
    text = _MARKUP.sub(lambda m: m.group(1) or "", text)
    return _SPACES.sub(" ", text).strip()


def _sayable(piece: str) -> bool:
    """Whether a piece has a word or number to say: marks alone ("..", the rest of an ellipsis whose first
    full stop closed the piece before it) are not spoken."""
    return any(c.isalnum() for c in piece)


class ReplySegmenter:
    def __init__(self) -> None:
        self._buffer = ""
        self._pieces_out = 0

    def push(self, delta: str, *, hurry: bool = False) -> list[str]:
        """Add streamed text; return the pieces now complete. `hurry`: the audio already spoken is about
        to run out, so the next piece ends at the first break there is, as the first piece does."""
        self._buffer += delta
        pieces: list[str] = []
        while True:
            cut = self._find_cut(hurry)
            if cut is None:
                break
            hurry = False
            piece = clean_for_speech(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
            if _sayable(piece):
                pieces.append(piece)
                self._pieces_out += 1
        return pieces

    def flush(self) -> list[str]:
        piece = clean_for_speech(self._buffer)
        self._buffer = ""
        return [piece] if _sayable(piece) else []

    def _find_cut(self, hurry: bool) -> int | None:
        if self._pieces_out == 0 or hurry:
            for boundary in _BOUNDARY.finditer(self._buffer):
                if boundary.group("sentence") and _inside_a_name(self._buffer, boundary.start()):
                    continue
                end = boundary.end()
                if boundary.group("sentence") or len(self._buffer[:end].split()) >= FIRST_CLAUSE_MIN_WORDS:
                    return end
            closed = self._closed_at_end()
            if closed is not None:
                return closed
            phrase = self._phrase_break()
            if phrase is not None:
                return phrase
            if hurry and self._pieces_out > 0:
                return self._hurried_cut()
        else:
            sentence = next(_sentence_ends(self._buffer), None)
            if sentence is not None:
                return sentence.end()
        words = self._buffer.split()
        if len(words) > LONG_PIECE_WORDS and self._buffer[-1:].isspace():
            return len(self._buffer)
        return None

    def _closed_at_end(self) -> int | None:
        """The whole buffer, when it ends on a clause or sentence mark right after a word's letters, and
        that mark cannot be the inside of an abbreviation ("Dr.", "e.g.", "U.S.")."""
        match = _MARK_AT_END.search(self._buffer)
        if match is None:
            return None
        word = match.group("word")
        if match.group("mark") == "." and (len(word) < 2 or "." in word or word.lower() in ABBREVIATIONS):
            return None
        return len(self._buffer)

    def _hurried_cut(self) -> int | None:
        """No break yet, and the audio is running dry: once `HURRY_WORDS` words are in, before the last
        phrase opener (three words in or later), or else after the last whole word."""
        words = list(_WORD.finditer(self._buffer))
        if len(words) < HURRY_WORDS:
            return None
        openers = [w.start() for w in words[HURRY_OPENER_WORDS:] if w.group().lower() in PHRASE_OPENERS]
        return openers[-1] if openers else words[-1].end()

    def _phrase_break(self) -> int | None:
        """Where the first phrase opener (a whole word, four words in or later) begins, if any."""
        for index, word in enumerate(_WORD.finditer(self._buffer)):
            if index >= FIRST_PIECE_PHRASE_WORDS and word.group().lower() in PHRASE_OPENERS:
                return word.start()
        return None
