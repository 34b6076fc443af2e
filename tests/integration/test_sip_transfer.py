"""The agent transfers a SIP caller, with a real SIP peer on the wire: SIPp 3.6 plays a caller that accepts
the REFER and reports the new call with NOTIFYs (tests/peers/scenarios/refer_transferee.xml), against the
app started in-process with engine doubles; the transfer is asked for through the call's LineControl,
from a worker thread, as the agent's `transfer` tool does.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from parley.app import RUNTIME, create_app
from parley.call import Call
from parley.config import Settings
from tests.doubles import make_engines
from tests.peers import free_port
from tests.peers.sipp import SippResult, run_sipp

SCENARIO = Path(__file__).parents[1] / "peers" / "scenarios" / "refer_transferee.xml"

pytestmark = pytest.mark.skipif(not shutil.which("sipp"), reason="needs sipp (Debian's sip-tester)")


@pytest.fixture
async def app() -> AsyncIterator[tuple[TestClient, int]]:  # type: ignore[type-arg]
    sip_port = free_port()
    settings = Settings(sip=f"127.0.0.1:{sip_port}", greeting="", rtp_timeout_s=0)
    client: TestClient = TestClient(TestServer(create_app(settings, engines=make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    yield client, sip_port
    await client.close()
    assert not client.app[RUNTIME].registry.active()


def sipp_in_background(target: str, directory: Path) -> tuple[threading.Thread, list[SippResult]]:
    """SIPp runs to its end in a thread of its own, which lives as long as the process (the peer
    drivers tie the child's life to the thread that started it)."""
    results: list[SippResult] = []

    def run() -> None:
        results.append(
            run_sipp(str(SCENARIO), target, timeout_s=45, trace_messages=True, directory=directory)
        )

    thread = threading.Thread(target=run, name="sipp", daemon=True)
    thread.start()
    return thread, results


async def the_call(client: TestClient, timeout: float = 15.0) -> Call:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        calls = client.app[RUNTIME].registry.active()
        if calls and calls[0].line is not None:
            return calls[0]
        assert time.monotonic() < deadline, "SIPp's call did not start"
        await asyncio.sleep(0.05)


async def test_a_sipp_caller_accepts_the_agents_refer_and_the_call_ends_transferred(
    app, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    client, sip_port = app
    thread, results = sipp_in_background(f"127.0.0.1:{sip_port}", tmp_path)
    call = await the_call(client)
    assert call.line is not None
    await asyncio.sleep(0.3)  # SIPp's ACK is in: the dialog is confirmed
    began = time.monotonic()
    await asyncio.to_thread(call.line.transfer, "sip:desk@127.0.0.1:5999", 30)
    took = time.monotonic() - began

    await asyncio.to_thread(thread.join, 60)
    assert results, "SIPp did not finish"
    result = results[0]
    assert result.ok and result.successful == 1, result.describe()
    assert took >= 0.5  # it waited for the final NOTIFY, which SIPp sends half a second after the first
    details = await (await client.get(f"/api/calls/{call.call_id}")).json()
    assert details["state"] == "ended" and details["ended_reason"] == "transferred"
