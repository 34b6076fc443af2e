"""The default local model's tool calls are held to the offered tools' schemas (engines/tool_grammar.py).

Qwen2.5-0.5B run by llama.cpp, greedy. Unheld, it booked "Table for three tonight at eight" for "8:00",
a time the schema does not offer; held, every call names an offered tool with arguments valid for it,
and none is read out as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from parley.agent.opening import default_opening
from parley.config import Settings
from parley.engines.llm import LlmEngine, Message
from parley.engines.llm_loading import load_llm
from parley.engines.toolcalls import ToolCall


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    _tool(
        "book_table",
        "Book a table at the restaurant",
        {
            "type": "object",
            "properties": {
                "party_size": {"type": "integer", "minimum": 1, "maximum": 12},
                "time": {"type": "string", "enum": ["18:00", "18:30", "19:00", "19:30", "20:00", "20:30"]},
                "name": {"type": "string"},
            },
            "required": ["party_size", "time", "name"],
        },
    ),
    _tool(
        "set_reminder",
        "Call the caller back later",
        {
            "type": "object",
            "properties": {"minutes": {"type": "integer"}, "reason": {"type": "string"}},
            "required": ["minutes", "reason"],
        },
    ),
    _tool(
        "transfer",
        "Transfer the caller to a department",
        {
            "type": "object",
            "properties": {"department": {"type": "string", "enum": ["kitchen", "events", "billing"]}},
            "required": ["department"],
        },
    ),
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
SYSTEM = (
    "You are the phone line of Luigi's restaurant. Use the tools to book tables, to set a callback, "
    "and to transfer the caller. Reply in one or two short spoken sentences."
)


@pytest.fixture(scope="module")
def llm() -> Iterator[LlmEngine]:
    settings = Settings(llm_runtime="llamacpp", llm_max_tokens=96)
    engine = load_llm(settings, opening=default_opening(settings))
    yield engine
    close = getattr(engine, "close", None)
    if callable(close):
        close()


@pytest.mark.parametrize(
    "request_",
    [
        "Table for three tonight at eight please, Jones.",
        "Please call me back in ten minutes about my booking.",
        "I have a question about my bill, can you transfer me?",
    ],
)
def test_a_call_from_the_small_local_model_is_valid_for_its_tools_schema(
    llm: LlmEngine, request_: str
) -> None:
    messages: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request_}]
    out = list(llm.stream(messages, lambda: False, tools=TOOLS))
    said = "".join(d for d in out if isinstance(d, str))
    calls = [d for d in out if isinstance(d, ToolCall)]

    assert calls, said
    for call in calls:
        assert call.name in SCHEMAS
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert "{" not in said and "```" not in said


def test_a_call_with_a_number_nobody_said_is_asked_again_as_words(llm: LlmEngine) -> None:
    # Qwen2.5-Coder-0.5B answers "Hello, how are you today?" at the order desk with lookup_order "12345".
    from parley.bench.tools import SYSTEM_PROMPT
    from parley.bench.tools import TOOLS as ORDER_TOOLS
    from parley.pipeline.reply_guard import guarded_stream

    messages: list[Message] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Hello, how are you today?"},
    ]
    first = list(llm.stream(messages, lambda: False, tools=ORDER_TOOLS))
    assert [d.name for d in first if isinstance(d, ToolCall)] == ["lookup_order"], first

    fired: list[str] = []
    out = list(guarded_stream(llm, messages, lambda: False, ORDER_TOOLS, on_regenerate=fired.append))
    said = "".join(d for d in out if isinstance(d, str)).strip()
    assert fired == ["invented_number"]
    assert not [d for d in out if isinstance(d, ToolCall)] and said, out
    assert "{" not in said and "```" not in said


def test_a_callers_number_is_looked_up_rather_than_talked_about(llm: LlmEngine) -> None:
    # At the README's order desk (examples/agents/orders.toml) the small model talks about the order ("I
    # don't have any information about the order with number 4712.") instead of looking it up; made to
    # call the lookup, it picks it, held to the tool's schema.
    from parley.agent.agentfile import load_agent_file
    from parley.bench.tools import LOOKUPS
    from parley.bench.tools import TOOLS as ORDER_TOOLS
    from parley.pipeline.reply_guard import guarded_stream

    desk = load_agent_file(Path(__file__).parents[2] / "examples" / "agents" / "orders.toml")
    messages: list[Message] = [
        {"role": "system", "content": desk.system_prompt},
        {"role": "assistant", "content": desk.greeting},
        {"role": "user", "content": "Where is my order? The number is 4712."},
    ]
    fired: list[str] = []
    out = list(
        guarded_stream(llm, messages, lambda: False, ORDER_TOOLS, lookups=LOOKUPS, on_regenerate=fired.append)
    )
    assert fired == ["not_looked_up"], out  # it spoke first, and was stopped at its first word
    calls = [d for d in out if isinstance(d, ToolCall)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup_order", {"number": "4712"})], out
    assert not "".join(d for d in out if isinstance(d, str)).strip()
