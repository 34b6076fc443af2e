"""What an agent's built-in tools do to its call: hang up after the goodbye, transfer, press keys.

Runs on a tool worker's thread. The line itself (a transport's LineControl) does the work on the event
loop; this waits for the caller to have heard what the agent said first, and turns whatever the line
reports into the error the model reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from parley.agent.tools import ToolFailed
from parley.log import event

log = logging.getLogger(__name__)

TRANSFER_NOTICE_WAIT_S = 8.0  # "I'll put you through" is heard before the transfer starts
TRANSFER_TIMEOUT_S = 35.0  # the far end rings before it answers; a REFER's final NOTIFY takes that long
DTMF_TIMEOUT_S = 10.0


class Line(Protocol):
    """What the agent may do to its call's line, from any thread (a transport's `LineControl`, which
    runs each action on the event loop; the blocking forms wait for its outcome)."""

    def hang_up(self, reason: str) -> None: ...

    def transfer(self, destination: str, timeout_s: float) -> None: ...

    def send_dtmf(self, digits: str, timeout_s: float) -> None: ...


class ReplyProgress(Protocol):
    """What the actions need of the call's replies (replies.py)."""

    def speaking(self) -> bool: ...

    def hang_up_after_reply(self) -> None: ...


class AgentActions:
    """The built-in tools' side of a call (agent/builtins.py's LineActions)."""

    def __init__(
        self,
        call_id: str,
        line: Line | None,
        replies: ReplyProgress,
        publish: Callable[[str, dict[str, Any]], None],
        ended: Callable[[], bool],
    ) -> None:
        self.call_id = call_id
        self.line = line
        self.replies = replies
        self.publish = publish
        self.ended = ended

    def end_after_reply(self) -> None:
        self.replies.hang_up_after_reply()

    def hang_up(self, reason: str) -> None:
        """End the call now (a machine answered: answering.py), with `reason` as its outcome."""
        line = self.line
        if line is not None and not self.ended():
            line.hang_up(reason)

    def transfer(self, destination: str) -> None:
        line = self._line()
        self._wait_until_heard(TRANSFER_NOTICE_WAIT_S)
        try:
            line.transfer(destination, TRANSFER_TIMEOUT_S)
        except Exception as exc:  # LineActionFailed, or anything else the transport raised
            raise ToolFailed(str(exc) or "the transfer failed") from None
        self.publish("call.transferred", {"to": destination})
        event(log, "call_transferred", call_id=self.call_id, to=destination)

    def send_dtmf(self, digits: str) -> None:
        line = self._line()
        try:
            line.send_dtmf(digits, DTMF_TIMEOUT_S)
        except Exception as exc:
            raise ToolFailed(str(exc) or "the digits could not be sent") from None

    def _line(self) -> Line:
        line = self.line
        if line is None or self.ended():
            raise ToolFailed("the call has no line to act on")
        return line

    def _wait_until_heard(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.replies.speaking():
            time.sleep(0.05)
