"""The agent's tools, answered by the scenario instead of the team's backend.

`parley test` starts the service with a copy of each agent file whose tools all point at one local
webhook (`ToolMocks`): the service calls it exactly as it would call the backend (the same POST, the
same validation of arguments before it, the same timeout), so what is tested is the real tool path; the
mock answers what the running scenario says (`[tools.<name>]`) and keeps every call it got, with its
arguments, for the expectations.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from parley.scenarios.scenario import ToolMock

# What a tool the scenario did not mock answers: the agent hears the tool failed, as it would if the
# backend were down, and the report shows the call.
UNMOCKED = "this scenario gives no result for this tool"


@dataclass(frozen=True)
class ReceivedCall:
    call_id: str
    name: str
    arguments: dict[str, Any]
    answered: Any  # the result sent back, or {"error": ...}


class ToolMocks:
    """A loopback webhook answering `POST /tools/<name>` from the current scenario's mocks."""

    def __init__(self) -> None:
        self._mocks: dict[str, ToolMock] = {}
        self.calls: list[ReceivedCall] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> ToolMocks:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_post("/tools/{name}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def use(self, mocks: Mapping[str, ToolMock]) -> None:
        """The mocks of the scenario about to run; the calls of the one before are forgotten."""
        self._mocks = dict(mocks)
        self.calls = []

    def calls_of(self, call_id: str) -> list[ReceivedCall]:
        return [c for c in self.calls if c.call_id == call_id]

    async def _answer(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "not JSON"}, status=400)
        arguments = body.get("arguments") if isinstance(body, dict) else None
        call_id = str(body.get("call_id", "")) if isinstance(body, dict) else ""
        mock = self._mocks.get(name)
        if mock is None:
            self.calls.append(ReceivedCall(call_id, name, arguments or {}, {"error": UNMOCKED}))
            return web.json_response({"error": UNMOCKED}, status=501)
        if mock.delay_ms:
            await asyncio.sleep(mock.delay_ms / 1000)
        if mock.error:
            self.calls.append(ReceivedCall(call_id, name, arguments or {}, {"error": mock.error}))
            return web.json_response({"error": mock.error}, status=500)
        self.calls.append(ReceivedCall(call_id, name, arguments or {}, mock.result))
        return web.json_response(mock.result)


def agent_with_mocks(agent_file: Path, mocks_url: str) -> str:
    """The agent file's text with every tool answered by the mocks at `mocks_url` (a webhook in place of
    each `url` or `python`), and its relative paths made absolute so the copy works from anywhere."""
    data = tomllib.loads(agent_file.read_text(encoding="utf-8"))
    for tool in data.get("tools", []):
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            tool.pop("python", None)
            tool["url"] = f"{mocks_url}/tools/{tool['name']}"
    sound = data.get("hold_sound")
    if isinstance(sound, str) and sound and not Path(sound).expanduser().is_absolute():
        data["hold_sound"] = str((agent_file.parent / sound).resolve())
    return toml_text(data)


def toml_text(data: Mapping[str, Any]) -> str:
    """A TOML document of `data` (what tomllib reads back as `data`): one `key = value` per line, tables
    and arrays of tables written inline, which TOML allows anywhere a value goes."""
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in data.items())


def _key(key: str) -> str:
    return json.dumps(key)


def _value(value: Any) -> str:
    # JSON's string escapes are TOML basic strings' escapes; its numbers are TOML's.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
