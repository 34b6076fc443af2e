"""What a scripted caller says over the agent: sounds that must not cut it, and words that must.

Shared by `parley bench interruption` and the tests, so both exercise the same corpus. Every sound here
is voiced (silero hears it as speech, 200-900 ms of it), except the noise bursts, which show what the VAD
alone already ignores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parley.bench.speech import ESPEAK_VOICE, cough, espeak, piper, voiced_cough

# espeak-ng's English voices: accents whose vowels and stops Whisper takes differently over a phone line.
ENGLISH_VOICES = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-029",
    "en-us-nyc",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-us+f3",
)
PIPER_VOICE = "piper"  # the packaged Piper voice: a person's intonation, drawn anew each time


@dataclass(frozen=True)
class Sound:
    kind: str  # filler | exclamation | backchannel | laugh | cough | noise | interruption
    label: str  # what is said (espeak-ng text), or the name of a synthetic sound

    def clip(self, seed: int = 0, voice: str = ESPEAK_VOICE) -> np.ndarray:
        """The sound: the words in `voice` (espeak-ng's, or `PIPER_VOICE`), or a cough or a noise burst
        (no voice) drawn by `seed`."""
        if self.kind == "cough":
            return voiced_cough(250 + seed % 60, seed=seed)
        if self.kind == "noise":
            return cough(100 + seed % 50, seed=seed)
        return piper(self.label) if voice == PIPER_VOICE else espeak(self.label, voice=voice)

    @property
    def spoken(self) -> bool:
        """Whether the sound is words in a voice (not a synthetic cough or noise)."""
        return self.kind not in ("cough", "noise")


# Heard over a reply, none of these may cut it, become a turn or enter the history.
NOT_INTERRUPTIONS = (
    Sound("filler", "uh"),
    Sound("filler", "um"),
    Sound("filler", "oh"),
    Sound("filler", "ah"),
    Sound("filler", "hmm"),
    Sound("filler", "huh"),
    Sound("exclamation", "oh wow"),
    Sound("exclamation", "ah okay"),
    Sound("exclamation", "wow"),
    Sound("backchannel", "okay"),
    Sound("backchannel", "mm"),
    Sound("backchannel", "yep"),
    Sound("backchannel", "right"),
    Sound("backchannel", "sure"),
    Sound("backchannel", "uh huh"),
    Sound("laugh", "ha ha"),
    Sound("cough", "voiced cough"),
    Sound("noise", "noise burst"),
)

# Heard over a reply, each of these must cut it and become the caller's next turn.
INTERRUPTIONS = (
    Sound("interruption", "wait"),
    Sound("interruption", "no"),
    Sound("interruption", "stop"),
    Sound("interruption", "uh, wait"),
    Sound("interruption", "hold on"),
    Sound("interruption", "what time is it in london"),
    Sound("interruption", "sorry to stop you, can you tell me the time in london instead"),
)

# A question with a pause in the middle, and a word from each half that the one reply must have heard.
PAUSED_QUESTIONS = (
    ("what is the weather like", "in paris today", "weather", "paris"),
    ("can you recommend a good book", "about the sea", "book", "sea"),
    ("how far is it from london", "to madrid by train", "london", "madrid"),
)
# The same, paused after a word no sentence ends on (pipeline/unfinished.py holds such a turn's reply).
UNFINISHED_PAUSED_QUESTIONS = (
    ("can you tell me the way to", "the nearest station", "way", "station"),
    ("tell me a story about the", "moon and the stars", "story", "moon"),
    ("i was wondering if", "you could recommend a book", "wondering", "book"),
)

STORY_PROMPTS = (
    "tell me a story about a brave little dragon",
    "tell me a story about a ship lost at sea",
    "describe a walk through a busy city market",
    "tell me a story about a robot who learns to paint",
)
