"""What Whisper heard over the agent: a backchannel (the agent goes on) or the caller taking the turn.

The transcripts are Whisper base's own, on espeak-ng fillers, exclamations, laughs, coughs and short
interruptions (with their mean log-probabilities where they decide).
"""

from __future__ import annotations

import pytest

from parley.config import Settings
from parley.engines.stt import Transcription
from parley.pipeline.backchannels import (
    COMMAND_WORDS,
    BackchannelJudge,
    fold,
    holds_the_floor,
    is_lone_filler,
)

JUDGE = BackchannelJudge.for_settings(Settings())


def heard(text: str, logprob: float = -0.8) -> Transcription:
    return Transcription(text, no_speech_prob=0.3, seconds=0.3, avg_logprob=logprob)


@pytest.mark.parametrize(
    "text",
    [
        "",  # a cough or a noise Whisper found no words in
        "uh",
        "Uh...",
        "Um.",
        "Oh.",
        "Hmmm.",
        "em.",  # an espeak-ng "hmm" over G.711, as Whisper wrote it
        "Huh?",
        "Oh wow.",
        "Whoa!",
        "Oh my.",
        "Oh my God!",
        "O.",  # "oh" as Whisper writes it for some voices
        "Amen.",
        "Ripe.",  # "right" over G.711, as Whisper wrote it for espeak-ng en-us and four British voices
        "Rive",  # "right" over a carrier stream
        "Wow!",
        "Okay.",
        "Ah, okay.",
        "um okay",
        "Oh, really?",
        "Uh-huh.",
        "uhuh",  # an espeak-ng "uh huh" over SIP, as Whisper wrote it
        "Uhhuh.",
        "Okayokay.",
        "Mm-hmm.",
        "mm",
        "Yeah.",
        "Yep, right.",
        "Oh, I see.",
        "Ha ha!",
        "Ha ha ha ha!",
        "Hahaha",
        "(coughs)",
        "[LAUGHTER]",
        "*sigh*",
        "them",  # "hmm" over WebRTC, as Whisper heard it (sure of itself: -0.65)
        "The.",
    ],
)
def test_fillers_exclamations_backchannels_and_laughs_let_the_agent_go_on(text: str) -> None:
    assert JUDGE.judge(heard(text), 400).backchannel, text


@pytest.mark.parametrize(
    "text",
    [
        "Wait.",
        "weight.",  # "wait", as Whisper spells it on espeak-ng
        "No.",
        "No, no.",
        "stop",
        "Hold on.",
        "Uh, wait.",  # filler words first: still an interruption
        "Oh, wait.",
        "Oh no.",
        "Oh my, stop.",
        "O, wait.",
        "Sorry.",
        "Hey.",
        "What?",
        "What time is it in London?",
        "Okay, but what about Madrid?",
        "Yeah, no, tell me about London instead.",
        "The time?",  # a function word with more: words
        "Mum.",  # not "m" + "um": single letters are no backchannel pieces
        "Ohno.",  # "oh" + "no": "no" is no backchannel
        "Ripe already?",  # a misheard "right" with more: words
    ],
)
def test_words_interrupt_the_agent(text: str) -> None:
    assert not JUDGE.judge(heard(text), 400).backchannel, text


def test_one_short_word_whisper_barely_believes_is_a_sound() -> None:
    # Whisper's guesses for a throat-clearing ("and", -1.79) and an espeak-ng "yeah" ("the", -1.90).
    assert JUDGE.judge(heard("Ever.", -1.79), 448).reason == "unsure"
    assert JUDGE.judge(heard("and", -1.79), 448).backchannel  # no content of its own, either
    assert not JUDGE.judge(heard("No.", -1.2), 448).backchannel  # a real "no" is heard with more confidence
    assert not JUDGE.judge(heard("please stop", -1.9), 448).backchannel  # more words: words
    # "hold on" as Whisper heard it over WebRTC: unsure, but too long to be a sound.
    assert not JUDGE.judge(heard("Oda.", -1.52), 736).backchannel


