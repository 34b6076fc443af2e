"""A real browser (headless Chromium, fake microphone fed from a WAV) calls the agent from the page."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.bench.browser import CHROMIUM, chromium_flags
from parley.bench.service import Service
from parley.bench.speech import espeak, join, silence_ms, write_wav

pytestmark = pytest.mark.browser


@pytest.fixture
def microphone_wav() -> Iterator[Path]:
    # The fake microphone loops its file: the question, then a long silence for the agent to answer in.
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "caller.wav"
        write_wav(
            wav, join(silence_ms(3000), espeak("what is the weather like in paris today"), silence_ms(12000))
        )
        yield wav


def test_page_shows_the_conversation_while_reply_audio_arrives(
    service: Service, microphone_wav: Path
) -> None:
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (make install installs it)")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_flags(microphone_wav))
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{service.base_url}/?raw=1")
            page.click("#call-button")
            page.wait_for_function("window.parley.callId !== null", timeout=20_000)
            page.wait_for_function(
                "window.parley.transcript.some(e => e.role === 'user' && /paris/i.test(e.text))",
                timeout=40_000,
            )
            page.wait_for_function(
                "window.parley.transcript.some(e => e.role === 'agent' && e.turn_id !== 'greeting'"
                " && e.text.split(' ').length >= 3)",
                timeout=40_000,
            )
            assert page.evaluate("window.parley.inboundAudioEnergy()") > 0
            assert "Replied in" in page.inner_text("#latency")
            bubbles = page.locator("#transcript .bubble")
            assert bubbles.count() >= 3  # greeting, the question, the reply
            call_id = page.evaluate("window.parley.callId")
            assert service.get_json(f"/api/calls/{call_id}")["transport"] == "webrtc"
            page.click("#call-button")
            page.wait_for_function("document.body.dataset.state === 'ended'", timeout=10_000)
            assert errors == []
        finally:
            browser.close()
