"""A scripted OpenAI-compatible chat endpoint that asks for tools, for the agent tests.

It speaks the real wire protocol (POST /v1/chat/completions, streamed `data:` events with `delta.content`
and `delta.tool_calls` pieces), so parley's endpoint client is exercised for real; what it answers
follows a few rules in place of a model:
- a question about an order, with `lookup_order` offered -> a `lookup_order` call with the digits heard
  (and so whatever was asked, when `tool_choice` names `lookup_order`);
- a tool result as the last message -> a sentence built from it;
- goodbye, with `end_call` offered -> "Goodbye, thank you for calling." and an `end_call` call;
- a request for a person, with `transfer` offered -> a `transfer` call to its first destination;
- a request to tell "everything" -> a long reply (something to cut in on);
- anything else -> a short fixed reply.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORD_DIGITS = {
    "zero": "0",
    "oh": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
}


def digits_in(text: str) -> str:
    words = re.findall(r"[a-z]+|\d", text.lower())
    return "".join(WORD_DIGITS.get(w, w if w.isdigit() else "") for w in words)


def answer(request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The deltas of one streamed reply."""
    messages = request.get("messages") or []
    offered = {t["function"]["name"] for t in request.get("tools") or []}
    last = messages[-1] if messages else {}
    text = str(last.get("content") or "").lower()
    if last.get("role") == "tool":
        result = json.loads(last["content"])
        if "error" in result:
            yield {"content": "Sorry, I could not look that up right now."}
            return
        yield {"content": f"Your order has {result.get('status', 'an unknown status')}"}
        yield {"content": f" and arrives on {result.get('eta', 'a day I do not know')}."}
        return
    # Made to call `lookup_order` (tool_choice, as parley's reply guard asks for a caller's number), it
    # calls it with the digits of the caller's last words, as a model held to that tool would.
    choice = request.get("tool_choice")
    forced = isinstance(choice, dict) and choice.get("function", {}).get("name") == "lookup_order"
    if forced:
        said = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
        text = said[-1].lower() if said else ""
    if ("order" in text or forced) and "lookup_order" in offered:
        number = digits_in(text) or "unknown"
        if not forced:
            yield {"content": "Let me check."}
        arguments = json.dumps({"number": number})
        yield {
            "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup_order"}}
            ]
        }
        for piece in (arguments[:10], arguments[10:]):
            yield {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        return
    if "person" in text and "transfer" in offered:
        destination = next(t for t in request["tools"] if t["function"]["name"] == "transfer")
        to = destination["function"]["parameters"]["properties"]["destination"]["enum"][0]
        yield {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "transfer", "arguments": json.dumps({"destination": to})},
                }
            ]
        }
        return
    if "everything" in text:
        yield {"content": "We deliver every order within three working days, by our own vans. "}
        yield {"content": "A driver calls you an hour before arriving, and you can choose a safe place. "}
        yield {"content": "If you are out, the parcel waits at the depot for a week."}
        return
    if ("bye" in text or "goodbye" in text) and "end_call" in offered:
        yield {"content": "Goodbye, thank you for calling."}
        yield {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "end_call", "arguments": "{}"},
                }
            ]
        }
        return
    yield {"content": "I can help you with your orders."}


class ScriptedModel(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []  # noqa: RUF012

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ScriptedModel.requests.append(body)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for delta in answer(body):
                self._event({"choices": [{"index": 0, "delta": delta}]})
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, data: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


class ScriptedEndpoint:
    """The endpoint on a free loopback port, in a thread; `url` is its /v1 base."""

    def __init__(self) -> None:
        ScriptedModel.requests = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedModel)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    @property
    def requests(self) -> list[dict[str, Any]]:
        return ScriptedModel.requests
