"""What flows between a call's stages, and into its Outbound."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from parley.engines.stt import Transcription
from parley.pipeline.cancel import precedes

# A reply is due this long after the caller stops speaking: the gap people leave between turns.
REPLY_DUE_S = 0.5
# More of a reply is due this long before the speech of the text given to TTS runs out: what its next
# clause takes to decode and synthesise while other calls' work shares the cores. Six callers at once
# (`bench calls --callers 6 --transport sip`): with 0.5 s, pauses inside replies up to 1.0-1.9 s; with
# 1.0 s, up to 1.24-1.30 s (0.88-0.96 s when every reply was stepped together), p50 no later.
REFILL_DUE_S = 1.0
SPEECH_S_PER_CHAR = 0.06  # how long a character of text takes to say, about (Piper's voices, English)


@dataclass(frozen=True)
class Tag:
    """Which work an item belongs to: a turn revision (None = not speculative) and a cancel generation."""

    turn_id: str | None
    revision: int | None
    generation: int


@dataclass
class Response:
    """One agent reply in the making, shared by the stages that build it and the sender that plays it.

    Timings are filled in by the stage that measures them; the sender records what was played, which is
    what goes into the history ("as heard").
    """

    tag: Tag
    speech_end: float | None = None  # monotonic time the user's speech ended (None: greeting)
    user_text: str = ""
    stt_s: float | None = None
    llm_first_token_s: float | None = None
    tts_first_audio_s: float | None = None
    first_audio_at: float | None = None
    marks: dict[str, float] = field(default_factory=dict)  # milestone -> monotonic time, first time only
    audio_ready: threading.Event = field(default_factory=threading.Event)  # its first audio is synthesised
    pieces_sent: int = 0  # text pieces given to TTS (by the LLM stage)
    pieces_spoken: int = 0  # of those, synthesised to their end (by the TTS stage)
    text_sent: int = 0  # characters of those pieces
    audio_s: float = 0.0  # seconds of audio synthesised so far
    played_segments: list[str] = field(default_factory=list)
    partial_segment: str = ""  # the segment being played when the reply was cut, with the share heard
    ended: bool = False
    created_at: float = field(default_factory=time.monotonic)

    @property
    def response_s(self) -> float | None:
        if self.speech_end is None or self.first_audio_at is None:
            return None
        return self.first_audio_at - self.speech_end

    def mark(self, milestone: str) -> None:
        self.marks.setdefault(milestone, time.monotonic())

    def timeline(self) -> dict[str, float]:
        """Milestones in seconds after the end of the user's speech: where a reply's latency went."""
        if self.speech_end is None:
            return {}
        return {name: round(at - self.speech_end, 3) for name, at in self.marks.items()}

    def first_audio_wait_s(self, limit_s: float) -> float:
        """How much longer the reply's next words should wait for its first audio: the rest of `limit_s`
        after its first piece went to TTS, while that audio is not made yet; 0 otherwise."""
        handed = self.marks.get("first_piece")
        if handed is None or limit_s <= 0 or self.audio_ready.is_set():
            return 0.0
        return max(0.0, handed + limit_s - time.monotonic())

    def unplayed_s(self) -> float:
        """Seconds of the audio synthesised so far that the caller has yet to hear: all of it before its
        first frame plays, then as if it played on without a pause (a pause only leaves more unheard)."""
        if self.first_audio_at is None:
            return self.audio_s
        return max(0.0, self.first_audio_at + self.audio_s - time.monotonic())

    def runs_dry_within(self, seconds: float) -> bool:
        """Whether the audio synthesised so far will have played out within `seconds`, nothing more being
        on its way through TTS: the LLM stage then cuts its next piece early. False before it plays."""
        if self.first_audio_at is None or self.pieces_spoken < self.pieces_sent:
            return False
        return self.unplayed_s() <= seconds

    def text_due_at(self) -> float:
        """When the reply's next words are due from the LLM: its first piece a moment after the caller
        stopped speaking, then once the speech of the text given to TTS so far is about to run out."""
        if self.first_audio_at is None:
            return (self.created_at if self.speech_end is None else self.speech_end) + REPLY_DUE_S
        return self.first_audio_at + self.text_sent * SPEECH_S_PER_CHAR - REFILL_DUE_S

    def heard_text(self) -> str:
        return " ".join(s for s in [*self.played_segments, self.partial_segment] if s).strip()


@dataclass(frozen=True)
class InboundFrame:
    """20 ms of caller audio at 16 kHz, stamped when the transport handed it over."""

    pcm: np.ndarray
    arrived_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class KeypadDigit:
    """A DTMF digit the caller pressed, in order with the audio around it."""

    digit: str
    arrived_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class BackchannelQuery:
    """Short speech heard over the paused agent: was it a backchannel, or the caller taking the turn?"""

    request: int
    audio: np.ndarray  # int16, 16 kHz, all of it since the speech began
    speech_ms: float  # how much of it the VAD took for speech


@dataclass(frozen=True)
class BargeVerdict:
    """The answer to a BackchannelQuery, back in the VAD queue so turn decisions stay in order."""

    request: int
    backchannel: bool
    reason: str
    heard: Transcription | None  # None when the check failed


@dataclass(frozen=True)
class TurnEndQuery:
    """The turn so far, at its first pause: has the caller finished (engines/turn_end.py)?"""

    speech_end: float  # the pause it is asked at: when its last speech chunk arrived
    audio: np.ndarray  # int16, 16 kHz, the turn so far


@dataclass(frozen=True)
class TurnEndVerdict:
    """The answer to a TurnEndQuery, back in the VAD queue so turn decisions stay in order."""

    speech_end: float
    complete: bool
    probability: float


@dataclass(frozen=True)
class Utterance:
    response: Response
    audio: np.ndarray  # int16, 16 kHz

    @property
    def generation(self) -> int:
        return self.response.tag.generation


@dataclass(frozen=True)
class EarlyUtterance:
    """A turn's audio so far, at a short pause: transcribed ahead, in case the turn ends there."""

    turn_id: str
    revision: int
    audio: np.ndarray
    speech_end: float  # the same reading the turn's Utterance will carry if no speech follows
    heard: Transcription | None = None  # already transcribed (by the backchannel check): reuse it
    # The speculative reply started at this pause (pipeline/speculation.py): its transcript goes on to
    # the LLM at once. None: only transcribed ahead, for the Utterance that may follow.
    draft: Response | None = None
    generation: int = 0  # the cancel generation it was heard in (the draft's, when there is one)


