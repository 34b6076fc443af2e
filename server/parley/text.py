"""The one text normaliser: what transcripts, word lists and expected answers are compared as."""

from __future__ import annotations

import re

_NOT_A_WORD = re.compile(r"[^a-z0-9']+")


def normalise_words(text: str) -> str:
    """Lower case, words and digits separated by single spaces; apostrophes stay ("i'm"), every other
    mark separates ("uh-huh" -> "uh huh", "Oh, wow!" -> "oh wow")."""
    return " ".join(word.strip("'") for word in _NOT_A_WORD.sub(" ", text.lower()).split() if word.strip("'"))
