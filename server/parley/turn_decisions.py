"""What a call does on the turn-taker's decisions (the `TurnControl` of pipeline/turn_state.py).

Everything here runs on the call's VAD thread and is quick: pause, resume or interrupt the agent; open
a turn; start a speculative reply at a pause (pipeline/speculation.py), adopt it when the turn ends there
or drop it unheard when the caller goes on; reopen a turn; take a keypad entry as a turn of its own.
The replies (replies.py) do what happens to a reply; this says when, and hands the caller's audio and
questions to the stages. While the call's `Floor` says it is not listening (an outbound call's
answering-machine check deciding, or a machine on the line: answering.py), the caller's turns start no
reply and their speech cuts nothing: a recorded greeting is not a caller's question.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Protocol

import numpy as np

from parley import metrics
from parley.call_signals import CallSignals
from parley.engines.stt import Transcription
from parley.log import event
from parley.pipeline.history import Conversation, caller_turn_id
from parley.pipeline.messages import (
    BackchannelQuery,
    EarlyUtterance,
    Transcript,
    TurnEndQuery,
    Utterance,
)
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.replies import Replies


class TurnInboxes(Protocol):
    """Where the caller's turns and questions about them go (pipeline/stage_set.py's StageInboxes)."""

    def hear(self, item: Utterance | EarlyUtterance) -> None: ...

    def answer(self, item: Transcript) -> None: ...

    def ask_backchannel(self, query: BackchannelQuery) -> None: ...

    def ask_turn_end(self, query: TurnEndQuery) -> None: ...


class Floor(Protocol):
    """Whether the caller's speech is answered now (answering.py's AnsweringCheck)."""

    def listening(self) -> bool: ...


log = logging.getLogger(__name__)


class TurnDecisions:
    """The call's side of turn-taking: one per call, held by its TurnTaker and its VAD stage."""

    def __init__(
        self,
        call_id: str,
        replies: Replies,
        inboxes: TurnInboxes,
        signals: CallSignals,
        tracker: SpeculativeTurnTracker,
        conversation: Conversation,
        *,
        speculative: bool,
        floor: Floor | None = None,
    ) -> None:
        self.call_id = call_id
        self.replies = replies
        self.inboxes = inboxes
        self.signals = signals
        self.tracker = tracker
        self.conversation = conversation
        self.speculative = speculative
        self.floor = floor
        self._unheard = ""  # a turn that began while the floor was shut: withheld even if it opens meanwhile
        self._turn_numbers = itertools.count(1)

    def listening(self, turn_id: str = "") -> bool:
        return (self.floor is None or self.floor.listening()) and not (turn_id and turn_id == self._unheard)

    def agent_active(self) -> bool:
        # Not listening, speech over the agent is no barge-in: a machine's greeting never cuts its message.
        return self.replies.active() and self.listening()

    # speech over the agent

    def pause_agent(self) -> float:
        paused_at = self.replies.pause()
        self.signals.emit({"type": "agent_paused", "paused_at": paused_at})
        return paused_at

    def resume_agent(self, heard: str) -> None:
        """Not an interruption after all (a blip, or a backchannel: `heard` is what it sounded like)."""
        self.replies.resume()
        self.signals.emit({"type": "agent_resumed", "heard": heard})
        event(log, "false_interruption", call_id=self.call_id, text=heard)  # logged as a transcript is

    def interrupt_agent(self, onset_arrived_at: float, *, by: str = "speech") -> None:
        had_audio = self.replies.outbound.has_audio() and by == "speech"  # paused audio counts
        paused_at = self.replies.pause()
        cut = self.replies.interrupt()
        stop_s = max(0.0, paused_at - onset_arrived_at)
        metrics.BARGE_INS_TOTAL.inc()
        if had_audio:
            metrics.INTERRUPTION_LATENCY.observe(stop_s)
        # Monotonic clock readings too: on one machine a benchmark can line them up with its own.
        self.signals.emit(
            {
                "type": "barge_in",
                "by": by,
                "stop_s": round(stop_s, 4),
                "heard_at": onset_arrived_at,
                "paused_at": paused_at,
            }
        )
        event(log, "barge_in", call_id=self.call_id, stop_s=round(stop_s, 4), cut=len(cut))

    def check_backchannel(self, request: int, audio: np.ndarray, speech_ms: float) -> None:
        self.inboxes.ask_backchannel(BackchannelQuery(request, audio, speech_ms))

    # the caller's turns

    def open_turn(self) -> str:
        turn_id = caller_turn_id(self.call_id, next(self._turn_numbers))
        metrics.TURNS_TOTAL.inc()
        if not self.listening():
            self._unheard = turn_id
        return turn_id

    def user_started_speaking(self) -> None:
        if self.listening():
            self.signals.set_state("user_speaking")

    def speech_paused(
        self,
        turn_id: str,
        revision: int,
        audio: np.ndarray,
        speech_end: float,
        heard: Transcription | None = None,
    ) -> None:
        if not self.listening(turn_id):
            return
        draft = self.replies.start_draft(turn_id, revision, speech_end) if self.speculative else None
        generation = self.replies.generation
        self.inboxes.hear(EarlyUtterance(turn_id, revision, audio, speech_end, heard, draft, generation))

    def judge_turn_end(self, speech_end: float, audio: np.ndarray) -> None:
        if self.listening():
            self.inboxes.ask_turn_end(TurnEndQuery(speech_end, audio))

    def speech_resumed(self, turn_id: str, revision: int) -> None:
        """The caller went on after a pause: the reply started at that pause is cancelled unheard."""
        self.replies.cancel_draft()

    def turn_ended(self, turn_id: str, revision: int, audio: np.ndarray, speech_end: float) -> None:
        if not self.listening(turn_id):
            # Final as it is: speech after it is a turn of its own, not a reopening of one nobody answered.
            self.tracker.commit(turn_id, revision)
            event(log, "turn_withheld", logging.DEBUG, call_id=self.call_id, turn_id=turn_id)
            return
        held_events = self.replies.adopt(turn_id, revision, speech_end)
        if held_events is not None:
            # The reply started at the pause was for exactly this speech: it is the turn's reply.
            for payload in held_events:
                self.signals.emit(payload)
        else:
            self.replies.cancel_draft()  # made for speech the turn went on past (if resumption left one)
            response = self.replies.start(turn_id, revision, speech_end)
            self.inboxes.hear(Utterance(response, audio))
        self.signals.set_state("thinking")

    def reopen_confirmed(self, turn_id: str, base: int, candidate: int) -> None:
        if not self.listening():
            return
        if self.replies.supersede():
            self.signals.emit({"type": "agent_cancelled", "turn_id": turn_id})
        self.signals.set_state("user_speaking")
        event(log, "turn_reopened", call_id=self.call_id, turn_id=turn_id, revision=candidate)

    def keys_entered(self, digits: str) -> None:
        """A finished keypad entry is a user turn of its own: the LLM reads "[DTMF 12#]".

        Keys pressed while the agent talks stop it, as on any phone menu.
        """
        if not self.listening():
            return
        now = time.monotonic()
        if self.replies.active():
            self.interrupt_agent(now, by="keypad")
        turn_id = self.open_turn()
        self.tracker.observe(turn_id, 0)
        text = f"[DTMF {digits}]"
        response = self.replies.start(turn_id, 0, now, user_text=text)
        self.conversation.set_user_text(turn_id, 0, text)
        self.signals.emit(
            {"type": "user_transcript", "turn_id": turn_id, "revision": 0, "text": text, "keypad": True}
        )
        event(log, "keys_entered", call_id=self.call_id, turn_id=turn_id, digits=digits)
        self.inboxes.answer(Transcript(response, text))
        self.signals.set_state("thinking")
