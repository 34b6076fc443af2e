"""Short speech over the agent: a backchannel (it goes on talking) or the caller taking the turn?

Judged from what Whisper made of the sound, never from the sound's length alone (a real "no" is as short
as an "uh"). The agent goes on when Whisper heard:

- nothing lexical: no text, or only its annotations ("(coughs)", "[laughter]", "*sighs*");
- only backchannel words and phrases from the settings' list, in any combination: fillers ("uh", "um",
  "hmm"), exclamations ("oh wow", "ah okay"), acknowledgements ("uh-huh", "yeah", "got it"), laughter
  ("haha"); spelling variants are folded ("hmmm" is "hmm", "hahaha" is "ha"), and one-word backchannels
  written as one word are taken apart (an espeak-ng "uh huh" over SIP came out as "uhuh");
- one word with no content of its own ("the", "them", "and"): what Whisper writes for a sound it heard
  as speech (a "hmm" over Opus came out as "them", -0.65, sure of itself); no one takes the turn with it,
  and one who goes on gets asked about again, with all the words;
- one short word it barely believes (mean log-probability under `min_logprob`, under half a second of
  speech): Whisper guessing a word for a sound, as it does for a throat-clearing ("and", -1.8) or a
  clipped "yeah" ("the", -1.9). Longer speech is words however unsure Whisper is: a "hold on" it heard
  as "Oda." (-1.5) must still stop the agent.

Anything else is the caller talking, filler words first or not ("uh, wait" is "wait"). And one of these
is too, when Whisper gave a word that stops the agent (`COMMAND_WORDS`) at least `min_command_odds` to be
the first it wrote: over G.711 a "stop" loses its "s" and its "p", and Whisper often writes "Uh..." or
"Oh." for it, yet keeps some odds on "Stop" (0.3-16 %, 16 of 20 such checks at 1 % or more, against at
most 0.3 % for any real filler, backchannel, laugh or cough; `bench backchannels`' corpus on 8
espeak-ng voices and Piper's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from parley.engines.stt import Transcription
from parley.text import normalise_words
from parley.turn_settings import TurnSettings

_ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*|♪+")
_REPEATS = re.compile(r"(.)\1+")
_LAUGH = re.compile(r"(?:ha|he){2,}h?|hah|heh|ha")
# Words that say nothing on their own: articles, pronouns, prepositions, conjunctions.
FUNCTION_WORDS = frozenset((
    "a", "an", "the", "and", "or", "of", "to", "in", "on", "at", "as", "it", "its", "them", "they", "him",
    "her", "he", "she", "we", "i", "this", "that", "these", "those",
))  # fmt: skip
RUN_TOGETHER_MIN_PIECE = 2  # "uhuh" is "uh" + "uh"; single letters ("m" + "um": "mum") do not count
UNSURE_MAX_WORDS = 1  # a low-confidence guess of more words than this is still taken as words
UNSURE_MAX_SPEECH_MS = 500.0  # nor is a guess for longer speech: espeak-ng "yeah" 416 ms, "hold on" 736


# How Whisper base writes a few backchannels for some voices or lines: folded into the word that was said,
# whatever backchannels the settings list. "O." for "oh"; "em." for "um" (and for "hmm" over G.711);
# "Ripe." and "Rive" for "right" over G.711 (espeak-ng en-us and four British voices, 5 of the 6 such
# misses in `bench backchannels --voices all`; a carrier stream). None is a word a caller takes the turn
# with.
WHISPER_SPELLINGS = {"o": "oh", "em": "um", "ripe": "right", "rive": "right"}


def fold(word: str) -> str:
    """A word's spelling-independent form: repeated letters once ("hmmm", "hmm" -> "hm"), laughter "ha",
    Whisper's spellings of a backchannel as that backchannel ("ripe" -> "right")."""
    word = _REPEATS.sub(r"\1", word)
    word = WHISPER_SPELLINGS.get(word, word)
    return "ha" if _LAUGH.fullmatch(word) else word


def _phrase(text: str) -> tuple[str, ...]:
    return tuple(fold(w) for w in normalise_words(text).split())


def _heard_words(text: str) -> tuple[str, ...]:
    """The folded words of what Whisper wrote, its annotations ("[laughs]", "(coughs)") left out."""
    return _phrase(_ANNOTATION.sub(" ", text))


# Hesitations that, said alone over the agent, often open the caller's turn ("uh, | wait"): the agent
# waits a little longer before it resumes after one (`filler_silence_ms`). Acknowledgements ("yeah",
# "mm-hmm") ask it to go on, and an "oh" as often says "I see".
TURN_OPENING_FILLERS = frozenset(("uh", "um", "er", "erm"))  # folded: Whisper's "em" is "um"


def is_lone_filler(text: str) -> bool:
    """Whether Whisper heard one hesitation and nothing else ("Uh...", "Umm.")."""
    words = _heard_words(text)
    return len(words) == 1 and words[0] in TURN_OPENING_FILLERS


