"""SIGTERM during a call: the call is ended, its threads joined, and the process exits 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

from parley.bench.caller import Caller
from parley.bench.service import Service


async def test_sigterm_ends_active_calls_and_exits_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "parley.log"
    service = await asyncio.to_thread(Service(log_path=log).start)
    caller = Caller(service.base_url)
    try:
        await caller.connect()
        await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        code = await asyncio.to_thread(service.stop)
        await caller.wait_for_event("state", timeout=5, state="ended")
    finally:
        await caller.hangup()
        service.stop()
    text = log.read_text()
    assert code == 0, text[-2000:]
    assert f"event=call_ended call_id={caller.call_id} reason=shutdown" in text
    assert "threads_still_running" not in text
