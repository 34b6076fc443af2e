"""Headless Chromium as a real caller: the flags that make it work on a closed, screenless machine."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def chromium_flags(microphone_wav: Path) -> list[str]:
    """Field notes' flags: no network chatter, a fake microphone looping `microphone_wav`, autoplay on.

    Playwright adds its own fresh profile folder (--user-data-dir).
    """
    return [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone_wav}",
        "--autoplay-policy=no-user-gesture-required",
        "--allow-loopback-in-peer-connection",
    ]
