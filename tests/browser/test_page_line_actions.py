"""The page when the agent ends the call: headless Chromium calls the app (in-process, engine doubles); the
agent hangs up, or transfers the caller, and the page says so and is ready for the next call."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from parley.app import RUNTIME, create_app
from parley.bench.browser import CHROMIUM, chromium_flags
from parley.bench.speech import silence_ms, write_wav
from parley.call import Call
from parley.config import Settings
from tests.doubles import make_engines

pytestmark = pytest.mark.browser


@pytest.fixture
async def page() -> AsyncIterator[tuple[Any, TestClient]]:  # type: ignore[type-arg]
    playwright_api = pytest.importorskip("playwright.async_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (make install installs it)")
    settings = Settings(sip="off", greeting="", ice_addresses=("127.0.0.1",))
    client: TestClient = TestClient(TestServer(create_app(settings, engines=make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "quiet.wav"
        write_wav(wav, silence_ms(5000))
        async with playwright_api.async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=chromium_flags(wav))
            try:
                tab = await browser.new_page()
                await tab.goto(f"http://127.0.0.1:{client.port}/")
                yield tab, client
            finally:
                await browser.close()
    await client.close()


async def called(tab: Any, client: TestClient) -> Call:  # type: ignore[type-arg]
    await tab.click("#call-button")
    await tab.wait_for_function("window.parley.callId !== null && window.parley.state === 'listening'")
    call = client.app[RUNTIME].registry.get(await tab.evaluate("window.parley.callId"))
    assert call is not None and call.line is not None
    return call


async def test_the_page_says_the_agent_ended_the_call_and_is_ready_again(page) -> None:  # type: ignore[no-untyped-def]
    tab, client = page
    call = await called(tab, client)
    assert call.line is not None
    call.line.hang_up("agent_hangup")
    await tab.wait_for_function("document.body.dataset.state === 'idle'", timeout=10_000)
    assert await tab.inner_text("#error-text") == "The agent ended the call."
    assert await tab.inner_text("#call-button-label") == "Call"


async def test_the_page_says_where_the_caller_was_transferred(page) -> None:  # type: ignore[no-untyped-def]
    tab, client = page
    call = await called(tab, client)
    assert call.line is not None
    began = time.monotonic()
    await asyncio.to_thread(call.line.transfer, "+15551230000", 5)
    await tab.wait_for_function("document.body.dataset.state === 'idle'", timeout=10_000)
    assert time.monotonic() - began < 10
    assert await tab.inner_text("#error-text") == "Transferred to +15551230000."
    events = await tab.evaluate("window.parley.events.map(e => e.type)")
    assert events[-2:] == ["transfer", "hangup"]  # the final state came after the page had hung up
