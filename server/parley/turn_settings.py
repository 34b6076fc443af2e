"""The turn-taking settings: when a turn ends, when it reopens, what speech over the agent cuts it.

A group of their own within `Settings` (config.py), which inherits them; pipeline/turntaking.py and the
backchannel judge read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt

# Said over the agent, these (alone or together: "oh wow", "uh-huh, okay") let it go on talking; spelling
# variants are folded ("hmmm" is "hmm", "hahaha" is "ha", Whisper's "Ripe." over G.711 is "right"), so a
# list names the words as said. See pipeline/backchannels.py.
DEFAULT_BACKCHANNELS = (
    # fillers and non-lexical sounds
    "uh",
    "um",
    "er",
    "erm",
    "ah",
    "oh",
    "ooh",
    "eh",
    "hmm",
    "mm",
    "mhm",
    "huh",
    "ha",
    # exclamations
    "wow",
    "whoa",
    "oh my",
    "oh my god",
    "oh my gosh",
    "aha",
    "really",
    "nice",
    "cool",
    "great",
    "interesting",
    # acknowledgements
    "uh huh",
    "mm hmm",
    "yeah",
    "yes",
    "yep",
    "yup",
    "okay",
    "ok",
    "alright",
    "all right",
    "right",
    "sure",
    "exactly",
    "amen",  # agreement ("mm" came out "Amen." in four espeak-ng voices and Piper's)
    "i see",
    "got it",
)


# A transcript whose last word is one of these has stopped mid-sentence: its reply is held longer, in case
# the caller goes on (pipeline/unfinished.py). Words many sentences end on ("from", "like", "in", "on")
# are left out: a false hold delays a reply, and these would delay ordinary ones.
DEFAULT_UNFINISHED_WORDS = (
    # articles and possessives: a noun must follow
    "a",
    "an",
    "the",
    "my",
    "your",
    "our",
    "their",
    # conjunctions: a clause must follow
    "and",
    "or",
    "but",
    "because",
    "if",
    "than",
    # prepositions only a wh-question ends on ("Who are you talking to?", "What is it about?"): such a
    # question is not held (pipeline/unfinished.py)
    "to",
    "for",
    "with",
    "about",
    "of",
    # hesitations, as Whisper writes them
    "uh",
    "uhh",
    "um",
    "umm",
    "uhm",
    "em",
    "er",
    "erm",
)


# A turn that names one of these and ends on a few digits is likely a number read out in parts
# ("The order number is four seven ... one two"): its reply is held like an unfinished sentence's
# (pipeline/unfinished.py). English, like the words above.
DEFAULT_NUMBER_WORDS = (
    "number", "code", "order", "account", "card", "phone", "mobile", "reference", "id", "zip", "postcode",
    "pin", "confirmation", "ticket", "booking", "tracking", "member", "membership", "policy", "invoice",
    "digits", "extension", "serial", "case",
)  # fmt: skip


@dataclass(frozen=True)
class TurnSettings:
    vad_threshold: float = field(
        default=0.5, metadata=_opt("speech probability that counts as speech", "turns")
    )
    min_speech_ms: int = field(
        default=200, metadata=_opt("speech needed for a turn, a reopen or a barge-in to count", "turns")
    )
    end_of_turn_ms: int = field(
        default=250, metadata=_opt("silence that ends a turn (speculatively)", "turns")
    )
    early_stt_ms: int = field(
        default=32,
        metadata=_opt(
            "silence after which the turn so far is transcribed ahead of its end (0: off)", "turns"
        ),
    )
    speculative_replies: bool = field(
        default=True,
        metadata=_opt(
            "at that silence, also start the reply (LLM, TTS), held until the turn has ended", "turns"
        ),
    )
    reopen_grace_ms: int = field(
        default=300,
        metadata=_opt(
            "after a turn ends, its reply is held this long: speech within it reopens the turn", "turns"
        ),
    )
    turn_model: str = field(
        default="auto",
        metadata=_opt(
            "end-of-turn model asked at a pause: 'smart-turn' (packaged), 'none' (silence alone), a Smart "
            "Turn v3 ONNX file, or 'auto' (Smart Turn on a GPU, where replies are ready before the grace)",
            "turns",
        ),
    )
    turn_complete_threshold: float = field(
        default=0.9,
        metadata=_opt("the end-of-turn model's probability above which a turn counts as complete", "turns"),
    )
    turn_complete_ms: int = field(
        default=150,
        metadata=_opt(
            "silence that ends a turn the end-of-turn model calls complete; its reply is not held after",
            "turns",
        ),
    )
    unfinished_hold_ms: int = field(
        default=1000,
        metadata=_opt(
            "after a turn whose transcript ends mid-sentence (on one of `unfinished_words`) ends, its reply "
            "is held this long instead of `reopen_grace_ms`: speech within it reopens the turn (0: off)",
            "turns",
        ),
    )
    unfinished_words: tuple[str, ...] = field(
        default=DEFAULT_UNFINISHED_WORDS,
        metadata=_opt(
            "last words that leave a sentence unfinished: 'to', 'for', 'the', 'and', 'um'...", "turns"
        ),
    )
    number_words: tuple[str, ...] = field(
        default=DEFAULT_NUMBER_WORDS,
        metadata=_opt(
            "words that name a number being read out ('number', 'order', 'account'...): a turn that names "
            "one and ends on three digits or fewer, or on a group of three after others, is held like an "
            "unfinished sentence",
            "turns",
        ),
    )
    reopen_unheard_ms: int = field(
        default=3000,
        metadata=_opt(
            "after a turn ends, speech within this still reopens it while the caller has heard nothing "
            "of its reply (0: only within the grace)",
            "turns",
        ),
    )
    blip_silence_ms: int = field(
        default=160, metadata=_opt("silence that ends a candidate interruption (a blip)", "turns")
    )
    backchannel_ask_ms: int = field(
        default=64,
        metadata=_opt(
            "silence after speech over the agent before Whisper is asked whether it was a backchannel "
            "(a word's final 'p' or 't' is a closure, then a release)",
            "turns",
        ),
    )
    filler_silence_ms: int = field(
        default=400,
        metadata=_opt(
            "after a lone 'uh' or 'um' over the agent, the silence before it resumes (a filler often "
            "opens the caller's turn: 'uh, wait'); other backchannels wait `blip_silence_ms`",
            "turns",
        ),
    )
    backchannel_max_ms: int = field(
        default=1000, metadata=_opt("speech longer than this always interrupts the agent", "turns")
    )
    backchannels: tuple[str, ...] = field(
        default=DEFAULT_BACKCHANNELS,
        metadata=_opt("fillers, exclamations and acknowledgements that never interrupt the agent", "turns"),
    )
    backchannel_min_logprob: float = field(
        default=-1.5,
        metadata=_opt(
            "a word or two Whisper is less sure of than this (mean log-probability) is a sound, not words",
            "turns",
        ),
    )
    backchannel_command_odds: float = field(
        default=0.01,
        metadata=_opt(
            "a backchannel Whisper thought at least this likely to begin with 'stop', 'wait', 'hold' "
            "or 'hang' interrupts the agent: over a phone line a 'stop' is often written 'Uh...' (0: off)",
            "turns",
        ),
    )
    backchannel_wait_ms: int = field(
        default=2000,
        metadata=_opt("the paused agent waits this long for the backchannel check, then yields", "turns"),
    )
    preroll_ms: int = field(default=300, metadata=_opt("audio kept before speech onset", "turns"))
    keypad_timeout_ms: int = field(
        default=1200,
        metadata=_opt("a keypad (DTMF) entry ends this long after its last key, or at '#'", "turns"),
    )
    max_turn_s: float = field(
        default=20.0, metadata=_opt("longest utterance before a forced turn end", "turns")
    )
