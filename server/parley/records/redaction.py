"""What `--record-transcripts off` keeps out of call records and out of the events a team's backend gets:
what was said and pressed (transcripts, the words a caller heard, keypad digits), tool arguments and
results (the model writes what it heard into them), the variables a token or caller set; and the
parties' phone numbers, masked to their last digits. What happened and when stays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parley.log import mask_numbers

TEXT_FIELDS = frozenset({"text", "digit", "digits", "heard", "arguments", "result"})
TURN_TEXT = ("user", "agent")


def without_text(payload: Mapping[str, Any]) -> dict[str, Any]:
    """An event (a call's, or a backend's `tool.called`) without what was said, pressed or passed."""
    return {key: value for key, value in payload.items() if key not in TEXT_FIELDS}


def masked_party(party: str) -> str:
    """A caller or callee (a SIP URI, a number) with its number masked."""
    return mask_numbers(party, alone=True)


def record_without_text(record: Mapping[str, Any]) -> dict[str, Any]:
    """A call's record (`Call.record()`, `call.ended`'s data) without text, digits, tool arguments and
    results or variables, its parties masked."""
    kept = dict(record)
    if "transcript" in record:
        kept["transcript"] = [
            {
                **without_text(turn),
                **dict.fromkeys(TURN_TEXT),
                "tools": [without_text(tool) for tool in turn.get("tools", [])],
            }
            for turn in record["transcript"]
        ]
    if "tool_calls" in record:
        kept["tool_calls"] = [without_text(tool) for tool in record["tool_calls"]]
    if "context" in record:
        kept["context"] = {}
    for party in ("caller", "called"):
        if isinstance(record.get(party), str):
            kept[party] = masked_party(record[party])
    return kept
