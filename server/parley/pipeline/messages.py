"""What flows between a call's stages, and into its Outbound."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


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
    played_segments: list[str] = field(default_factory=list)
    partial_segment: str = ""  # the segment being played when the reply was cut, with the share heard
    ended: bool = False

    @property
    def turn_id(self) -> str | None:
        return self.tag.turn_id

    @property
    def response_s(self) -> float | None:
        if self.speech_end is None or self.first_audio_at is None:
            return None
        return self.first_audio_at - self.speech_end

    def heard_text(self) -> str:
        return " ".join(s for s in [*self.played_segments, self.partial_segment] if s).strip()


@dataclass(frozen=True)
class InboundFrame:
    """20 ms of caller audio at 16 kHz, stamped when the transport handed it over."""

    pcm: np.ndarray
    arrived_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Utterance:
    response: Response
    audio: np.ndarray  # int16, 16 kHz


@dataclass(frozen=True)
class Transcript:
    response: Response
    text: str


@dataclass(frozen=True)
class ReplyText:
    """A piece of reply text ready to be spoken (a clause or a sentence); `final` closes the reply."""

    response: Response
    text: str
    final: bool = False


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
