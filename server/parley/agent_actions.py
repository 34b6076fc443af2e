"""What an agent's built-in tools do to its call: hang up after the goodbye, transfer, press keys.

Runs on a tool worker's thread. The line itself (a transport's LineControl) does the work on the event
loop; this waits for the caller to have heard what the agent said first, and turns whatever the line
reports into the error the model reads.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from parley.agent.tools import ToolFailed
from parley.log import event

if TYPE_CHECKING:
    from parley.call import Call

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


class AgentActions:
    def __init__(self, call: Call) -> None:
        self.call = call
        self.hang_up_due = False  # set by end_call: the call hangs up once the reply has been heard

    def end_after_reply(self) -> None:
        self.hang_up_due = True

    def transfer(self, destination: str) -> None:
        line = self._line()
        self._wait_until_heard(TRANSFER_NOTICE_WAIT_S)
        try:
            line.transfer(destination, TRANSFER_TIMEOUT_S)
        except Exception as exc:  # LineActionFailed, or anything else the transport raised
            raise ToolFailed(str(exc) or "the transfer failed") from None
        self.call.publish("call.transferred", {"to": destination})
        event(log, "call_transferred", call_id=self.call.call_id, to=destination)

    def send_dtmf(self, digits: str) -> None:
        line = self._line()
        try:
            line.send_dtmf(digits, DTMF_TIMEOUT_S)
        except Exception as exc:
            raise ToolFailed(str(exc) or "the digits could not be sent") from None

    def _line(self) -> Line:
        line = self.call.line
        if line is None or self.call.ended:
            raise ToolFailed("the call has no line to act on")
        return line

    def _wait_until_heard(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.call.agent_speaking():
            time.sleep(0.05)
