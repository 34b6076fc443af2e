"""What a reply to a question is judged: right, wrong, or one of the failure shapes a small model has.

A reply is right when it holds what the question expects (bench/answer_sets.py), whatever else it says.
A reply that is not right is told apart by its shape, because each has its own cure: a refusal of a
plain question ("I'm unable to...", "as an AI..."), a non-answer that talks about itself instead ("as a
voice assistant, I ..."), and condolences out of nowhere ("I'm sorry for your loss"; no question in the
sets brings bad news). What has none of these shapes is simply wrong.
"""

from __future__ import annotations

import re
from typing import Literal

from parley.bench.answer_sets import Question
from parley.text import DIGIT_WORDS, digit_runs

Verdict = Literal["right", "wrong", "refusal", "non-answer", "condolence"]
VERDICTS: tuple[Verdict, ...] = ("right", "wrong", "refusal", "non-answer", "condolence")
Shape = Literal["refusal", "non-answer", "condolence"]

# Matched on normalised text (lower case, apostrophes straight, punctuation gone). In this order: the
# README's picture ("I'm sorry for your loss, but as a voice assistant, I don't have the ability to
# recommend books") has all three, and the condolence is what makes it absurd.
SHAPES: tuple[tuple[Shape, re.Pattern[str]], ...] = (
    (
        "condolence",
        re.compile(
            r"\b(sorry (for|about) (your|the) loss|condolences?|sympath(y|ies)|passed away|rest in peace"
            r"|griev(e|ing)|my heart goes out)\b"
        ),
    ),
    (
        "refusal",
        re.compile(
            r"\b(i can't|i cannot|i can not|i'm unable|i am unable|unable to|i'm not able|i am not able"
            r"|i'm not capable|i am not capable|i'm not allowed|i am not allowed|i won't be able"
            r"|i will not be able|i (don't|do not) have (the ability|access|personal|real-time|real time)"
            r"|as an? (ai|artificial intelligence|language model)|i'm (just )?an ai|i am (just )?an ai"
            r"|ai (language )?model)\b"
        ),
    ),
    (
        "non-answer",
        re.compile(
            r"\b(voice assistant|virtual assistant"
            r"|as (a|an|your) ([a-z-]+ ){0,2}(assistant|receptionist|agent|bot|chatbot))\b"
        ),
    ),
)


def normalise(text: str) -> str:
    """Lower case, words and digits only (figures apart from the letters after them: "6pm" is "6 pm"):
    what the expected words are compared with."""
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    text = re.sub(r"(?<=\d)(?=[a-z])|(?<=[a-z])(?=\d)", " ", text)
    return " ".join("".join(c if c.isalnum() or c in "'-" else " " for c in text).split())


def is_right(question: Question, answer: str) -> bool:
    """True when the answer holds a word (or phrase) of every expected group ("word*" is any word that
    starts so), spells out what it must spell, and reads back the number it must."""
    words = f" {normalise(answer)} "
    return (
        all(any(_holds(words, option) for option in group) for group in question.expect)
        and (not question.spelled or any(question.spelled in run for run in spelled_words(answer)))
        and (not question.digits or any(question.digits in run for run in digit_runs(answer)))
    )


def _holds(words: str, option: str) -> bool:
    if option.endswith("*"):
        return f" {normalise(option[:-1])}" in words
    return f" {normalise(option)} " in words


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def spelled_words(text: str) -> list[str]:
    """The runs of letters said one by one in `text` ("K-E-S-T-R-E-L", "k, e, s, t"), as words; a run may
    take in a one-letter word beside it ("it's K-E-S..." gives "skes..."), so look for a word inside."""
    runs: list[str] = []
    run = ""
    for token in _tokens(text):
        if len(token) == 1 and token.isalpha():
            run += token
            continue
        if run:
            runs.append(run)
        run = ""
    return [*runs, run] if run else runs


NUMBER_WORDS = {
    **{w: d for w, d in DIGIT_WORDS.items() if w not in ("oh", "o")},
    "ten": "10", "eleven": "11", "twelve": "12", "twenty": "20", "hundred": "100",
}  # fmt: skip


def same_words(heard: str, said: str) -> bool:
    """Whether a transcript has the words said, word for word: a number in figures ("2 plus 2") is the
    same word as written out, as Whisper writes what it hears either way."""

    def words(text: str) -> list[str]:
        return [NUMBER_WORDS.get(w, w) for w in normalise(text).split()]

    return words(heard) == words(said)


def shapes(reply: str) -> list[Shape]:
    """The failure shapes a reply has, the most telling first (a right reply may have some too)."""
    text = normalise(reply)
    return [shape for shape, pattern in SHAPES if pattern.search(text)]


def verdict(question: Question, reply: str) -> Verdict:
    if is_right(question, reply):
        return "right"
    found = shapes(reply)
    return found[0] if found else "wrong"
