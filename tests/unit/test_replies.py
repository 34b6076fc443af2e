"""The replies' owner (replies.py): each way a reply ends, and what the caller, the history and the stages
are told. Items in, decisions out: the Outbound is pulled by hand, nothing sleeps."""

from __future__ import annotations

from typing import Any

import numpy as np

from parley.call_signals import CallSignals
from parley.pipeline.history import Conversation
from parley.pipeline.messages import AudioChunk, EndOfResponse, ReplyText, Response
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.replies import Replies

RATE = 8000
FRAME = RATE // 50


class Inboxes:
    """The stages' inboxes as the replies reach them: what was cancelled and what was given to TTS."""

    def __init__(self) -> None:
        self.cancels: list[int] = []
        self.spoken: list[ReplyText] = []

    def cancel(self, generation: int) -> None:
        self.cancels.append(generation)

    def speak(self, item: ReplyText) -> None:
        self.spoken.append(item)

    def speech_waiting(self) -> bool:
        return False


class HangUps:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def hang_up(self, reason: str) -> None:
        self.reasons.append(reason)


class Turns:
    in_turn = False


def make(**options: Any) -> tuple[Replies, Inboxes, list[dict[str, Any]], Conversation]:
    signals = CallSignals("c-1")
    events: list[dict[str, Any]] = []
    signals.watch(events.append)
    inboxes = Inboxes()
    conversation = Conversation("You help.", 8)
    replies = Replies("c-1", signals, inboxes, SpeculativeTurnTracker(), conversation, RATE, **options)
    replies.follow(Turns())
    return replies, inboxes, events, conversation


def play(replies: Replies, response: Response, text: str, frames: int) -> None:
    """`text` as one clip of `frames` frames, of which the caller hears them all, frame by frame."""
    pcm = np.full(FRAME * frames, 100, dtype=np.int16)
    replies.outbound.push(AudioChunk(response, pcm, text))


def pull(replies: Replies, frames: int) -> None:
    for _ in range(frames):
        replies.outbound.pull_frame()


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events if e["type"] != "state"]


def test_a_reply_played_to_its_end_is_committed_and_the_call_listens_again() -> None:
    replies, _, events, conversation = make()
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    conversation.set_user_text("c-1:turn-1", 0, "Hello?")
    assert replies.active()
    play(replies, response, "Hello there.", 2)
    replies.outbound.push(EndOfResponse(response))
    pull(replies, 4)
    assert not replies.active()
    assert kinds(events) == ["latency", "agent_text", "agent_done"]
    assert events[-1] == {"type": "state", "state": "listening"}
    done = next(e for e in events if e["type"] == "agent_done")
    assert done["text"] == "Hello there." and not done["interrupted"]
    assert conversation.snapshot()[-1]["agent"] == "Hello there."


def test_a_barge_in_commits_what_was_heard_and_cancels_every_stage() -> None:
    replies, inboxes, events, conversation = make()
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    conversation.set_user_text("c-1:turn-1", 0, "Tell me a story.")
    play(replies, response, "Once upon a time.", 2)
    play(replies, response, "There was a king.", 2)
    pull(replies, 2)  # the first sentence heard
    generation = replies.generation
    replies.pause()
    cut = replies.interrupt()
    assert cut == [response] and replies.is_stale(response.tag)
    assert inboxes.cancels == [replies.generation] and replies.generation != generation
    done = next(e for e in events if e["type"] == "agent_done")
    assert done["interrupted"] and done["text"].startswith("Once upon a time.")
    assert "king" not in done["text"]
    assert not replies.active() and not replies.outbound.has_audio()


def test_a_draft_is_adopted_with_its_held_events_or_cancelled_unheard() -> None:
    replies, inboxes, events, _ = make()
    draft = replies.start_draft("c-1:turn-1", 0, speech_end=5.0)
    transcript = {"type": "user_transcript", "turn_id": "c-1:turn-1", "text": "Hi"}
    replies.emit_for(draft, transcript)
    assert events == []  # the transcript of half a turn is not shown
    assert replies.may_play(draft.tag) is None  # its audio waits for the turn to end
    assert replies.adopt("c-1:turn-1", 0, speech_end=5.0) == [transcript]
    assert not replies.is_stale(draft.tag) and inboxes.cancels == []

    second = replies.start_draft("c-1:turn-2", 0, speech_end=9.0)
    replies.cancel_draft()  # the caller went on
    assert replies.is_stale(second.tag) and replies.may_play(second.tag) is False
    assert inboxes.cancels == [replies.generation]
    assert replies.adopt("c-1:turn-2", 0, speech_end=9.0) is None


def test_a_draft_for_other_speech_is_not_adopted() -> None:
    replies, _, _, _ = make()
    replies.start_draft("c-1:turn-1", 0, speech_end=5.0)
    assert replies.adopt("c-1:turn-1", 0, speech_end=6.0) is None  # the caller spoke on after the pause


def test_a_reopened_turn_supersedes_its_unheard_reply() -> None:
    replies, inboxes, events, _ = make()
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    play(replies, response, "Sure.", 2)
    assert replies.supersede()
    assert replies.is_stale(response.tag) and not replies.outbound.has_audio()
    assert inboxes.cancels == [replies.generation]
    assert not replies.supersede()  # nothing left to supersede
    assert "agent_done" not in kinds(events)  # nothing of it was heard: nothing is committed


def test_the_end_of_the_call_keeps_what_the_caller_heard() -> None:
    replies, _, events, conversation = make()
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    conversation.set_user_text("c-1:turn-1", 0, "What time is it?")
    play(replies, response, "It is noon.", 2)
    play(replies, response, "Anything else?", 2)
    pull(replies, 2)
    replies.end("hangup")
    done = next(e for e in events if e["type"] == "agent_done")
    assert done["interrupted"] and done["text"] == "It is noon."
    assert conversation.snapshot()[-1]["agent"].startswith("It is noon.")
    pull(replies, 1)  # the end goes out after the commit
    assert events[-1] == {"type": "state", "state": "ended"}


def test_a_goodbye_hangs_up_once_heard() -> None:
    line = HangUps()
    replies, _, _, _ = make(line=line)
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    replies.hang_up_after_reply()
    play(replies, response, "Goodbye.", 2)
    replies.outbound.push(EndOfResponse(response))
    pull(replies, 1)
    assert line.reasons == []  # not before the caller heard all of it
    pull(replies, 3)
    assert line.reasons == ["agent_hangup"]


def test_lost_turns_are_apologised_for_then_end_the_call() -> None:
    line = HangUps()
    replies, inboxes, _, _ = make(line=line, apology="Sorry, say that again?", max_lost_turns=2)
    replies.apologise()
    assert [item.text for item in inboxes.spoken] == ["Sorry, say that again?", ""]
    assert inboxes.spoken[-1].final and line.reasons == []
    replies.apologise()
    assert line.reasons == ["engine_error"]


def test_an_abandoned_reply_closes_its_books_with_tts() -> None:
    replies, inboxes, _, _ = make()
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    replies.abandon(response)
    assert not replies.active()
    assert inboxes.spoken == [ReplyText(response, "", final=True)]
