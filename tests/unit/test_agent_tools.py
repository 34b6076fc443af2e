"""Tools on a team's backend (a real webhook server here) and in Python; events to a real receiver."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from parley.agent.agentfile import ToolSpec
from parley.agent.events import EventOutbox
from parley.agent.signing import HEADER, verify
from parley.agent.tools import ToolRunner
from parley.engines.toolcalls import TaggedToolCalls, ToolCall, ToolCallAccumulator
from tests import agent_tools

SECRET = "s3cret"
NUMBER = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}


class Backend:
    """A team's backend: tool webhooks and an events receiver that check our signatures."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.fail_events = 0
        self.server: TestServer | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/tools/lookup", self.lookup)
        app.router.add_post("/tools/error", self.error)
        app.router.add_post("/tools/slow", self.slow)
        app.router.add_post("/events", self.event)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}"

    async def _checked(self, request: web.Request) -> dict[str, Any]:
        body = await request.read()
        assert verify(request.headers[HEADER], body, SECRET), "bad signature"
        data: dict[str, Any] = json.loads(body)
        return data

    async def lookup(self, request: web.Request) -> web.Response:
        data = await self._checked(request)
        self.requests.append(data)
        return web.json_response({"status": "shipped", "number": data["arguments"]["number"]})

    async def error(self, request: web.Request) -> web.Response:
        await self._checked(request)
        return web.json_response({"error": "nope"}, status=500)

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    async def event(self, request: web.Request) -> web.Response:
        data = await self._checked(request)
        if self.fail_events > 0:
            self.fail_events -= 1
            return web.json_response({}, status=503)
        self.events.append(data)
        return web.json_response({})


@pytest.fixture
async def backend() -> AsyncIterator[tuple[Backend, str]]:
    b = Backend()
    url = await b.start()
    yield b, url
    assert b.server is not None
    await b.server.close()


async def test_a_webhook_tool_gets_a_signed_request_and_its_answer_reaches_the_model(backend) -> None:  # type: ignore[no-untyped-def]
    server, url = backend
    runner = ToolRunner(SECRET)
    spec = ToolSpec("lookup", "Look up", NUMBER, url=f"{url}/tools/lookup", side_effects=False)
    call = ToolCall("call_1", "lookup", '{"number": "123456"}')
    result = await asyncio.to_thread(runner.run, spec, call, call_id="c-1", variables={"caller": "+1555"})
    runner.close()
    assert result.ok and json.loads(result.content) == {"status": "shipped", "number": "123456"}
    sent = server.requests[0]
    assert sent["call_id"] == "c-1" and sent["tool_call_id"] == "call_1" and sent["name"] == "lookup"
    assert sent["arguments"] == {"number": "123456"} and sent["variables"] == {"caller": "+1555"}


async def test_failures_reach_the_model_as_error_results(backend) -> None:  # type: ignore[no-untyped-def]
    _, url = backend
    runner = ToolRunner(SECRET)
    cases = [
        (ToolSpec("e", "d", NUMBER, url=f"{url}/tools/error"), '{"number": "1"}', "HTTP 500"),
        (ToolSpec("s", "d", NUMBER, url=f"{url}/tools/slow", timeout_ms=300), '{"number": "1"}', "300 ms"),
        (ToolSpec("u", "d", NUMBER, url="http://127.0.0.1:9/x"), '{"number": "1"}', "could not be reached"),
        (ToolSpec("v", "d", NUMBER, url=f"{url}/tools/lookup"), '{"number": 5}', "invalid arguments"),
        (ToolSpec("j", "d", NUMBER, url=f"{url}/tools/lookup"), "{oops", "not valid JSON"),
        (ToolSpec("b", "d", function=agent_tools.broken, python="x:y"), "{}", "RuntimeError"),
    ]
    for spec, arguments, words in cases:
        result = await asyncio.to_thread(
            runner.run, spec, ToolCall("c", spec.name, arguments), call_id="c-2", variables={}
        )
        assert not result.ok and words in json.loads(result.content)["error"], (spec.name, result.content)
    runner.close()


