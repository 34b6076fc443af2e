"""What a call does on the turn-taker's decisions (the `TurnControl` of pipeline/turntaking.py).

Everything here runs on the call's VAD thread and is quick: pause, resume or interrupt the agent; open
a turn; start a speculative reply at a pause (pipeline/speculation.py), adopt it when the turn ends there
or drop it unheard when the caller goes on; reopen a turn; take a keypad entry as a turn of its own.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from parley import metrics
from parley.engines.stt import Transcription
from parley.log import event
from parley.pipeline.messages import (
    BackchannelQuery,
    EarlyUtterance,
    Response,
    Tag,
    Transcript,
    TurnEndQuery,
    Utterance,
)

if TYPE_CHECKING:
    from parley.call import Call

log = logging.getLogger(__name__)


class TurnDecisions:
    """The call's side of turn-taking: one per call, held by its TurnTaker and its VAD stage."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self._turn_numbers = itertools.count(1)

    def agent_active(self) -> bool:
        return self.call.agent_active()

    # speech over the agent

    def pause_agent(self) -> float:
        paused_at = self.call.outbound.pause()
        self.call.emit({"type": "agent_paused", "paused_at": paused_at})
        return paused_at

    def resume_agent(self, heard: str) -> None:
        """Not an interruption after all (a blip, or a backchannel: `heard` is what it sounded like)."""
        call = self.call
        call.outbound.resume()
        call.emit({"type": "agent_resumed", "heard": heard})
        event(log, "false_interruption", call_id=call.call_id, text=heard)  # logged as a transcript is

    def interrupt_agent(self, onset_arrived_at: float, *, by: str = "speech") -> None:
        call = self.call
        had_audio = call.outbound.has_audio() and by == "speech"  # paused audio counts: the pause stopped it
        paused_at = call.outbound.pause()
        call.scope.cancel()
        cut = call.cut_replies()
        call.flush_stage_queues()
        for response in cut:
            call.replies.commit(response, interrupted=True)
        stop_s = max(0.0, paused_at - onset_arrived_at)
        metrics.BARGE_INS_TOTAL.inc()
        if had_audio:
            metrics.INTERRUPTION_LATENCY.observe(stop_s)
        # Monotonic clock readings too: on one machine a benchmark can line them up with its own.
        call.emit(
            {
                "type": "barge_in",
                "by": by,
                "stop_s": round(stop_s, 4),
                "heard_at": onset_arrived_at,
                "paused_at": paused_at,
            }
        )
        event(log, "barge_in", call_id=call.call_id, stop_s=round(stop_s, 4), cut=len(cut))

    def check_backchannel(self, request: int, audio: np.ndarray, speech_ms: float) -> None:
        self.call.backchannel_in.put(BackchannelQuery(request, audio, speech_ms))

    # the caller's turns

    def open_turn(self) -> str:
        turn_id = f"{self.call.call_id}:turn-{next(self._turn_numbers)}"
        metrics.TURNS_TOTAL.inc()
        return turn_id

    def user_started_speaking(self) -> None:
        self.call.set_state("user_speaking")

    def speech_paused(
        self,
        turn_id: str,
        revision: int,
        audio: np.ndarray,
        speech_end: float,
        heard: Transcription | None = None,
    ) -> None:
        call = self.call
        draft: Response | None = None
        if call.settings.speculative_replies:
            self._cancel_draft()
            call.scope.new_response()
            draft = Response(Tag(turn_id, revision, call.scope.generation), speech_end=speech_end)
            call.speculation.start(draft)
            call.make_active(draft)
        call.stt_in.put(EarlyUtterance(turn_id, revision, audio, speech_end, heard, draft))

    def judge_turn_end(self, speech_end: float, audio: np.ndarray) -> None:
        if self.call.turn_end_in is not None:
            self.call.turn_end_in.put(TurnEndQuery(speech_end, audio))

    def speech_resumed(self, turn_id: str, revision: int) -> None:
        """The caller went on after a pause: the reply started at that pause is cancelled unheard."""
        self._cancel_draft()

    def turn_ended(self, turn_id: str, revision: int, audio: np.ndarray, speech_end: float) -> None:
        call = self.call
        draft = call.speculation.draft()
        if draft is not None and "stt_failed" in draft.marks:
            self._cancel_draft()
        adopted = call.speculation.adopt(turn_id, revision, speech_end)
        if adopted is not None:
            # The reply started at the pause was for exactly this speech: it is the turn's reply.
            for payload in adopted[1]:
                call.emit(payload)
            call.set_state("thinking")
            return
        self._cancel_draft()  # made for speech the turn went on past (none when resumption cancelled it)
        call.scope.new_response()
        response = Response(Tag(turn_id, revision, call.scope.generation), speech_end=speech_end)
        call.make_active(response)
        call.stt_in.put(Utterance(response, audio))
        call.set_state("thinking")

    def _cancel_draft(self) -> None:
        call = self.call
        draft = call.speculation.take()
        if draft is None:
            return
        # Through the scope, so every stage drops its work at the next token or chunk; its audio was held
        # at the Outbound's gate, which now drops it.
        call.scope.cancel()
        if draft.tag.turn_id is not None and draft.tag.revision is not None:
            call.reopen.release(draft.tag.turn_id, draft.tag.revision)  # held for speech that went on
        call.flush_stage_queues()
        call.drop_active(draft)
        event(log, "speculation_wasted", logging.DEBUG, call_id=call.call_id, turn_id=draft.tag.turn_id)

    def reopen_confirmed(self, turn_id: str, base: int, candidate: int) -> None:
        call = self.call
        call.scope.cancel()
        call.outbound.flush()
        call.flush_stage_queues()
        if call.take_active() is not None:
            metrics.COMMITS_TOTAL.labels(outcome="superseded").inc()
            call.emit({"type": "agent_cancelled", "turn_id": turn_id})
        call.set_state("user_speaking")
        event(log, "turn_reopened", call_id=call.call_id, turn_id=turn_id, revision=candidate)

    def keys_entered(self, digits: str) -> None:
        """A finished keypad entry is a user turn of its own: the LLM reads "[DTMF 12#]".

        Keys pressed while the agent talks stop it, as on any phone menu.
        """
        call = self.call
        now = time.monotonic()
        if call.agent_active():
            self.interrupt_agent(now, by="keypad")
        turn_id = self.open_turn()
        call.tracker.observe(turn_id, 0)
        text = f"[DTMF {digits}]"
        call.scope.new_response()
        response = Response(Tag(turn_id, 0, call.scope.generation), speech_end=now, user_text=text)
        call.make_active(response)
        call.conversation.set_user_text(turn_id, 0, text)
        call.emit(
            {"type": "user_transcript", "turn_id": turn_id, "revision": 0, "text": text, "keypad": True}
        )
        event(log, "keys_entered", call_id=call.call_id, turn_id=turn_id, digits=digits)
        call.llm_in.put(Transcript(response, text))
        call.set_state("thinking")
