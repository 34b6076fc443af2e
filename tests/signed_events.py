"""A team's events receiver for the tests (`--events-url`): it takes only events signed with the
secret it is given, keeps them, and counts the ones it refused."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from parley.agent.signing import HEADER, verify


class SignedEvents:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.events: list[dict[str, Any]] = []
        self.unsigned = 0
        self.server: TestServer | None = None

    async def start(self) -> str:
        """Serve on a free loopback port; the URL to give the service."""
        app = web.Application()
        app.router.add_post("/events", self._event)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}/events"

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    def of(self, kind: str, call_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind and e["call_id"] == call_id]

    async def _event(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not verify(request.headers.get(HEADER, ""), body, self.secret):
            self.unsigned += 1
            return web.json_response({"error": "bad signature"}, status=401)
        self.events.append(json.loads(body))
        return web.json_response({})
