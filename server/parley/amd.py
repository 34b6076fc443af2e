"""Answering-machine detection: who picked up an outbound call, from what its audio shows.

Pure logic over items, in seconds of the call's audio since it was answered (no clock of its own, so
it is tested and benchmarked without real time): speech segments (from the VAD), tones (amd_audio.py)
and transcripts (Whisper). `decide(now_s)` gives a `Verdict` once it can:

- a steady tone (a beep) before any verdict: `machine`;
- words that only a recording or a menu says: "leave a message", "after the tone", "voicemail" ->
  `machine`; "press 1", "for sales press" -> `ivr` (words that a greeting and a menu both say only rule
  out a person: the verdict then waits for more words, up to `decide_by_s`, and is `ivr` by then if they
  open a menu, "Thank you for calling Acme", else `machine`, "You've reached Dana");
- a short answer, then the pause of someone waiting for a reply ("Hello?" ...): `human`; a longer one
  ending in a question ("Dana speaking, who's this?") also;
- talk going on without such a pause for `greeting_s` and more: `machine` (`ivr` if its words say so) by
  `decide_by_s` at the latest, earlier once words say which;
- nobody speaking for `silence_s`: `unknown`.

After a `machine` verdict, `message_due(now_s)` says when a message left now is recorded: once the beep
has ended; with no beep, once the greeting has been quiet for `quiet_after_greeting_s`; at
`message_by_s` whatever it is still saying.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Result = Literal["human", "machine", "ivr", "unknown"]
RESULTS: tuple[Result, ...] = ("human", "machine", "ivr", "unknown")

# Words only a recorded greeting says (Whisper's spelling, lowercased, punctuation dropped).
_MACHINE = re.compile(
    r"\b(leave (me |us )?(a|your) (message|name)|after the (tone|beep)|at the (tone|beep)|voice ?mail|"
    r"mailbox|(not|un) ?available|can ?not take|can'?t take|come to the phone|away from (my|the) phone|"
    r"not (here|around|in) right now|unable to (take|answer)|record your|get back to you|"
    r"return your call|missed your call)\b"
)
# Words only a menu says.
_IVR = re.compile(
    r"\b(press(ing)? (\d|one|two|three|four|five|six|seven|eight|nine|zero|star|pound)|"
    r"for [a-z ]{2,30} press|para espa|main menu|menu options|options have changed|say or press|"
    r"enter your|dial (\d|by name)|extension)\b"
)
# Words a greeting or a menu says, and a person picking up rarely does: a business's menu opens with the
# second kind ("Thank you for calling Acme. For sales, press one" names its keys seconds later).
_RECORDED = re.compile(r"\b(you('ve| have) reached|this is the voicemail|sorry i missed)\b")
_OPENING = re.compile(
    r"\b(thank(s| you) for calling|welcome to|listen carefully|your call is important|"
    r"calls? (is|are|may be) recorded|if you know your party)\b"
)
Said = Literal["machine", "ivr", "opening", "recorded", ""]
_RANK: dict[str, int] = {"": 0, "recorded": 1, "opening": 2, "ivr": 3, "machine": 4}


def words_say(text: str) -> Said:
    """What a transcript's words alone say: a greeting's (machine), a menu's (ivr), or either, as a
    menu opens (opening) or as anything recorded (recorded); or nothing."""
    plain = re.sub(r"[^a-z0-9' ]+", " ", text.lower())
    plain = re.sub(r"\s+", " ", plain).strip()
    if _MACHINE.search(plain):
        return "machine"
    if _IVR.search(plain):
        return "ivr"
    if _OPENING.search(plain):
        return "opening"
    if _RECORDED.search(plain):
        return "recorded"
    return ""


@dataclass(frozen=True)
class AmdTiming:
    """How long each sign takes to count, in seconds of audio since the answer."""

    silence_s: float = 2.5  # nobody spoke by then: `unknown`
    answer_pause_s: float = 0.8  # the quiet a person leaves after "Hello?", waiting for the caller
    min_answer_s: float = 0.2  # the shortest answer ("Yes?"); less is a click or a knock
    greeting_s: float = 2.4  # speech this long without such a pause is not someone answering a phone
    decide_by_s: float = 5.0  # a verdict by then, words or not
    beep_min_s: float = 0.2  # a tone this long is a beep
    quiet_after_greeting_s: float = 1.6  # no beep came: the greeting is over after this much quiet
    message_by_s: float = 30.0  # the message starts by then, whatever the machine still says
    transcribe_every_s: float = 1.0  # long speech is transcribed this often while no verdict is in


@dataclass(frozen=True)
class Verdict:
    result: Result
    decided_s: float
    reason: str  # beep, words, question, short_answer, long_greeting, silence, no_decision, ended


@dataclass
class _Utterance:
    """Speech with no pause of `answer_pause_s` in it: one answer, or one stretch of a greeting."""

    start_s: float
    end_s: float | None = None  # None while the speech goes on
    speech_s: float = 0.0  # speech in closed segments (pauses left out)
    open_since: float | None = None  # the segment in progress began here


class Classifier:
    """One outbound call's answering-machine verdict, from its audio's items. Not thread-safe: one
    thread (the call's answering stage, or a benchmark) feeds it."""

    def __init__(self, timing: AmdTiming | None = None) -> None:
        self.timing = timing or AmdTiming()
        self.verdict: Verdict | None = None
        self.beep_s: float | None = None  # when the first beep began
        self._beep_ended_s: float | None = None
        self._tone_since: float | None = None  # a tone (not yet a beep, or one) in progress began here
        self._utterances: list[_Utterance] = []
        self._said: Said = ""
        self._question = False  # the newest transcript ends in a question
        self._transcribed_to = 0.0

    # items in

    def speech_began(self, at_s: float) -> None:
        last = self._utterances[-1] if self._utterances else None
        if last is not None and last.end_s is not None and at_s - last.end_s < self.timing.answer_pause_s:
            last.end_s = None  # a short pause inside the same stretch of speech
        elif last is None or last.end_s is not None:
            last = _Utterance(at_s)
            self._utterances.append(last)
        last.open_since = at_s

    def speech_ended(self, at_s: float) -> None:
        last = self._utterances[-1] if self._utterances else None
        if last is None or last.open_since is None:
            return
        last.speech_s += max(0.0, at_s - last.open_since)
        last.open_since = None
        last.end_s = at_s

    def tone(self, start_s: float, at_s: float) -> None:
        """A steady tone began at `start_s` and is still sounding at `at_s`."""
        self._tone_since = start_s
        if self.beep_s is None and at_s - start_s >= self.timing.beep_min_s:
            self.beep_s = start_s

    def tone_ended(self, at_s: float) -> None:
        if self._tone_since is not None and self.beep_s == self._tone_since:
            self._beep_ended_s = at_s
        self._tone_since = None

    def heard(self, text: str, upto_s: float) -> None:
        """A transcript of the call's speech up to `upto_s` (each one of all the speech so far)."""
        self._transcribed_to = max(self._transcribed_to, upto_s)
        said = words_say(text)
        if _RANK[said] > _RANK[self._said]:
            self._said = said
        self._question = text.rstrip().endswith("?")

    # what it makes of them

    def transcript_due(self, now_s: float) -> bool:
        """Whether the speech so far should be transcribed now (before the verdict: to find its words)."""
        if self.verdict is not None or not self._utterances:
            return False
        last = self._utterances[-1]
        if last.end_s is not None:
            # A pause: its words may tell a greeting's first sentence from a person's "Hello?".
            return self._transcribed_to < last.end_s and now_s - last.end_s >= 0.25
        return now_s - max(self._transcribed_to, last.start_s) >= self.timing.transcribe_every_s

    def decide(self, now_s: float) -> Verdict | None:
        if self.verdict is None:
            found = self._judge(now_s)
            if found is not None:
                self.verdict = Verdict(found[0], round(now_s, 3), found[1])
        return self.verdict

    def give_up(self, now_s: float, reason: str = "ended") -> Verdict:
        """The call ended before a verdict: `unknown`."""
        if self.verdict is None:
            self.verdict = Verdict("unknown", round(now_s, 3), reason)
        return self.verdict

    def _judge(self, now_s: float) -> tuple[Result, str] | None:
        timing = self.timing
        if self.beep_s is not None:
            return "machine", "beep"
        if self._said in ("machine", "ivr"):
            return self._said, "words"
        first = self._utterances[0] if self._utterances else None
        if first is not None and _blip(first, now_s, timing):
            del self._utterances[0]  # a click or a knock as the phone was picked up: not an answer
            first = self._utterances[0] if self._utterances else None
        if first is None:
            return ("unknown", "silence") if now_s >= timing.silence_s else None
        talked = first.speech_s + (now_s - first.open_since if first.open_since is not None else 0.0)
        paused = first.end_s is not None and now_s - first.end_s >= timing.answer_pause_s
        if paused and not self._said and talked >= timing.min_answer_s:
            if talked < timing.greeting_s:
                return "human", "short_answer"
            if self._question:
                return "human", "question"
        # A greeting that began late is heard long enough to tell it from an answer.
        if now_s >= max(timing.decide_by_s, first.start_s + timing.greeting_s + 0.6):
            if self._said == "opening":
                return "ivr", "long_greeting"
            if talked >= timing.greeting_s or self._said == "recorded" or len(self._utterances) > 1:
                return "machine", "long_greeting"
            return "unknown", "no_decision"
        return None

    def message_due(self, now_s: float) -> str | None:
        """After a `machine` verdict: whether a message left now is recorded, and why (beep, quiet, cap)."""
        timing = self.timing
        if self._beep_ended_s is not None:
            return "beep"
        if self.beep_s is not None and now_s - self.beep_s >= 3.0:
            return "beep"  # a tone that will not end: the recorder listens anyway
        if now_s >= timing.message_by_s:
            return "cap"
        last = self._utterances[-1] if self._utterances else None
        quiet_since = last.end_s if last is not None else None
        # Quiet long enough that a beep a moment after the greeting is not missed.
        quiet = quiet_since is not None and now_s - quiet_since >= timing.quiet_after_greeting_s
        return "quiet" if quiet and self._tone_since is None else None


def _blip(utterance: _Utterance, now_s: float, timing: AmdTiming) -> bool:
    """Too short to be an answer, and over: the quiet after it is as long as a person's."""
    end_s = utterance.end_s
    return (
        end_s is not None
        and utterance.speech_s < timing.min_answer_s
        and now_s - end_s >= timing.answer_pause_s
    )
