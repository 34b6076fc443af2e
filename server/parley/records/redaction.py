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


def analysis_without_text(analysis: Mapping[str, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """A post-call analysis (analysis/) without what was said: no summary (it retells the call), no
    verdict's reason (it may quote it), and of the extraction only what the schema bounds (booleans,
    numbers, and strings the schema names with `enum` or `const`), the way a record keeps what happened
    but no text."""
    kept = {key: value for key, value in analysis.items() if key != "summary"}
    verdict = analysis.get("verdict")
    if isinstance(verdict, Mapping):
        kept["verdict"] = {key: value for key, value in verdict.items() if key != "reason"}
    if "extraction" in analysis:
        kept["extraction"] = _bounded(analysis["extraction"], schema or {})
    return kept


def _bounded(value: Any, schema: Mapping[str, Any]) -> Any:
    """`value` without the strings `schema` leaves free (None where one stood alone)."""
    if isinstance(value, Mapping):
        properties = schema.get("properties")
        fields = properties if isinstance(properties, Mapping) else {}
        kept = {key: _bounded(item, _sub(fields.get(key))) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item is not None or value[key] is None}
    if isinstance(value, list):
        return [_bounded(item, _sub(schema.get("items"))) for item in value]
    if isinstance(value, str):
        named = [*schema.get("enum", []), *([schema["const"]] if "const" in schema else [])]
        return value if value in named else None
    return value


def _sub(schema: Any) -> Mapping[str, Any]:
    return schema if isinstance(schema, Mapping) else {}
