"""A live service for synchronous tests (hypothesis): the real app, with engine doubles unless given real
ones, serving HTTP, WebSockets and SIP on free loopback ports from a thread with its own event loop; and
a second loop thread for clients (aiortc peers, carrier callers) that the test drives step by step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import http.client
import json
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

from parley.app import RUNTIME, create_app
from parley.bench.service import free_port
from parley.config import Settings
from parley.engines import Engines
from parley.runtime import Runtime
from tests.doubles import make_engines

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread; `run` waits for a coroutine on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclasses.dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class LiveService:
    """`create_app` on 127.0.0.1 (HTTP on `port`, SIP on `sip_port` unless settings say otherwise)."""

    def __init__(self, settings: Settings | None = None, engines: Engines | None = None, **overrides: Any):
        self.port = free_port()
        self.sip_port = free_port()
        base = settings or Settings(greeting="Hello.", ice_addresses=("127.0.0.1",))
        where: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "sip": f"127.0.0.1:{self.sip_port}"}
        self.settings = dataclasses.replace(base, **{**where, **overrides})
        self.engines = engines or make_engines()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = LoopThread("live-service")
        self._runner: web.AppRunner | None = None
        self.app: web.Application | None = None

    def start(self) -> LiveService:
        async def start() -> None:
            self.app = create_app(self.settings, engines=self.engines)
            self._runner = web.AppRunner(self.app, handle_signals=False)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        self.server.run(start())
        return self

    @property
    def runtime(self) -> Runtime:
        assert self.app is not None
        return self.app[RUNTIME]

    def on_loop(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the service's loop (to look at its registry without racing it)."""
        return self.server.run(coro, timeout)

    def active_calls(self) -> list[str]:
        async def ids() -> list[str]:
            return [call.call_id for call in self.runtime.registry.active()]

        return self.on_loop(ids())

    def stop(self) -> None:
        if self._runner is not None:
            self.server.run(self._runner.cleanup(), timeout=60)
        self.server.close()

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        """One HTTP request as written (no client-side checks), on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            if body or method in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            response = conn.getresponse()
            return Reply(response.status, dict(response.getheaders()), response.read())
        finally:
            conn.close()

    def __enter__(self) -> LiveService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
