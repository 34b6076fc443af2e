"""A turn whose words stop where no sentence ends is held longer before its reply is heard.

A turn ends after `end_of_turn_ms` of silence and its reply is held `reopen_grace_ms` more (0.55 s in
all by default). A caller silent for longer in the middle of a sentence ("I'd like to book a table for
... two people") heard a reply to half a question begin, then cut by their own next words. The
transcript is ready before that hold is over (speculation starts Whisper at the first silent chunk), and
where it ends on a word that almost never ends an English sentence (an article, a conjunction, "to",
"for", "with", a possessive, a hesitation), the reply is held until `unfinished_hold_ms` after the end of
the turn instead. The turn stays open to a reopen all that time (pipeline/reopening.py): the caller who
goes on is answered once, for the whole question; one who really stopped there is answered a little
later, as a person who waited for the rest would.

Only the last word counts, and only words that a sentence ends on so rarely that a false hold (a delay,
never a lost word) costs less than the reply it saves: "from", "like", "in" and "on" end ordinary
questions ("Where are you from?", "What is the weather like?") and are not on the list; "to", "for",
"with", "about" and "of" end a wh-question ("What is it about?"), which is not held. A weak last word
the VAD does not hear as speech ("a story about | the ...") leaves the word before it last. The
list (`DEFAULT_UNFINISHED_WORDS`, turn_settings.py) is English; `--unfinished-words` sets another, and
`--unfinished-hold-ms 0` turns the hold off.

A number read out in parts is held the same way. Callers read an order or phone number in groups and
pause between them ("The number is four seven ... one two"); Whisper writes the first part as a whole
sentence ("The number is 47."), and a reply to it looks up the wrong number. A turn is held when it
names what the number is (`--number-words`: "number", "order", "account", "phone"...) and ends on
three digits or fewer, or on a group of three after others ("503 555"). A number of four digits or more
that ends otherwise ("4712", or "1, 2, 3, 4" as Whisper writes one read digit by digit) is taken as
whole, so a caller who gave it all is not kept waiting.
"""

from __future__ import annotations

from collections.abc import Iterable

from parley.text import DIGIT_WORDS, digit_runs, normalise_words
from parley.turn_settings import TurnSettings

# A question that opens with one of these may end on its preposition ("Who are you talking to?", "What
# is it for?"): ending there, it is taken as finished. Whisper base wrote all such test questions with
# their preposition last, in espeak-ng's voice and Piper's, wideband and over G.711.
WH_WORDS = frozenset(("what", "who", "whom", "which", "where"))
STRANDABLE = frozenset(("to", "for", "with", "about", "of"))
WH_WITHIN = 3  # the wh-word among the first words ("So, who are you talking to?")
GROUP_DIGITS = 3  # numbers are read in groups of up to three digits ("503 555 0198")


def looks_unfinished(text: str, words: Iterable[str]) -> bool:
    """Whether a transcript's last word is one of `words` (case and punctuation aside), unless it is a
    preposition a wh-question ends on: "Can you tell me the way to?" is unfinished; "Where are you from?"
    and "Who are you talking to?" are not."""
    said = normalise_words(text).split()
    if not said or said[-1] not in {word.lower() for word in words}:
        return False
    if said[-1] == "a" and len(said) > 1 and _last_word(text) == "A":
        return False  # the letter: "Plan A.", "vitamin A" (Whisper writes the article lower-case)
    return not (said[-1] in STRANDABLE and WH_WORDS.intersection(said[:WH_WITHIN]))


def reads_a_number_in_part(text: str, number_words: Iterable[str]) -> bool:
    """Whether a transcript names a number being given and stops on what looks like part of it: three
    digits or fewer in all ("My order number is 47.", "the code is five oh three"), or a group of three
    after others ("My phone number is 503 555"). "My order number is 4712.", "order 1, 2, 3, 4",
    "A table for 2." and "I'll take the red one." are not."""
    said = normalise_words(text).split()
    if not {word.lower() for word in number_words}.intersection(said):
        return False
    last = said[-1]
    if not (last.isdigit() or last in DIGIT_WORDS):
        return False  # the words go on past the last number
    run = digit_runs(text)[-1]  # the digits they end on, however grouped or said
    if not last.isdigit() and len(run) < 2:
        return False  # a lone "one" or "oh" is seldom a number read out
    return len(run) <= GROUP_DIGITS or (last.isdigit() and len(last) == GROUP_DIGITS)


def _last_word(text: str) -> str:
    words = text.replace("...", " ").split()
    return words[-1].strip(".,!?;:…\"'") if words else ""


def hold_until(text: str, speech_end: float, settings: TurnSettings) -> float:
    """When a reply to `text` may first be heard, by these rules: 0.0 when it does not hold it (the turn's
    grace alone decides), else `unfinished_hold_ms` after the turn ended (`speech_end`: when its speech
    did, on time.monotonic()'s clock)."""
    if settings.unfinished_hold_ms <= 0:
        return 0.0
    if not (
        looks_unfinished(text, settings.unfinished_words)
        or reads_a_number_in_part(text, settings.number_words)
    ):
        return 0.0
    return speech_end + (settings.end_of_turn_ms + settings.unfinished_hold_ms) / 1000
