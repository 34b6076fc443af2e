"""Tool calling: does the model pick the right tool with the right arguments, and none when none is needed?

A fixed set of requests to an order desk agent, asked of the LLM engine as the LLM stage asks it (through
the reply guard, which asks once more for a call with a made-up number; no audio): requests that need a
tool (a lookup, a cancellation, a transfer, a goodbye) and requests that must not call one. Per request:
the tool asked for, its arguments, whether the call is well-formed (an offered tool, its arguments valid
for that tool's schema), any JSON that was left in the spoken text, the time from the request to the
tool call, and whether the guard had the reply written again. Runs the local default model, or an
OpenAI-compatible endpoint with `--llm-url`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import jsonschema

from parley.agent.opening import default_opening
from parley.bench import percentiles, progress
from parley.config import Settings
from parley.engines.llm import Message
from parley.engines.llm_loading import load_llm
from parley.engines.toolcalls import ToolCall
from parley.pipeline.reply_guard import guarded_stream

NAME = "tools"
HELP = "tool calls: right tool and arguments, none when not needed, time to the call"

SYSTEM_PROMPT = (
    "You are the order desk of Acme, talking to a caller on the phone. Use the tools to look up or "
    "cancel orders, to transfer the caller to a person, and to hang up when the caller says goodbye. "
    "Reply in one or two short spoken sentences."
)
NUMBER = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TRANSFER = {
    "type": "object",
    "properties": {"destination": {"type": "string", "enum": ["sip:desk@pbx.example.com"]}},
    "required": ["destination"],
}
TOOLS: list[dict[str, Any]] = [
    _tool("lookup_order", "Look up an order by its number", NUMBER),
    _tool("cancel_order", "Cancel an order by its number", NUMBER),
    _tool("transfer", "Transfer the caller to a person", TRANSFER),
    _tool("end_call", "Hang up after saying goodbye", {"type": "object", "properties": {}}),
]
LOOKUPS = ("lookup_order",)  # the tool without side effects: the reply guard may make a reply call it
CASES: list[tuple[str, str | None, dict[str, str]]] = [
    ("What is the status of order 123456?", "lookup_order", {"number": "123456"}),
    ("Can you check on my order, the number is 778899?", "lookup_order", {"number": "778899"}),
    ("Where is order 552211 right now?", "lookup_order", {"number": "552211"}),
    ("Please cancel my order 445566.", "cancel_order", {"number": "445566"}),
    ("I want to cancel order 909090, I don't need it any more.", "cancel_order", {"number": "909090"}),
    ("Can I talk to a real person please?", "transfer", {"destination": "sip:desk@pbx.example.com"}),
    ("Thanks, that's all I needed. Goodbye!", "end_call", {}),
    ("What are your opening hours?", None, {}),
    ("Hello, how are you today?", None, {}),
    ("Do you sell gift cards?", None, {}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llm-url", default="", help="an OpenAI-compatible endpoint (default: the local model)"
    )
    parser.add_argument("--llm-endpoint-model", default="", help="the model name sent to --llm-url")
    parser.add_argument("--llm-model", default="", help="a local model instead of the default")
    parser.add_argument("--rounds", type=int, default=1, help="times each request is asked (default 1)")


def ask(
    llm: Any, question: str, on_regenerate: Callable[[str], None] | None = None
) -> tuple[ToolCall | None, str, float | None]:
    messages: list[Message] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    started = time.perf_counter()
    text: list[str] = []
    deltas = guarded_stream(llm, messages, lambda: False, TOOLS, lookups=LOOKUPS, on_regenerate=on_regenerate)
    for delta in deltas:
        if isinstance(delta, ToolCall):
            return delta, "".join(text), time.perf_counter() - started
        text.append(delta)
    return None, "".join(text), None


def well_formed(call: ToolCall) -> bool:
    """Whether `call` names an offered tool, with arguments valid for that tool's schema."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    if call.name not in schemas:
        return False
    try:
        jsonschema.validate(json.loads(call.arguments or "{}"), schemas[call.name])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def right_arguments(call: ToolCall, expected: dict[str, str]) -> bool:
    try:
        given = json.loads(call.arguments or "{}")
    except ValueError:
        return False
    return isinstance(given, dict) and all(str(given.get(k, "")).strip() == v for k, v in expected.items())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {"llm_max_tokens": 96}
    if args.llm_url:
        overrides.update(llm_url=args.llm_url, llm_endpoint_model=args.llm_endpoint_model)
    if args.llm_model:
        overrides["llm_model"] = args.llm_model
    settings = Settings(**overrides)
    settings = dataclasses.replace(settings, llm_model=settings.local_llm(tools=True))
    llm = load_llm(settings, opening=default_opening(settings))
    rows: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for question, tool, expected in CASES:
            guarded: list[str] = []
            call, said, seconds = ask(llm, question, guarded.append)
            row = {
                "question": question,
                "expected": tool,
                "called": call.name if call else None,
                "arguments": call.arguments if call else None,
                "right_tool": (call.name if call else None) == tool,
                "right_arguments": bool(
                    call and tool and call.name == tool and right_arguments(call, expected)
                ),
                "well_formed": bool(call and well_formed(call)),
                "json_spoken": "{" in said or "```" in said,
                "to_tool_call_s": None if seconds is None else round(seconds, 3),
                "said": said.strip()[:120],
                "written_again": guarded[0] if guarded else None,
            }
            rows.append(row)
            progress(f"{question!r}: called {row['called']} {row['arguments'] or ''} (expected {tool})")
    close = getattr(llm, "close", None)
    if callable(close):
        close()
    needing = [r for r in rows if r["expected"]]
    not_needing = [r for r in rows if not r["expected"]]
    called = [r for r in rows if r["called"] is not None]
    summary = {
        "model": args.llm_url or args.llm_model or settings.llm_model,
        "right tool (requests needing one)": f"{sum(r['right_tool'] for r in needing)}/{len(needing)}",
        "right arguments": f"{sum(r['right_arguments'] for r in needing)}/{len(needing)}",
        "no call when none is needed": f"{sum(r['called'] is None for r in not_needing)}/{len(not_needing)}",
        "well-formed calls": f"{sum(r['well_formed'] for r in called)}/{len(called)}",
        "replies with JSON in the spoken text": f"{sum(r['json_spoken'] for r in rows)}/{len(rows)}",
        "first replies the guard had written again": (
            f"{sum(bool(r['written_again']) for r in rows)}/{len(rows)}"
        ),
        "request -> tool call (s)": percentiles(
            [r["to_tool_call_s"] for r in needing if r["to_tool_call_s"]]
        ),
    }
    return {"summary": summary, "trials": rows}
