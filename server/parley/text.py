"""The one text normaliser: what transcripts, word lists and expected answers are compared as; and the
numbers said in a text, however they were written."""

from __future__ import annotations

import re

_NOT_A_WORD = re.compile(r"[^a-z0-9']+")


def normalise_words(text: str) -> str:
    """Lower case, words and digits separated by single spaces; apostrophes stay ("i'm"), every other
    mark separates ("uh-huh" -> "uh huh", "Oh, wow!" -> "oh wow")."""
    return " ".join(word.strip("'") for word in _NOT_A_WORD.sub(" ", text.lower()).split() if word.strip("'"))


DIGIT_WORDS = {
    "zero": "0", "oh": "0", "o": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9",
}  # fmt: skip
_REPEATS = {"double": 2, "triple": 3}  # "double nine" is 99
_TOKEN = re.compile(r"[a-z0-9]+")


def digit_runs(text: str) -> list[str]:
    """The numbers read out in `text`, as figures: "503 555-0198", "five oh three" and "seven seven
    eight, double nine" are runs of digits however they are grouped or said."""
    runs: list[str] = []
    run = ""
    repeat = 1
    for token in _TOKEN.findall(text.lower()):
        if token in _REPEATS:
            repeat = _REPEATS[token]
            continue
        digits = token if token.isdigit() else DIGIT_WORDS.get(token)
        if digits is not None:
            run += digits * repeat if len(digits) == 1 else digits
        elif run:
            runs.append(run)
            run = ""
        repeat = 1
    return [*runs, run] if run else runs