@dataclass(frozen=True)
class Transcript:
    response: Response
    text: str
    command_odds: float = 0.0  # the odds Whisper gave "stop", "wait"... to begin it (short turns only)

    @property
    def generation(self) -> int:
        return self.response.tag.generation


@dataclass(frozen=True)
class ReplyText:
    """A piece of reply text ready to be spoken (a clause or a sentence); `final` closes the reply."""

    response: Response
    text: str
    final: bool = False

    @property
    def generation(self) -> int:
        return self.response.tag.generation


@dataclass(frozen=True)
class Cancel:
    """Work of a generation before `generation` is stale: posted to each stage's priority lane at a
    barge-in, a reopen or a dropped speculative reply, so the stage drops what of it waits in its inbox
    before it takes anything else (pipeline/queues.py)."""

    generation: int

    def drops(self, item: object) -> bool:
        """Whether `item` (a message tagged with a generation, or anything else) is stale by this cancel."""
        generation = getattr(item, "generation", None)
        return isinstance(generation, int) and precedes(generation, self.generation)


@dataclass(frozen=True)
class AudioChunk:
    """Reply audio at the Outbound's rate, with the text it speaks."""

    response: Response
    pcm: np.ndarray
    text: str


@dataclass(frozen=True)
class EndOfResponse:
    response: Response


@dataclass(frozen=True)
class EndOfCall:
    reason: str


OutboundItem = AudioChunk | EndOfResponse | EndOfCall


def is_control(item: object) -> bool:
    """Control items survive a flush; audio does not."""
    return not isinstance(item, AudioChunk)
