"""What the turn-taker (pipeline/turntaking.py) keeps between chunks, and what it asks of its call.

A `Segment` is the speech since its onset with its accounting: speech, the VAD's silence, and the quiet
that ends a turn (pipeline/speech_level.py). A `BackchannelCheck` is one question asked about speech
over the paused agent; a `ClosedTurn` is a turn that ended and may still be reopened.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from parley.engines.stt import Transcription
from parley.pipeline.speech_level import SpeechLevel


class TurnControl(Protocol):
    """What the turn-taker asks of its call. Every method is quick and called on the VAD thread."""

    def agent_active(self) -> bool: ...
    def pause_agent(self) -> float: ...
    def resume_agent(self, heard: str) -> None: ...
    def interrupt_agent(self, onset_arrived_at: float) -> None: ...
    def open_turn(self) -> str: ...
    def user_started_speaking(self) -> None: ...
    def speech_paused(
        self,
        turn_id: str,
        revision: int,
        audio: np.ndarray,
        speech_end: float,
        heard: Transcription | None = None,
    ) -> None: ...
    def speech_resumed(self, turn_id: str, revision: int) -> None:
        """Speech came back after `speech_paused`, before the turn ended: what the pause started is moot."""
        ...

    def judge_turn_end(self, speech_end: float, audio: np.ndarray) -> None:
        """Ask whether the turn is over at this pause, off the VAD thread (when the call has an end-of-turn
        model); answer with `TurnTaker.turn_end_verdict`."""
        ...

    def turn_ended(self, turn_id: str, revision: int, audio: np.ndarray, speech_end: float) -> None: ...
    def reopen_confirmed(self, turn_id: str, base: int, candidate: int) -> None: ...
    def check_backchannel(self, request: int, audio: np.ndarray, speech_ms: float) -> None:
        """Judge this speech heard over the agent, off the VAD thread; answer with `TurnTaker.verdict`."""
        ...


class Mode(enum.Enum):
    IDLE = "idle"
    TENTATIVE = "tentative"  # speech that may become a new turn
    SPEAKING = "speaking"  # inside a turn
    REOPEN = "reopen"  # a reopen candidate is pending
    BARGE = "barge"  # the agent is paused, deciding whether this interrupts it


@dataclass
class Segment:
    """Audio collected since the current speech began, with its speech/silence accounting."""

    audio: list[np.ndarray] = field(default_factory=list)
    speech_ms: float = 0.0
    silence_ms: float = 0.0  # since the last chunk the VAD called speech
    quiet_ms: float = 0.0  # since the last loud one (speech_level.py): what ends a turn
    total_ms: float = 0.0
    onset_arrived_at: float = 0.0
    last_speech_at: float = 0.0
    level: SpeechLevel = field(default_factory=SpeechLevel)  # how loud its speech chunks are

    def samples(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, dtype=np.int16)

    def account(
        self,
        chunk: np.ndarray,
        chunk_ms: float,
        is_speech: bool,
        is_silence: bool,
        quiet: bool,
        arrived_at: float,
    ) -> None:
        """Take one chunk: the VAD's verdict on it, and whether it is quiet against this speech."""
        self.audio.append(chunk)
        self.total_ms += chunk_ms
        if is_speech:
            self.speech_ms += chunk_ms
            self.silence_ms = 0.0
        elif is_silence:
            self.silence_ms += chunk_ms
        if is_silence or quiet:
            self.quiet_ms += chunk_ms
        elif is_speech:
            self.quiet_ms = 0.0
            self.last_speech_at = arrived_at


@dataclass
class BackchannelCheck:
    """A backchannel check asked for the speech heard so far over the paused agent."""

    request: int
    speech_ms: float  # the speech when asked: more speech since makes its answer partial
    asked_at: float
    heard: Transcription | None = None
    backchannel: bool | None = None  # None until the verdict is in
    filler: bool = False  # the verdict heard a lone "uh" or "um": resume after a longer silence


@dataclass
class ClosedTurn:
    turn_id: str
    revision: int
    audio: np.ndarray
    closed_at: float  # when the chunk that closed it arrived
    tail: list[np.ndarray] = field(default_factory=list)  # everything heard since it closed
    first_onset: int | None = None  # where in `tail` speech was first heard

    def resumed_audio(self, lead_in: int) -> list[np.ndarray]:
        """The turn's audio and what followed it, for a revision that reopens it: the silence before the
        first speech since it closed shortened to `lead_in` chunks, as a new turn's preroll is. Whisper
        wrote a caller's 900 ms pause inside "four seven ... one two" as "47. 1,2," and went on
        counting ("1,2,3.", "1,2, 3, 4, 4,"); nothing in that silence was speech."""
        start = 0 if self.first_onset is None else max(0, self.first_onset - lead_in)
        return [self.audio, *self.tail[start:]]