# Asking the agent to wait, and nothing more: the caller holds the floor. There is nothing to answer, and
# the agent says its `yield_phrase` instead of asking the model (pipeline/replying.py).
_FLOOR_HOLDS = frozenset(
    _phrase(text)
    for text in (
        "wait",
        "stop",
        "hold on",
        "hang on",
        "one moment",
        "one second",
        "one sec",
        "just a moment",
        "just a second",
        "just a sec",
        "wait a moment",
        "wait a second",
        "wait a sec",
        "wait a minute",
        "hold on a moment",
        "hold on a second",
        "hang on a second",
        "give me a moment",
        "give me a second",
    )
)
_BEFORE_A_HOLD = TURN_OPENING_FILLERS | frozenset(_phrase("oh ah no okay ok sorry please"))
_AFTER_A_HOLD = frozenset(_phrase("please sorry"))


def holds_the_floor(text: str) -> bool:
    """Whether the caller only asked the agent to wait: "Wait.", "Uh, hold on, please.", "No, stop, stop."
    ("Wait, what?" and "Stop the order." ask something)."""
    words = list(_heard_words(text))
    while words and words[0] in _BEFORE_A_HOLD:
        words.pop(0)
    while words and words[-1] in _AFTER_A_HOLD:
        words.pop()
    said = tuple(words)
    # one hold, or the same said again ("wait, wait")
    return bool(said) and any(said == hold * (len(said) // len(hold)) for hold in _FLOOR_HOLDS)


# Words that take the floor at once, and which Whisper may write as a filler over a phone line.
COMMAND_WORDS = ("stop", "wait", "hold", "hang")


@dataclass(frozen=True)
class Verdict:
    backchannel: bool
    reason: str  # "no words", "backchannel", "no content", "unsure", "words", "command odds"
    heard: str  # the words Whisper heard, as it wrote them


class BackchannelJudge:
    """Decides, from a transcription, whether speech over the agent was a backchannel. Thread-safe."""

    def __init__(self, phrases: Iterable[str], min_logprob: float, min_command_odds: float = 0.0) -> None:
        self._phrases = {p for p in (_phrase(text) for text in phrases) if p}
        self._longest = max((len(p) for p in self._phrases), default=1)
        self._pieces = {p[0] for p in self._phrases if len(p) == 1 and len(p[0]) >= RUN_TOGETHER_MIN_PIECE}
        self.min_logprob = min_logprob
        self.min_command_odds = min_command_odds
        # What the transcription must weigh for this judge (engines/stt.py: `transcribe(weigh=...)`).
        self.weigh = COMMAND_WORDS if min_command_odds > 0 else ()

    @classmethod
    def for_settings(cls, settings: TurnSettings) -> BackchannelJudge:
        return cls(settings.backchannels, settings.backchannel_min_logprob, settings.backchannel_command_odds)

    def judge(self, heard: Transcription, speech_ms: float) -> Verdict:
        """`speech_ms`: how much of the audio the VAD took for speech."""
        verdict = self._by_words(heard, speech_ms)
        if verdict.backchannel and self.weigh and heard.odds_of(self.weigh) >= self.min_command_odds:
            return Verdict(False, "command odds", heard.text)
        return verdict

    def asks_to_wait(self, text: str, command_odds: float) -> bool:
        """Whether a turn only asks the agent to wait: in so many words ("Hold on, please."), or as a
        filler or backchannel Whisper thought might be a "stop" or a "wait" (the turn after a "stop" over
        G.711 that cut the agent on those odds is written "Uh..." too)."""
        if holds_the_floor(text):
            return True
        words = self._taken_apart(_heard_words(text))
        return bool(self.weigh) and command_odds >= self.min_command_odds and self.only_backchannels(words)

    def _by_words(self, heard: Transcription, speech_ms: float) -> Verdict:
        words = self._taken_apart(_heard_words(heard.text))
        if not words:
            return Verdict(True, "no words", heard.text)
        if self.only_backchannels(words):
            return Verdict(True, "backchannel", heard.text)
        if len(words) == 1 and words[0] in FUNCTION_WORDS:
            return Verdict(True, "no content", heard.text)
        if (
            len(words) <= UNSURE_MAX_WORDS
            and speech_ms < UNSURE_MAX_SPEECH_MS
            and heard.avg_logprob < self.min_logprob
        ):
            return Verdict(True, "unsure", heard.text)
        return Verdict(False, "words", heard.text)

    def _taken_apart(self, words: tuple[str, ...]) -> tuple[str, ...]:
        """Each word that is one-word backchannels run together ("uhuh", "okayokay") as those words."""
        out: list[str] = []
        for word in words:
            out.extend(self._split(word) if (word,) not in self._phrases else [word])
        return tuple(out)

    def _split(self, word: str) -> list[str]:
        """`word` as a run of one-word backchannels (each folded), or as it is when it is not one."""
        splits: list[list[str] | None] = [[]] + [None] * len(word)
        for end in range(RUN_TOGETHER_MIN_PIECE, len(word) + 1):
            for start in range(0, end - RUN_TOGETHER_MIN_PIECE + 1):
                before = splits[start]
                if before is not None and fold(word[start:end]) in self._pieces:
                    splits[end] = [*before, fold(word[start:end])]
                    break
        found = splits[-1]
        return found if found and len(found) > 1 else [word]

    def only_backchannels(self, words: tuple[str, ...]) -> bool:
        """Whether the words split into backchannel phrases ("oh" + "i see"), however many."""
        reachable = [True] + [False] * len(words)
        for end in range(1, len(words) + 1):
            reachable[end] = any(
                reachable[start] and words[start:end] in self._phrases
                for start in range(max(0, end - self._longest), end)
            )
        return reachable[-1]
