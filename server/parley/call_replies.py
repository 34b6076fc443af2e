"""What the caller hears of each reply (the `OutboundListener` of outbound.py).

The Outbound tells a call when a reply's piece starts playing, when a reply has played to its end (or was
dropped), when the call's end went out and when its queued audio was flushed. Here those become what the
caller, the operator and the history see: the reply's latency (event and metric) when its first piece
plays, its text as each piece plays, and its commit into the conversation as far as the caller heard it,
on its end here or when a barge-in cut it (`commit(..., interrupted=True)` from call_turns.py).

Called from the transport's thread or event loop: quick, never blocks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from parley import metrics
from parley.log import event
from parley.pipeline.messages import Response

if TYPE_CHECKING:
    from parley.call import Call

log = logging.getLogger(__name__)

GREETING_KEY = "greeting"  # the greeting's turn in the history and in events


class HeardReplies:
    """One per call: its Outbound's listener, and where its replies are committed."""

    def __init__(self, call: Call) -> None:
        self.call = call

    def on_segment_started(self, response: Response, text: str, first: bool) -> None:
        call = self.call
        key = turn_key(response)
        if first:
            call.set_state("agent_speaking")
            latency = response.response_s
            if latency is not None:
                metrics.RESPONSE_LATENCY.observe(latency)
            call.emit(
                {
                    "type": "latency",
                    "turn_id": key,
                    "response_s": _round(latency),
                    "stt_s": _round(response.stt_s),
                    "llm_first_token_s": _round(response.llm_first_token_s),
                    "tts_first_audio_s": _round(response.tts_first_audio_s),
                    "timeline": response.timeline(),
                }
            )
            event(log, "reply_started", call_id=call.call_id, turn_id=key, response_s=_round(latency))
        if text:
            call.emit({"type": "agent_text", "turn_id": key, "text": text})

    def on_response_ended(self, response: Response, latest: bool) -> None:
        call = self.call
        call.scope.response_done(response.tag.generation)
        call.drop_active(response)
        if latest and not call.scope.is_stale(response.tag.generation):
            self.commit(response, interrupted=False)
            if call.actions.hang_up_due and call.line is not None:
                # The agent said goodbye (end_call) and the caller has now heard all of it.
                call.line.hang_up("agent_hangup")
        if not call.agent_active() and not call.turns.in_turn:
            call.set_state("listening")

    def on_end_of_call(self, reason: str) -> None:
        self.call.set_state("ended")

    def on_flushed(self) -> None:
        self.call.audio_flushed()

    def commit(self, response: Response, *, interrupted: bool) -> None:
        """The reply enters the history as far as the caller heard it."""
        call = self.call
        tag = response.tag
        key = turn_key(response)
        heard = response.heard_text()
        if tag.turn_id is not None and tag.revision is not None:
            call.tracker.commit(tag.turn_id, tag.revision)
        call.conversation.commit_agent(key, heard, interrupted=interrupted, response_s=response.response_s)
        outcome = "interrupted" if interrupted else "committed"
        metrics.COMMITS_TOTAL.labels(outcome=outcome).inc()
        call.emit({"type": "agent_done", "turn_id": key, "text": heard, "interrupted": interrupted})
        event(log, "reply_committed", call_id=call.call_id, turn_id=key, outcome=outcome, text=heard)


def turn_key(response: Response) -> str:
    """The response's turn in the history and in events (the greeting has no turn of its own)."""
    return response.tag.turn_id or GREETING_KEY


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
