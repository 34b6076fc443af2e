"""What the agent's built-in tools do to its line (agent_actions.py): each action reaches the line once
the caller heard what the agent said first, and whatever the line reports is what the model reads."""

from __future__ import annotations

from typing import Any

import pytest

from parley.agent.tools import ToolFailed
from parley.agent_actions import AgentActions


class Line:
    def __init__(self, error: str = "") -> None:
        self.error = error
        self.done: list[tuple[str, str]] = []

    def hang_up(self, reason: str) -> None:
        self.done.append(("hang_up", reason))

    def transfer(self, destination: str, timeout_s: float) -> None:
        if self.error:
            raise RuntimeError(self.error)
        self.done.append(("transfer", destination))

    def send_dtmf(self, digits: str, timeout_s: float) -> None:
        if self.error:
            raise RuntimeError(self.error)
        self.done.append(("dtmf", digits))


class Replies:
    def __init__(self) -> None:
        self.hang_up_due = False
        self.asked = 0

    def speaking(self) -> bool:
        self.asked += 1
        return False

    def hang_up_after_reply(self) -> None:
        self.hang_up_due = True


def make(line: Line | None, *, ended: bool = False) -> tuple[AgentActions, Replies, list[Any]]:
    replies = Replies()
    published: list[Any] = []
    actions = AgentActions(
        "c-1", line, replies, lambda kind, data: published.append((kind, data)), lambda: ended
    )
    return actions, replies, published


def test_a_transfer_waits_for_the_notice_to_be_heard_and_is_published() -> None:
    line = Line()
    actions, replies, published = make(line)
    actions.transfer("sip:desk@pbx.example.com")
    assert replies.asked >= 1  # it asked whether the agent was still speaking first
    assert line.done == [("transfer", "sip:desk@pbx.example.com")]
    assert published == [("call.transferred", {"to": "sip:desk@pbx.example.com"})]


def test_what_the_line_reports_is_what_the_model_reads() -> None:
    actions, _, published = make(Line(error="486 Busy Here"))
    with pytest.raises(ToolFailed, match="486 Busy Here"):
        actions.transfer("sip:desk@pbx.example.com")
    with pytest.raises(ToolFailed, match="486"):
        actions.send_dtmf("12")
    assert published == []


def test_no_line_or_an_ended_call_refuses_every_action() -> None:
    for actions, _, _ in (make(None), make(Line(), ended=True)):
        with pytest.raises(ToolFailed, match="no line"):
            actions.send_dtmf("1")


def test_end_call_hangs_up_after_the_reply() -> None:
    line = Line()
    actions, replies, _ = make(line)
    actions.end_after_reply()
    assert replies.hang_up_due and line.done == []  # the replies hang up once the goodbye was heard
