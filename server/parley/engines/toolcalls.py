"""Tool calls out of a model's stream: the two shapes models give them in.

- OpenAI-compatible endpoints (vLLM, llama.cpp's server, Ollama) stream `delta.tool_calls`: pieces of
  the id, the name and the arguments' JSON text, keyed by an index; `ToolCallAccumulator` joins them.
- A local model whose chat template declares tools the Hermes/Qwen2.5 way answers with
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in its text; `TaggedToolCalls` takes those
  out of the text stream as they complete and passes every other character through at once (holding
  back only what could be the start of a tag).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A model's request to run a tool: `arguments` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


@dataclass
class _Partial:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallAccumulator:
    """Joins streamed `delta.tool_calls` pieces into whole calls."""

    def __init__(self) -> None:
        self._calls: dict[int, _Partial] = {}

    def push(self, pieces: list[dict[str, Any]]) -> None:
        for piece in pieces:
            index = int(piece.get("index", len(self._calls)))
            partial = self._calls.setdefault(index, _Partial())
            partial.id = partial.id or str(piece.get("id") or "")
            function = piece.get("function") or {}
            partial.name += str(function.get("name") or "")
            partial.arguments.append(str(function.get("arguments") or ""))

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(p.id or f"call_{i}", p.name, "".join(p.arguments) or "{}")
            for i, p in sorted(self._calls.items())
            if p.name
        ]


class TaggedToolCalls:
    """Splits a text stream into spoken text and `<tool_call>` blocks."""

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False
        self._count = 0
        self._started = False
        self._bare = False  # the reply began with "{": maybe a call written without its tags

    def push(self, delta: str) -> tuple[str, list[ToolCall]]:
        """(text to speak now, calls completed by this delta)."""
        if not self._started and delta.strip():
            self._started = True
            # Small models (and runtimes that drop the tags as special tokens) sometimes write the call's
            # JSON alone. Nobody wants a JSON blob read aloud: hold such a reply until it is whole.
            self._bare = delta.lstrip().startswith("{")
        if self._bare:
            self._buffer += delta
            return "", []
        self._buffer += delta
        spoken: list[str] = []
        calls: list[ToolCall] = []
        while self._buffer:
            if self._inside:
                end = self._buffer.find(CLOSE_TAG)
                if end < 0:
                    break
                calls.append(self._call(self._buffer[:end]))
                self._buffer = self._buffer[end + len(CLOSE_TAG) :]
                self._inside = False
                continue
            start = self._buffer.find(OPEN_TAG)
            if start >= 0:
                spoken.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(OPEN_TAG) :]
                self._inside = True
                continue
            keep = _partial_tag_suffix(self._buffer)
            spoken.append(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            break
        return "".join(spoken), calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """At the end of the stream: an unclosed block still counts as a call if its JSON is whole."""
        rest, self._buffer = self._buffer, ""
        if self._bare:
            call = self._call(rest)
            return ("", [call]) if call.name else (rest, [])
        if self._inside:
            self._inside = False
            call = self._call(rest)
            return "", [call] if call.name else []
        return rest, []

    def _call(self, text: str) -> ToolCall:
        self._count += 1
        call_id = f"call_{self._count}"
        try:
            data = json.loads(text.strip())
        except ValueError:
            return ToolCall(call_id, "", text.strip())
        if not isinstance(data, dict):
            return ToolCall(call_id, "", text.strip())
        arguments = data.get("arguments", data.get("parameters", {}))
        arguments_text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return ToolCall(call_id, str(data.get("name") or ""), arguments_text)


def _partial_tag_suffix(text: str) -> int:
    """How many trailing characters could be the beginning of OPEN_TAG."""
    for size in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-size:]):
            return size
    return 0
