"""The turn decisions (turn_decisions.py): what the call does on each decision of its turn-taker, as the
items the stages get and the events the caller sees. Called as the VAD thread calls them; nothing sleeps."""

from __future__ import annotations

from typing import Any

import numpy as np

from parley.call_signals import CallSignals
from parley.pipeline.history import Conversation
from parley.pipeline.messages import (
    AudioChunk,
    BackchannelQuery,
    EarlyUtterance,
    ReplyText,
    Transcript,
    TurnEndQuery,
    Utterance,
)
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.replies import Replies
from parley.turn_decisions import TurnDecisions

RATE = 8000
AUDIO = np.zeros(1600, dtype=np.int16)


class Inboxes:
    """Every stage's inbox, as a list of what was put in it, in order (cancels included)."""

    def __init__(self) -> None:
        self.items: list[object] = []

    def hear(self, item: Utterance | EarlyUtterance) -> None:
        self.items.append(item)

    def answer(self, item: Transcript) -> None:
        self.items.append(item)

    def speak(self, item: ReplyText) -> None:
        self.items.append(item)

    def ask_backchannel(self, query: BackchannelQuery) -> None:
        self.items.append(query)

    def ask_turn_end(self, query: TurnEndQuery) -> None:
        self.items.append(query)

    def cancel(self, generation: int) -> None:
        self.items.append(("cancel", generation))

    def speech_waiting(self) -> bool:
        return False


def make(*, speculative: bool = True) -> tuple[TurnDecisions, Inboxes, list[dict[str, Any]]]:
    signals = CallSignals("c-1")
    events: list[dict[str, Any]] = []
    signals.watch(events.append)
    inboxes = Inboxes()
    tracker = SpeculativeTurnTracker()
    conversation = Conversation("You help.", 8)
    replies = Replies("c-1", signals, inboxes, tracker, conversation, RATE)
    decisions = TurnDecisions(
        "c-1", replies, inboxes, signals, tracker, conversation, speculative=speculative
    )
    return decisions, inboxes, events


def states(events: list[dict[str, Any]]) -> list[str]:
    return [e["state"] for e in events if e["type"] == "state"]


def test_a_turn_that_ends_at_its_pause_adopts_the_reply_started_there() -> None:
    decisions, inboxes, events = make()
    turn = decisions.open_turn()
    decisions.user_started_speaking()
    decisions.speech_paused(turn, 0, AUDIO, speech_end=1.0)
    (early,) = inboxes.items
    assert isinstance(early, EarlyUtterance) and early.draft is not None
    assert early.generation == early.draft.tag.generation
    decisions.turn_ended(turn, 0, AUDIO, speech_end=1.0)
    assert inboxes.items == [early]  # no second transcription, no cancel: the draft is the reply
    assert states(events) == ["user_speaking", "thinking"]
    assert decisions.agent_active()


def test_speech_after_the_pause_cancels_its_draft_and_the_turn_gets_a_reply_of_its_own() -> None:
    decisions, inboxes, _ = make()
    turn = decisions.open_turn()
    decisions.speech_paused(turn, 0, AUDIO, speech_end=1.0)
    draft = inboxes.items[0]
    assert isinstance(draft, EarlyUtterance) and draft.draft is not None
    decisions.speech_resumed(turn, 0)
    decisions.turn_ended(turn, 0, AUDIO, speech_end=2.5)
    cancel, utterance = inboxes.items[1:]
    assert cancel == ("cancel", draft.generation + 1)  # the stages drop the draft's work
    assert isinstance(utterance, Utterance) and utterance.response.speech_end == 2.5
    assert utterance.generation == draft.generation + 1


def test_without_speculation_a_pause_only_transcribes_ahead() -> None:
    decisions, inboxes, _ = make(speculative=False)
    turn = decisions.open_turn()
    decisions.speech_paused(turn, 0, AUDIO, speech_end=1.0)
    decisions.turn_ended(turn, 0, AUDIO, speech_end=1.0)
    early, utterance = inboxes.items
    assert isinstance(early, EarlyUtterance) and early.draft is None
    assert isinstance(utterance, Utterance)


def test_a_barge_in_stops_the_agent_and_tells_the_caller_how_fast() -> None:
    decisions, inboxes, events = make()
    turn = decisions.open_turn()
    decisions.turn_ended(turn, 0, AUDIO, speech_end=1.0)
    utterance = inboxes.items[0]
    assert isinstance(utterance, Utterance)
    replies = decisions.replies
    replies.outbound.push(AudioChunk(utterance.response, np.ones(RATE, dtype=np.int16), "Well."))
    replies.outbound.pull_frame()
    assert decisions.agent_active()
    paused_at = decisions.pause_agent()
    decisions.interrupt_agent(paused_at - 0.05)
    barge = next(e for e in events if e["type"] == "barge_in")
    assert barge["by"] == "speech" and 0.049 < barge["stop_s"] < 0.051
    assert inboxes.items[-1] == ("cancel", utterance.generation + 1)
    assert not decisions.agent_active()
    assert [e["type"] for e in events if e["type"] in ("agent_paused", "agent_done")] == [
        "agent_paused",
        "agent_done",
    ]


def test_a_backchannel_resumes_the_agent() -> None:
    decisions, _, events = make()
    decisions.pause_agent()
    assert decisions.replies.outbound.paused
    decisions.resume_agent("mhm")
    assert not decisions.replies.outbound.paused
    assert events[-1] == {"type": "agent_resumed", "heard": "mhm"}


def test_a_reopened_turn_cancels_its_reply() -> None:
    decisions, inboxes, events = make()
    turn = decisions.open_turn()
    decisions.turn_ended(turn, 0, AUDIO, speech_end=1.0)
    decisions.reopen_confirmed(turn, 0, 1)
    assert {"type": "agent_cancelled", "turn_id": turn} in events
    assert inboxes.items[-1] == ("cancel", 1) and states(events)[-1] == "user_speaking"


def test_a_keypad_entry_is_a_turn_of_its_own_and_stops_the_agent() -> None:
    decisions, inboxes, events = make()
    decisions.replies.say("Press one for sales.")
    decisions.keys_entered("1#")
    transcript = inboxes.items[-1]
    assert isinstance(transcript, Transcript) and transcript.text == "[DTMF 1#]"
    assert ("cancel", 1) in inboxes.items  # the greeting was cut
    assert next(e for e in events if e["type"] == "barge_in")["by"] == "keypad"
    shown = next(e for e in events if e["type"] == "user_transcript")
    assert shown["keypad"] and shown["turn_id"] == transcript.response.tag.turn_id == "c-1:turn-1"


def test_questions_about_the_turn_go_to_their_stages() -> None:
    decisions, inboxes, _ = make()
    decisions.check_backchannel(3, AUDIO, 400.0)
    decisions.judge_turn_end(1.0, AUDIO)
    assert inboxes.items == [BackchannelQuery(3, AUDIO, 400.0), TurnEndQuery(1.0, AUDIO)]
