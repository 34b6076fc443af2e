"""An order desk agent over WebRTC, with the real speech models and a tool-calling model endpoint: the
caller's question leads to exactly one signed webhook call, the reply speaks its result, goodbye makes
the agent hang up, and the team's backend gets the call's signed events in order."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from parley.agent.signing import HEADER, verify
from parley.bench.caller import Caller
from parley.bench.service import Service
from parley.bench.speech import espeak, trim
from parley.engines.stt import SttEngine
from tests.openai_endpoint import ScriptedEndpoint

SECRET = "order-desk-secret"

AGENT = """
system_prompt = "You are the order desk of Acme. The caller is {caller_name}."
caller_variables = ["caller_name"]
greeting = "Acme orders, how can I help, {caller_name}?"
hold_phrase = "One moment please."
hold_after_ms = 1500

[[tools]]
name = "lookup_order"
description = "Look up an order by its number"
url = "{backend}/tools/lookup_order"
side_effects = false
parameters = { type = "object", properties = { number = { type = "string" } }, required = ["number"] }

[builtins]
end_call = true
"""


class Backend:
    """The team's backend: one tool webhook and the events receiver; both check our signature."""

    def __init__(self) -> None:
        self.tool_requests: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.server: TestServer | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/tools/lookup_order", self.lookup)
        app.router.add_post("/events", self.event)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}"

    async def _signed(self, request: web.Request) -> dict[str, Any]:
        body = await request.read()
        assert verify(request.headers.get(HEADER, ""), body, SECRET)
        data: dict[str, Any] = json.loads(body)
        return data

    async def lookup(self, request: web.Request) -> web.Response:
        data = await self._signed(request)
        self.tool_requests.append(data)
        return web.json_response(
            {"number": data["arguments"]["number"], "status": "shipped", "eta": "Thursday"}
        )

    async def event(self, request: web.Request) -> web.Response:
        self.events.append(await self._signed(request))
        return web.json_response({})


@pytest.fixture
async def order_desk(tmp_path: Path) -> AsyncIterator[tuple[Service, Backend, ScriptedEndpoint]]:
    backend = Backend()
    url = await backend.start()
    agent_file = tmp_path / "orders.toml"
    agent_file.write_text(AGENT.replace("{backend}", url))
    with ScriptedEndpoint() as endpoint:
        service = Service(
            ["--agent", str(agent_file), "--llm-url", endpoint.url, "--events-url", f"{url}/events"],
            env={"PARLEY_WEBHOOK_SECRET": SECRET},
            log_path=tmp_path / "parley.log",
        )
        await asyncio.to_thread(service.start)
        try:
            yield service, backend, endpoint
        finally:
            assert await asyncio.to_thread(service.stop) == 0
            assert backend.server is not None
            await backend.server.close()


async def test_the_order_desk_looks_up_an_order_answers_with_it_and_hangs_up_after_goodbye(
    order_desk: tuple[Service, Backend, ScriptedEndpoint], whisper: SttEngine
) -> None:
    service, backend, endpoint = order_desk
    caller = Caller(service.base_url)
    caller_context = {"caller_name": "Dana"}
    await caller.connect(context=caller_context)
    try:
        greeting = await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        assert "Dana" in greeting["text"]
        asked, spoken_end = await caller.say(trim(espeak("what is the status of order one two three four")))
        said = await caller.wait_for_event("user_transcript", timeout=20, after=asked)
        done = await caller.wait_for_event("agent_done", timeout=60, after=asked, turn_id=said["turn_id"])
        assert "Thursday" in done["text"], done
        assert len(backend.tool_requests) == 1
        request = backend.tool_requests[0]
        assert request["name"] == "lookup_order" and request["arguments"]["number"] == "1234"
        assert request["variables"]["caller_name"] == "Dana" and request["call_id"] == caller.call_id
        reply_at = await caller.wait_for_audio(after=spoken_end, timeout=5)
        # The reply's audio all went out before agent_done; a pause between its pieces is no end.
        silent_at = await caller.wait_for_silence(after=time.monotonic(), hold_s=0.8, timeout=30)
        heard = whisper.transcribe(caller.audio_between(reply_at - 0.2, silent_at + 0.2)).text
        assert "thursday" in heard.lower(), heard
        assert any(e["type"] == "tool_result" and e["ok"] for _, e in caller.events)

        bye_at, _ = await caller.say(trim(espeak("thank you, goodbye")))
        hangup = await caller.wait_for_event("hangup", timeout=60, after=bye_at)
        assert hangup["reason"] == "agent_hangup"
        call_id = caller.call_id
    finally:
        await caller.hangup()
    record = await asyncio.to_thread(service.get_json, f"/api/calls/{call_id}")
    assert record["state"] == "ended" and record["ended_reason"] == "agent_hangup"
    deadline = time.monotonic() + 15
    while not any(e["type"] == "call.ended" for e in backend.events) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    kinds = [e["type"] for e in backend.events if e["call_id"] == call_id]
    assert kinds[0] == "call.started" and kinds[-1] == "call.ended" and "tool.called" in kinds
    ended = backend.events[-1]["data"]
    assert ended["outcome"] == "agent_hangup" and [t["name"] for t in ended["tool_calls"]] == [
        "lookup_order",
        "end_call",
    ]
    assert any(t["agent"] and "Thursday" in t["agent"] for t in ended["transcript"])
    offered = [t["function"]["name"] for t in endpoint.requests[-1].get("tools", [])]
    assert offered == ["lookup_order", "end_call"]
