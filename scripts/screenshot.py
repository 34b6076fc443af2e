"""Take the README's screenshot: a real call from headless Chromium with a fake microphone."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from parley.bench.browser import CHROMIUM, chromium_flags
from parley.bench.service import Service
from parley.bench.speech import espeak, join, silence_ms, write_wav


def main(out: str = "docs/page.png") -> None:
    with tempfile.TemporaryDirectory() as tmp, Service() as service, sync_playwright() as p:
        wav = Path(tmp) / "mic.wav"
        write_wav(
            wav, join(silence_ms(2500), espeak("can you recommend a good book to read"), silence_ms(30000))
        )
        browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_flags(wav))
        page = browser.new_page(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
        page.goto(f"{service.base_url}/?raw=1")
        page.click("#call-button")
        page.wait_for_function(
            "window.parley.transcript.some(e => e.role === 'agent' && e.turn_id !== 'greeting')",
            timeout=60_000,
        )
        page.wait_for_timeout(2500)
        page.screenshot(path=out, full_page=True)
        browser.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
