"""The built-in tools an agent file can enable: hang up, transfer, press keys. They act on the call's
line through the call, which knows its transport; to the model they are tools like any other."""

from __future__ import annotations

from typing import Any, Protocol

from parley.agent.agentfile import EMPTY_PARAMETERS, Agent, ToolSpec

DTMF_PATTERN = "^[0-9*#A-D]{1,32}$"
TRANSFER_TIMEOUT_MS = 40_000  # the far end rings before it accepts: a REFER's NOTIFY takes its time


class LineActions(Protocol):
    """What built-ins ask of a call; the blocking ones raise ToolFailed with what the model reads."""

    def end_after_reply(self) -> None: ...
    def transfer(self, destination: str) -> None: ...
    def send_dtmf(self, digits: str) -> None: ...


class _NoLine:
    """The built-ins as an LLM is offered them, with no call to act on (`offered_tools`): rendering a
    tool's description never runs it."""

    def end_after_reply(self) -> None:
        raise RuntimeError("no call to end")

    def transfer(self, destination: str) -> None:
        raise RuntimeError("no call to transfer")

    def send_dtmf(self, digits: str) -> None:
        raise RuntimeError("no call to send keys on")


def offered_tools(agent: Agent) -> list[dict[str, Any]]:
    """The tools the LLM is offered in each of `agent`'s calls, as it is offered them: the agent's own,
    then the built-ins it enables (pipeline/replying.py's order)."""
    return [spec.as_openai() for spec in [*agent.tools, *builtin_tools(agent, _NoLine())]]


def builtin_tools(agent: Agent, actions: LineActions) -> list[ToolSpec]:
    tools: list[ToolSpec] = []
    enabled = agent.builtins
    if enabled.end_call:

        def end_call() -> dict[str, Any]:
            actions.end_after_reply()
            return {"ok": True, "note": "the call ends once your goodbye has been heard"}

        tools.append(
            ToolSpec(
                "end_call",
                "Hang up the call. Use it when the caller says goodbye or the conversation is over; "
                "say a short goodbye as well.",
                EMPTY_PARAMETERS,
                python="builtin:end_call",
                timeout_ms=2000,
                function=end_call,
            )
        )
    if enabled.transfer:

        def transfer(destination: str) -> dict[str, Any]:
            actions.transfer(destination)
            return {"ok": True, "transferred_to": destination}

        tools.append(
            ToolSpec(
                "transfer",
                "Transfer the caller to a person or another line. Tell the caller first.",
                {
                    "type": "object",
                    "properties": {"destination": {"type": "string", "enum": list(enabled.transfer)}},
                    "required": ["destination"],
                },
                python="builtin:transfer",
                timeout_ms=TRANSFER_TIMEOUT_MS,
                function=transfer,
            )
        )
    if enabled.send_dtmf:

        def send_dtmf(digits: str) -> dict[str, Any]:
            actions.send_dtmf(digits)
            return {"ok": True, "sent": digits}

        tools.append(
            ToolSpec(
                "send_dtmf",
                "Press keys on the phone keypad (for example to pick a menu option on the other end).",
                {
                    "type": "object",
                    "properties": {"digits": {"type": "string", "pattern": DTMF_PATTERN}},
                    "required": ["digits"],
                },
                python="builtin:send_dtmf",
                timeout_ms=15_000,
                function=send_dtmf,
            )
        )
    return tools
