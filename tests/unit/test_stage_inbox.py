"""A stage's inbox and its priority lane (pipeline/queues.py): a cancel jumps the queue, and the stage
drops what it made stale before it takes anything else. Items in, items out: the stage runs on this
thread until its inbox closes."""

from __future__ import annotations

import numpy as np

from parley.pipeline.cancel import GENERATION_MODULUS, precedes
from parley.pipeline.messages import Cancel, ReplyText, Response, Tag, TurnEndQuery
from parley.pipeline.queues import QueueClosed, StageQueue
from parley.pipeline.stages import Stage, StageContext


def text(generation: int, words: str) -> ReplyText:
    return ReplyText(Response(Tag("c:turn-1", 0, generation)), words)


def test_a_cancel_is_taken_before_the_items_waiting() -> None:
    inbox: StageQueue[ReplyText] = StageQueue("tts")
    first = text(0, "Once upon a time")
    inbox.put(first)
    inbox.cancel(1)
    assert inbox.get(0) == Cancel(1)
    assert inbox.get(0) is first
    assert inbox.get(0) is None


def test_a_cancel_drops_older_generations_only() -> None:
    inbox: StageQueue[ReplyText | TurnEndQuery] = StageQueue("tts")
    stale, fresh = text(4, "old"), text(5, "new")
    query = TurnEndQuery(1.0, np.zeros(10, dtype=np.int16))  # of no reply: kept
    for item in (stale, query, fresh):
        inbox.put(item)
    assert inbox.drop_stale(Cancel(5)) == 1
    assert [inbox.get(0), inbox.get(0)] == [query, fresh]


def test_generations_are_ordered_across_the_wrap() -> None:
    last = GENERATION_MODULUS - 1
    assert precedes(last, 0) and not precedes(0, last)
    assert precedes(3, 4) and not precedes(4, 4) and not precedes(5, 4)
    assert Cancel(0).drops(text(last, "before the wrap"))


def test_the_end_of_the_call_jumps_the_queue_too() -> None:
    inbox: StageQueue[ReplyText] = StageQueue("tts")
    inbox.put(text(0, "unsaid"))
    inbox.cancel(1)
    inbox.close()
    try:
        inbox.get(0)
    except QueueClosed:
        return
    raise AssertionError("a closed inbox handed out an item")


class Speaker(Stage[ReplyText]):
    """A stage that keeps what it handles, and stops the call at "bye"."""

    stage_name = "test_speaker"

    def __init__(self, inbox: StageQueue[ReplyText]) -> None:
        ctx = StageContext("c", None, None, None, lambda payload: None)  # type: ignore[arg-type]
        super().__init__(ctx, inbox)
        self.handled: list[str] = []

    def handle(self, item: ReplyText) -> None:
        self.handled.append(item.text)
        if item.text == "bye":
            self.inbox.close()


def test_a_stage_drops_its_stale_inbox_when_a_cancel_arrives() -> None:
    inbox: StageQueue[ReplyText] = StageQueue("tts")
    for item in (text(0, "one"), text(0, "two"), text(1, "after the barge-in"), text(1, "bye")):
        inbox.put(item)
    inbox.cancel(1)
    stage = Speaker(inbox)
    stage.run()  # on this thread, until "bye" closes the inbox
    assert stage.handled == ["after the barge-in", "bye"]
