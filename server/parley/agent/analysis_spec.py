"""What an agent file's `[analysis]` asks of each of its calls once it has ended (analysis/ does it).

```toml
[analysis]
summary = true                                       # a short summary of the call
schema = '''{"type": "object", "required": ["resolved"],
            "properties": {"order_id": {"type": "string"}, "resolved": {"type": "boolean"}}}'''
success = "the caller's order status was given"      # what counts as success: a verdict and its reason
prompt = "Order ids are six digits."                 # more instructions for the analysis (optional)
```

`schema` is a JSON Schema of type object (an inline table, or the schema's JSON as a string); it is
checked when the file is read, and a bad one stops the start naming the file and the line. A table that
asks for nothing (no summary, schema or success) is an error too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

ANALYSIS_KEYS = frozenset({"summary", "schema", "success", "prompt"})
MAX_TEXT_CHARS = 2000  # `success` and `prompt`: read into every analysis's prompt

# How an agent file's reader reports a bad value: the message and the key whose line it names.
Failure = Callable[[str, str], Exception]


@dataclass(frozen=True)
class AnalysisSpec:
    summary: bool = False
    schema: Mapping[str, Any] | None = None  # the extraction's JSON Schema (type object)
    success: str = ""  # what counts as success ("": no verdict)
    prompt: str = ""  # instructions added to every question about the call


def read_analysis(raw: Any, fail: Failure) -> AnalysisSpec:
    """The `[analysis]` table of an agent file, checked; `fail` makes the error for a bad value."""
    if not isinstance(raw, dict):
        raise fail("[analysis] must be a table", "analysis")
    for key in raw:
        if key not in ANALYSIS_KEYS:
            raise fail(
                f"[analysis] has an unknown key {key!r} (known: {', '.join(sorted(ANALYSIS_KEYS))})", key
            )
    summary = raw.get("summary", False)
    if not isinstance(summary, bool):
        raise fail("summary must be true or false", "summary")
    success, prompt = raw.get("success", ""), raw.get("prompt", "")
    for key, value in (("success", success), ("prompt", prompt)):
        if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
            raise fail(f"{key} must be a string of at most {MAX_TEXT_CHARS} characters", key)
    schema = _schema(raw["schema"], fail) if "schema" in raw else None
    if not summary and schema is None and not success.strip():
        raise fail("[analysis] asks for nothing: set summary = true, a schema, or success", "analysis")
    return AnalysisSpec(summary=summary, schema=schema, success=success.strip(), prompt=prompt.strip())


def _schema(value: Any, fail: Failure) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise fail(f"schema is not JSON: {exc}", "schema") from None
    if not isinstance(value, dict) or value.get("type") != "object":
        raise fail('schema must be a JSON Schema of type "object"', "schema")
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.SchemaError as exc:
        raise fail(f"schema is not a valid JSON Schema: {exc.message}", "schema") from None
    return value
