"""An OpenAI-compatible /chat/completions endpoint as the LLM (vLLM, llama.cpp's server, Ollama, hosted
APIs): the reply streamed as server-sent events, tools offered as `tools` and asked for as streamed
`tool_calls`. The standard library only: it runs in a stage thread, not on the event loop, and a stop
cuts the socket so that even a stalled server releases the thread at once.

A server parses its model's calls only in the format it expects: llama.cpp's server (with `--jinja`)
looks for the chat template's tags, and Qwen2.5-Coder-0.5B behind it wrote fenced JSON, or the call's
JSON alone, which came back as text to be spoken. When the server returns no `tool_calls`, the calls
the model wrote in its text (`<tool_call>` tags; a fenced block, or a reply that is only JSON, naming an
offered tool) are taken from it (engines/toolcalls.py) and never spoken.

A reply held to a JSON Schema (a post-call analysis: `json_reply`) is asked for with OpenAI's
`response_format` of type `json_schema`, which vLLM, llama.cpp's server and Ollama's OpenAI API honour.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from parley.engines.llm import ENDPOINT_TIMEOUT_S, Calls, LlmError, Message, Tools, allows
from parley.engines.toolcalls import TaggedToolCalls, ToolCall, ToolCallAccumulator

JSON_REPLY_TOKENS = 256  # a JSON reply's tokens at most (a post-call extraction or verdict)


class OpenAiLlm:
    """LlmEngine over an OpenAI-compatible /chat/completions endpoint (vLLM, llama.cpp, Ollama...).

    The standard library only: this runs in a stage thread, not on the event loop.
    """

    # Such servers keep the prompts they computed and reuse a new prompt's known beginning: the history
    # is windowed so that each prompt begins with the previous one.
    reuses_prefixes = True

    def __init__(
        self,
        url: str,
        *,
        model: str = "",
        api_key: str = "",
        max_tokens: int = 80,
        temperature: float = 0.0,
        timeout: float = ENDPOINT_TIMEOUT_S,
    ) -> None:
        parts = urllib.parse.urlsplit(url.rstrip("/") + "/chat/completions")
        # The URL goes into error messages and logs: without the user and password it may carry, which
        # become HTTP Basic credentials (the API key, when set, is the bearer instead).
        netloc = parts.hostname or ""
        netloc = f"[{netloc}]" if ":" in netloc else netloc
        bare = parts._replace(netloc=netloc + (f":{parts.port}" if parts.port else ""))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"llm_url must be an http(s) URL, not {urllib.parse.urlunsplit(bare)!r}")
        self.url = urllib.parse.urlunsplit(bare)
        self._parts = bare
        self._basic = ""
        if parts.username is not None:
            userinfo = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self._basic = base64.b64encode(userinfo.encode()).decode()
        self.model = model
        self._api_key = api_key
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout = timeout

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
        return cls(self._parts.hostname or "", self._parts.port, timeout=self.timeout)

    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: Tools | None = None,
        *,
        calls: Calls = True,
    ) -> Iterator[str | ToolCall]:
        if should_stop():
            return
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if tools:
            request["tools"] = tools
            if calls is False:
                request["tool_choice"] = "none"
            elif calls is not True:
                names = calls or ()
                # One tool is named outright; several: any call is required, and one to a tool not named
                # is dropped from the reply (_post).
                request["tool_choice"] = (
                    {"type": "function", "function": {"name": names[0]}} if len(names) == 1 else "required"
                )
        yield from self._post(request, should_stop, tools, calls)

    def json_reply(
        self,
        messages: list[Message],
        schema: dict[str, Any],
        should_stop: Callable[[], bool],
        *,
        max_tokens: int = JSON_REPLY_TOKENS,
    ) -> str:
        """The reply as JSON of `schema`, asked for as OpenAI's structured output (`response_format`)."""
        if should_stop():
            return ""
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "analysis", "schema": schema},
            },
        }
        return "".join(d for d in self._post(request, should_stop, None, False) if isinstance(d, str))

    def _post(
        self, request: dict[str, Any], should_stop: Callable[[], bool], tools: Tools | None, calls: Calls
    ) -> Iterator[str | ToolCall]:
        body = json.dumps(request).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._basic:
            headers["Authorization"] = f"Basic {self._basic}"
        path = self._parts.path + (f"?{self._parts.query}" if self._parts.query else "")
        conn = self._connect()
        done = threading.Event()
        # A busy or stalled endpoint would keep us blocked in a read; the watcher cuts the socket on a stop.
        watcher = threading.Thread(target=self._watch, args=(conn, done, should_stop), daemon=True)
        watcher.start()
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            if response.status != 200:
                detail = response.read(2000).decode("utf-8", "replace").strip()
                raise LlmError(f"{self.url}: HTTP {response.status} {response.reason}: {detail}")
            for delta in self._events(response, should_stop, tools):
                if not isinstance(delta, ToolCall) or allows(
                    calls, delta
                ):  # a server may not heed tool_choice
                    yield delta
        except (OSError, http.client.HTTPException) as exc:
            if should_stop():
                return
            raise LlmError(f"{self.url}: {exc}") from exc
        finally:
            done.set()
            watcher.join()
            conn.close()

    @staticmethod
    def _watch(
        conn: http.client.HTTPConnection, done: threading.Event, should_stop: Callable[[], bool]
    ) -> None:
        while not done.wait(0.02):
            sock = conn.sock  # None until connected: keep watching
            if sock is not None and should_stop():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                return

    def _events(
        self, response: http.client.HTTPResponse, should_stop: Callable[[], bool], tools: Tools | None
    ) -> Iterator[str | ToolCall]:
        calls = ToolCallAccumulator()
        if not tools:
            yield from self._deltas(response, should_stop, calls)
            if not should_stop():
                yield from calls.calls()
            return
        offered = [str((tool.get("function") or {}).get("name") or "") for tool in tools]
        written = TaggedToolCalls(offered)
        in_text: list[ToolCall] = []
        for delta in self._deltas(response, should_stop, calls):
            text, found = written.push(delta)
            in_text += found
            if text:
                yield text
        text, found = written.flush()
        if text and not should_stop():
            yield text
        if not should_stop():
            yield from calls.calls() or [*in_text, *found]

    def _deltas(
        self, response: http.client.HTTPResponse, should_stop: Callable[[], bool], calls: ToolCallAccumulator
    ) -> Iterator[str]:
        for raw in response:
            if should_stop():
                return
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue  # blank separators, comments (": keep-alive"), event:/id: fields
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise LlmError(f"{self.url}: malformed stream event {data[:200]!r}") from exc
            if not isinstance(chunk, dict):
                raise LlmError(f"{self.url}: unexpected stream event {data[:200]!r}")
            if chunk.get("error"):
                raise LlmError(f"{self.url}: {chunk['error']}")
            choices = chunk.get("choices") or []
            if not choices:
                continue
            delta = choices[0].get("delta") or {}
            if delta.get("tool_calls"):
                calls.push(delta["tool_calls"])
            content = delta.get("content")
            if content:
                yield str(content)