def test_a_python_tool_runs_with_its_arguments_and_a_hanging_one_times_out() -> None:
    runner = ToolRunner()
    quick = ToolSpec(
        "lookup_order",
        "d",
        NUMBER,
        python="tests.agent_tools:lookup_order",
        function=agent_tools.lookup_order,
    )
    result = runner.run(quick, ToolCall("c", "lookup_order", '{"number": "42"}'), call_id="c-3", variables={})
    assert result.ok and json.loads(result.content)["status"] == "shipped"
    slow = ToolSpec("slow", "d", NUMBER, python="x:y", function=agent_tools.slow_lookup, timeout_ms=200)
    started = time.monotonic()
    late = runner.run(slow, ToolCall("c", "slow", '{"number": "1"}'), call_id="c-3", variables={})
    assert not late.ok and time.monotonic() - started < 1.0
    runner.close()
    # The timed-out tool still runs to its end (a tool call is never cut off halfway): let it finish
    # here, not during a later test that counts the tool calls it made.
    deadline = time.monotonic() + 5
    while {"tool": "slow_lookup", "number": "1"} not in agent_tools.CALLS and time.monotonic() < deadline:
        time.sleep(0.05)


async def test_events_arrive_signed_in_order_and_survive_a_failing_receiver(backend) -> None:  # type: ignore[no-untyped-def]
    server, url = backend
    server.fail_events = 2  # the first two deliveries fail: retried with the same id
    outbox = EventOutbox(f"{url}/events", SECRET, backoff_s=(0.05, 0.05, 0.05))
    await outbox.start()
    for kind in ("call.started", "tool.called", "call.ended"):
        outbox.publish("c-9", kind, {"n": kind})
    outbox.publish("c-10", "call.started", {})
    deadline = time.monotonic() + 10
    while len(server.events) < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await outbox.close()
    of_c9 = [e["type"] for e in server.events if e["call_id"] == "c-9"]
    assert of_c9 == ["call.started", "tool.called", "call.ended"]
    assert len({e["id"] for e in server.events}) == 4
    assert all({"id", "type", "call_id", "at", "data"} <= set(e) for e in server.events)


def test_streamed_tool_call_pieces_join_into_whole_calls() -> None:
    joined = ToolCallAccumulator()
    joined.push([{"index": 0, "id": "call_a", "function": {"name": "lookup", "arguments": '{"num'}}])
    joined.push([{"index": 0, "function": {"arguments": 'ber": "7"}'}}])
    assert joined.calls() == [ToolCall("call_a", "lookup", '{"number": "7"}')]


def test_tagged_tool_calls_leave_the_spoken_text_and_are_parsed_whole() -> None:
    tags = TaggedToolCalls()
    spoken: list[str] = []
    calls: list[ToolCall] = []
    stream = [
        "Let me check. <tool",
        '_call>\n{"name": "lookup", "argu',
        'ments": {"number": "7"}}\n</tool_',
        "call>Done",
    ]
    for delta in stream:
        text, done = tags.push(delta)
        spoken.append(text)
        calls.extend(done)
    rest, more = tags.flush()
    assert "".join(spoken) + rest == "Let me check. Done" and not more
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup", {"number": "7"})]


def test_a_call_written_without_its_tags_is_still_a_call_and_is_never_spoken() -> None:
    tags = TaggedToolCalls()
    spoken = [tags.push(d)[0] for d in ['{"name": "lookup_order", ', '"arguments": {"number": "12"}}']]
    rest, calls = tags.flush()
    assert "".join(spoken) + rest == "" and [c.name for c in calls] == ["lookup_order"]
    plain = TaggedToolCalls()
    said = plain.push("{curly} is how I write it")[0]
    rest, calls = plain.flush()
    assert said + rest == "{curly} is how I write it" and not calls


def test_an_endpoint_is_offered_the_tools_and_its_streamed_tool_calls_come_back_whole() -> None:
    from parley.engines.endpoint import OpenAiLlm
    from tests.openai_endpoint import ScriptedEndpoint

    tool = ToolSpec("lookup_order", "Look up an order", NUMBER, url="http://x/y").as_openai()
    with ScriptedEndpoint() as endpoint:
        messages = [{"role": "user", "content": "where is order four two"}]
        out = list(OpenAiLlm(endpoint.url).stream(messages, lambda: False, tools=[tool]))
        assert endpoint.requests[0]["tools"] == [tool]
    text = "".join(d for d in out if isinstance(d, str))
    calls = [d for d in out if isinstance(d, ToolCall)]
    assert text == "Let me check." and len(calls) == 1
    assert calls[0].name == "lookup_order" and json.loads(calls[0].arguments) == {"number": "42"}