def test_a_filler_whisper_thought_might_be_stop_stops_the_agent() -> None:
    # Over G.711, an espeak-ng "stop" written "Uh..." with 2.7 % odds on "Stop"; a real "uh" gives it 0.3 %
    # at most (bench backchannels).
    def uh(odds: dict[str, float]) -> Transcription:
        return Transcription("Uh...", 0.3, 0.3, -1.4, weighed=odds)

    verdict = JUDGE.judge(uh({"stop": 0.027, "wait": 0.0}), 300)
    assert not verdict.backchannel and verdict.reason == "command odds"
    assert not JUDGE.judge(Transcription("Oh.", 0.3, 0.3, -0.9, weighed={"wait": 0.05}), 300).backchannel
    assert JUDGE.judge(uh({"stop": 0.003, "wait": 0.001}), 300).backchannel
    assert JUDGE.judge(uh({}), 300).backchannel  # not weighed: judged by its words
    assert JUDGE.weigh == COMMAND_WORDS
    off = BackchannelJudge(Settings().backchannels, -1.5, min_command_odds=0.0)
    assert off.weigh == () and off.judge(uh({"stop": 0.5}), 300).backchannel


def test_a_turn_asks_to_wait_in_words_or_as_a_filler_with_a_commands_odds() -> None:
    assert JUDGE.asks_to_wait("Hold on, please.", 0.0)
    assert JUDGE.asks_to_wait("Uh...", 0.04)  # a "stop" over G.711
    assert JUDGE.asks_to_wait("Oh.", 0.02)
    assert not JUDGE.asks_to_wait("Uh...", 0.001)  # a real "uh"
    # words are the model's to answer, however Whisper weighed them ("way" gives "wait" 1-11 %)
    assert not JUDGE.asks_to_wait("Way.", 0.1)
    assert not JUDGE.asks_to_wait("Hang up.", 0.28)
    off = BackchannelJudge(Settings().backchannels, -1.5, min_command_odds=0.0)
    assert not off.asks_to_wait("Uh...", 0.5) and off.asks_to_wait("Wait.", 0.0)


def test_spelling_variants_fold_together() -> None:
    assert fold("hmmm") == fold("hmm") == fold("hm")
    assert fold("hahaha") == fold("heh") == "ha"
    assert fold("hey") != fold("ha")


def test_whispers_spellings_of_a_backchannel_count_as_it_in_any_list() -> None:
    judge = BackchannelJudge(("right", "oh"), -1.5)
    assert judge.judge(heard("Ripe."), 400).backchannel  # "right" over G.711
    assert judge.judge(heard("O."), 400).backchannel
    assert not BackchannelJudge(("okay",), -1.5).judge(heard("Ripe."), 400).backchannel


def test_the_word_list_comes_from_the_settings() -> None:
    judge = BackchannelJudge(("okay",), -1.5)
    assert judge.judge(heard("Okay."), 400).backchannel
    assert not judge.judge(heard("Wow."), 400).backchannel


@pytest.mark.parametrize(
    ("text", "lone"),
    [
        ("Uh...", True),
        ("Umm.", True),
        ("Em...", True),
        ("uh", True),
        ("Uh uh", False),  # "uh-huh" as Whisper may write it: an acknowledgement
        ("Okay.", False),
        ("", False),
        ("Oh.", False),
    ],
)
def test_a_lone_hesitation_is_told_from_other_backchannels(text: str, lone: bool) -> None:
    assert is_lone_filler(text) is lone


@pytest.mark.parametrize(
    ("text", "holds"),
    [
        ("Wait.", True),
        ("Stop.", True),
        ("Uh, hold on, please.", True),
        ("No, stop, stop.", True),
        ("Wait, wait, wait.", True),
        ("Hold on a second.", True),
        ("Sorry, one moment.", True),
        ("Please wait.", True),
        ("Just a sec!", True),
        ("Wait, what?", False),  # a question
        ("Stop the order.", False),  # a request
        ("No.", False),  # may answer what the agent asked
        ("Okay.", False),
        ("weight", False),
        ("hold on hold", False),
        ("", False),
    ],
)
def test_a_caller_who_only_asks_the_agent_to_wait_is_told_from_one_who_asks_something(
    text: str, holds: bool
) -> None:
    assert holds_the_floor(text) is holds
