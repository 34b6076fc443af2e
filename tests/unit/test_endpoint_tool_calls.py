"""Tool calls a model wrote as text behind an OpenAI-compatible endpoint that did not parse them.

llama.cpp's server (without `--jinja`, or with a template whose format the model does not keep) streams
a call as content: a fenced JSON block, or the chat template's `<tool_call>` tags. The endpoint here
streams what such a server streamed, as it did, over the real wire protocol.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from parley.bench.tools import TOOLS
from parley.engines.endpoint import OpenAiLlm
from parley.engines.llm import Message
from parley.engines.toolcalls import TaggedToolCalls, ToolCall

ASKED: list[Message] = [{"role": "user", "content": "What is the status of order 123456?"}]
FENCED = [
    "Sure.\n",
    "```",
    "json\n",
    '{"name": "lookup_',
    'order", "arguments": ',
    '{"number": "123456"}}',
    "\n``",
    "`",
]


class TextOnlyServer(BaseHTTPRequestHandler):
    """Streams `deltas` as `delta.content` (and `tool_calls` pieces, when given), then [DONE]."""

    deltas: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        self.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for delta in self.deltas:
            self.wfile.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), TextOnlyServer)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def reply(
    url: str, content: list[str], tools: list[dict[str, Any]] | None = TOOLS
) -> tuple[str, list[ToolCall]]:
    TextOnlyServer.deltas = [{"content": piece} for piece in content]
    out = list(OpenAiLlm(url).stream(ASKED, lambda: False, tools=tools))
    return "".join(d for d in out if isinstance(d, str)), [d for d in out if isinstance(d, ToolCall)]


def test_a_call_written_as_fenced_json_is_called_and_never_spoken(server: str) -> None:
    said, calls = reply(server, FENCED)
    assert said.strip() == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup_order", {"number": "123456"})]


def test_a_call_written_in_the_templates_tags_is_called(server: str) -> None:
    said, calls = reply(server, ["<tool_call>\n", '{"name": "end_call", "arguments": {}}', "\n</tool_call>"])
    assert said.strip() == ""
    assert [(c.name, c.arguments) for c in calls] == [("end_call", "{}")]


def test_a_fenced_block_that_calls_no_offered_tool_is_spoken_as_written(server: str) -> None:
    block = ["Try this: ```", 'json\n{"name": "format_disk", "arguments": {}}\n```', " Done."]
    said, calls = reply(server, block)
    assert said == "".join(block) and calls == []


def test_calls_the_server_parsed_are_taken_as_they_came(server: str) -> None:
    TextOnlyServer.deltas = [
        {"content": "Let me check."},
        {"tool_calls": [{"index": 0, "id": "srv_1", "function": {"name": "lookup_order"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"number": "1"}'}}]},
    ]
    out = list(OpenAiLlm(server).stream(ASKED, lambda: False, tools=TOOLS))
    assert out == ["Let me check.", ToolCall("srv_1", "lookup_order", '{"number": "1"}')]


def test_without_tools_offered_the_text_is_left_as_it_came(server: str) -> None:
    said, calls = reply(server, FENCED, tools=None)
    assert said == "".join(FENCED) and calls == []


def test_fenced_text_split_anywhere_gives_the_same_calls_and_words() -> None:
    text = 'Checking. ```json\n[{"name": "lookup_order", "arguments": {"number": "9"}}]\n``` One moment.'
    for size in (1, 2, 3, 7):
        written = TaggedToolCalls(["lookup_order"])
        said: list[str] = []
        calls: list[ToolCall] = []
        for at in range(0, len(text), size):
            words, found = written.push(text[at : at + size])
            said.append(words)
            calls += found
        rest, found = written.flush()
        assert "".join(said) + rest == "Checking.  One moment."
        assert [(c.name, c.arguments) for c in calls + found] == [("lookup_order", '{"number": "9"}')]


def test_a_local_models_fenced_call_is_a_call_and_other_code_is_spoken() -> None:
    written = TaggedToolCalls()  # a local model's text: no names to check against
    said, calls = written.push('```json\n{"name": "end_call", "arguments": {}}\n```')
    assert said == "" and [(c.name, c.arguments) for c in calls] == [("end_call", "{}")]
    code = TaggedToolCalls()
    said, calls = code.push("Use ```print(1)``` there.")
    rest, more = code.flush()
    assert said + rest == "Use ```print(1)``` there." and calls == more == []


def test_a_reply_asked_for_as_words_only_carries_no_call_even_when_the_server_writes_one(
    server: str,
) -> None:
    TextOnlyServer.deltas = [{"content": piece} for piece in FENCED]
    out = list(OpenAiLlm(server).stream(ASKED, lambda: False, tools=TOOLS, calls=False))
    assert TextOnlyServer.requests[-1]["tool_choice"] == "none" and TextOnlyServer.requests[-1]["tools"]
    assert not [d for d in out if isinstance(d, ToolCall)]
    assert "".join(d for d in out if isinstance(d, str)).strip() == "Sure."


def test_a_call_wrapped_in_the_tool_lists_tags_is_a_call_and_never_spoken() -> None:
    # Qwen2.5-Coder-1.5B wrapped its calls in <tools> (the tag its template lists the tools in), and the
    # order desk's caller heard the JSON read aloud (`parley test examples/scenarios/`).
    written = TaggedToolCalls(["lookup_order"])
    text = 'Let me see. <tools>{"name": "lookup_order", "arguments": {"number": "4712"}}</tools>'
    said: list[str] = []
    calls: list[ToolCall] = []
    for piece in (text[:15], text[15:40], text[40:]):
        words, found = written.push(piece)
        said.append(words)
        calls += found
    rest, found = written.flush()
    assert "".join(said) + rest == "Let me see. "
    assert [(c.name, c.arguments) for c in calls + found] == [("lookup_order", '{"number": "4712"}')]


def test_a_reply_that_must_call_a_lookup_asks_the_server_for_that_tool(server: str) -> None:
    # The reply guard's lookup of a caller's number (pipeline/reply_guard.py): the tools stay offered.
    TextOnlyServer.deltas = [{"content": piece} for piece in FENCED]
    out = list(OpenAiLlm(server).stream(ASKED, lambda: False, tools=TOOLS, calls=("lookup_order",)))
    asked = TextOnlyServer.requests[-1]
    assert asked["tool_choice"] == {"type": "function", "function": {"name": "lookup_order"}}
    assert asked["tools"] == TOOLS
    assert [(d.name, d.arguments) for d in out if isinstance(d, ToolCall)] == [
        ("lookup_order", '{"number": "123456"}')
    ]
    # A call to a tool it was not asked for is dropped, as a server may not heed tool_choice.
    TextOnlyServer.deltas = [{"content": piece} for piece in FENCED]
    out = list(OpenAiLlm(server).stream(ASKED, lambda: False, tools=TOOLS, calls=("transfer", "end_call")))
    assert TextOnlyServer.requests[-1]["tool_choice"] == "required"
    assert not [d for d in out if isinstance(d, ToolCall)]
