"""Tool calls out of a model's stream: the two shapes models give them in.

- OpenAI-compatible endpoints (vLLM, llama.cpp's server, Ollama) stream `delta.tool_calls`: pieces of
  the id, the name and the arguments' JSON text, keyed by an index; `ToolCallAccumulator` joins them.
- A local model whose chat template declares tools the Hermes/Qwen2.5 way answers with
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in its text; `TaggedToolCalls` takes those
  out of the text stream as they complete and passes every other character through at once (holding
  back only what could be the start of a tag).
- Models also write a call as a fenced JSON block (```json {"name": ...} ```: Qwen2.5-Coder-0.5B behind
  llama.cpp's server, which left it in the text), or as the reply's JSON alone. `TaggedToolCalls` takes
  those too, when they name a tool (one of those offered, when it is told their names); any other
  fenced block is spoken as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
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
# Qwen's chat template lists the offered tools between these tags, and a small model (Qwen2.5-Coder-1.5B
# in the order desk's scenarios) wraps its call in them instead of <tool_call>: read aloud, the caller
# heard the JSON.
OPEN_TOOLS = "<tools>"
CLOSE_TOOLS = "</tools>"
FENCE = "```"
_OPENERS = (OPEN_TAG, OPEN_TOOLS, FENCE)
_CLOSERS = {OPEN_TAG: CLOSE_TAG, OPEN_TOOLS: CLOSE_TOOLS, FENCE: FENCE}
_LANGUAGE = re.compile(r"[A-Za-z_]*\s*")  # what may follow a fence's opening: ```json, ```tool_call


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
    """Splits a text stream into spoken text and the tool calls written in it.

    `<tool_call>` blocks are calls, and so are a fenced block whose JSON is a call and a reply that is
    nothing but a call's JSON; given `offered` (the names of the tools offered), those two only when
    they call one of them.
    """

    def __init__(self, offered: Collection[str] | None = None) -> None:
        self._offered = frozenset(offered) if offered is not None else None
        self._buffer = ""
        self._inside = ""  # the opener of the block being read ("": none)
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
        self._buffer += delta
        if self._bare:
            return "", []
        spoken: list[str] = []
        calls: list[ToolCall] = []
        while self._buffer:
            if self._inside:
                close = _CLOSERS[self._inside]
                end = self._buffer.find(close)
                if end < 0:
                    break
                text, calls_in = self._block(self._buffer[:end])
                spoken.append(text)
                calls += calls_in
                self._buffer = self._buffer[end + len(close) :]
                self._inside = ""
                continue
            found = [(at, opener) for opener in _OPENERS if (at := self._buffer.find(opener)) >= 0]
            if found:
                start, self._inside = min(found)
                spoken.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(self._inside) :]
                continue
            keep = max(_partial_tag_suffix(self._buffer, opener) for opener in _OPENERS)
            spoken.append(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            break
        return "".join(spoken), calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """At the end of the stream: an unclosed block still counts as a call if its JSON is whole."""
        rest, self._buffer = self._buffer, ""
        if self._bare:
            calls = self._written(rest)
            return ("", calls) if calls else (rest, [])
        if self._inside:
            return self._block(rest)
        return rest, []

    def _block(self, body: str) -> tuple[str, list[ToolCall]]:
        """(text to speak, calls) for the inside of a block that has ended."""
        opener, self._inside = self._inside, ""
        if opener in (OPEN_TAG, OPEN_TOOLS):
            call = self._call(body)
            return "", [call] if call.name or self._offered is None else []
        language = _LANGUAGE.match(body)
        code = body[language.end() if language else 0 :]
        calls = self._written(code.replace(OPEN_TAG, "").replace(CLOSE_TAG, ""))
        return ("", calls) if calls else (FENCE + body + FENCE, [])

    def _written(self, text: str) -> list[ToolCall]:
        """The calls `text` (JSON: a call, or a list of calls) makes to offered tools; [] if any is not."""
        try:
            data = json.loads(text.strip())
        except ValueError:
            return []
        calls = [self._call(json.dumps(item)) for item in (data if isinstance(data, list) else [data])]
        offered = self._offered
        if not calls or not all(c.name and (offered is None or c.name in offered) for c in calls):
            return []
        return calls

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


def _partial_tag_suffix(text: str, opener: str) -> int:
    """How many trailing characters could be the beginning of `opener`."""
    for size in range(min(len(opener) - 1, len(text)), 0, -1):
        if opener.startswith(text[-size:]):
            return size
    return 0
