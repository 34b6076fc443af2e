"""Take the README's screenshot: a real call from headless Chromium with a fake microphone.

The question is spoken in Piper's voice (its noise at 0, so every run asks the same words), to the service
started with the default settings and models.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from parley.bench.browser import CHROMIUM, chromium_flags
from parley.bench.service import Service
from parley.bench.speech import join, piper, silence_ms, trim, write_wav

QUESTION = "Can you recommend a good book to read?"


def main(out: str = "docs/page.png") -> None:
    # A records folder of its own: the page lists recent calls, and only this one should be there. The
    # question comes after the greeting has been heard.
    with (
        tempfile.TemporaryDirectory() as tmp,
        Service([f"--data-dir={tmp}"]) as service,
        sync_playwright() as p,
    ):
        wav = Path(tmp) / "mic.wav"
        write_wav(wav, join(silence_ms(6000), trim(piper(QUESTION, steady=True)), silence_ms(30000)))
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
        for entry in page.evaluate("window.parley.transcript"):  # for the README's caption
            print(f"{entry.get('role')}: {entry.get('text')}")
        browser.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
