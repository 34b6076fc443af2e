"""What the agent does to a SIP call's line, as the phone on the other end sees it: a transfer by REFER
(RFC 3515) whose NOTIFYs (RFC 3420 sipfrag) say how it went, and keypad digits as RFC 4733 events, or as
INFO to a phone that negotiated no telephone-event.

The phone is the raw peer of tests.sip_wire; the agent's actions go through the call's `LineControl`
from a worker thread, as the agent's tools call them.
"""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from parley.app import RUNTIME
from parley.call import Call
from parley.transports.base import LineActionFailed, LineControl
from parley.transports.sip.message import SipResponse
from tests.sip_wire import Dialogue, SipWire
from tests.unit.test_sip_useragent import Agent, eventually, start  # noqa: F401 (the fixture)

SIPFRAG = "message/sipfrag"


def line_of(agent: Agent, ok: SipResponse) -> tuple[Call, LineControl]:
    call = agent.client.app[RUNTIME].registry.get(ok.headers.get("X-Parley-Call-Id") or "")
    assert call is not None and call.line is not None
    return call, call.line


def notify(d: Dialogue, body: str, state: str) -> str:
    headers = ["Event: refer", f"Subscription-State: {state}"]
    return d.request("NOTIFY", body=body, content_type=SIPFRAG if body else None, headers=headers)


async def notified(wire: SipWire, d: Dialogue, body: str, state: str) -> int:
    """Send a NOTIFY in the call's dialog; the status the agent answered it with."""
    wire.send(notify(d, body, state))
    return (await wire.final(method="NOTIFY", call_id=d.call_id, cseq=d.cseq)).status


async def test_a_transfer_refers_the_phone_and_ends_the_call_once_the_notify_says_200(start) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    agent = await start()
    wire = await agent.wire()
    d, ok = await agent.answered(wire)
    call, line = line_of(agent, ok)
    transfer = asyncio.ensure_future(asyncio.to_thread(line.transfer, "sip:desk@pbx.example.com", 20))

    refer = await wire.request("REFER", call_id=d.call_id)
    assert refer.headers.get("Refer-To") == "<sip:desk@pbx.example.com>"
    assert "sip:agent@" in (refer.headers.get("Referred-By") or "")
    assert refer.headers.get_all("Contact") and refer.cseq[1] == "REFER"
    assert refer.from_tag == ok.to_tag and refer.to_tag == d.from_tag  # in the call's dialog
    wire.reply(refer, 202)

    assert await notified(wire, d, "SIP/2.0 100 Trying\r\n", "active;expires=60") == 200
    await asyncio.sleep(0.2)
    assert not transfer.done() and not call.ended  # the new call is still being set up
    assert await notified(wire, d, "SIP/2.0 200 OK\r\n", "terminated;reason=noresource") == 200
    await asyncio.wait_for(transfer, 10)

    bye = await wire.request("BYE", call_id=d.call_id)
    assert bye.from_tag == ok.to_tag
    notify_answered = wire.arrivals(200, method="NOTIFY", call_id=d.call_id)[-1].at
    bye_at = next(r.at for r in wire.received if getattr(r.message, "method", "") == "BYE")
    assert bye_at > notify_answered  # the BYE comes after the final NOTIFY was answered
    await eventually(lambda: _ended(agent, call.call_id), what="the call's record")
    assert (await agent.call(call.call_id))["ended_reason"] == "transferred"


async def _ended(agent: Agent, call_id: str) -> bool:
    return bool((await agent.call(call_id))["state"] == "ended")


async def test_a_refused_refer_or_a_busy_destination_fails_the_transfer_and_the_call_goes_on(start) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    agent = await start()
    wire = await agent.wire()
    d, ok = await agent.answered(wire)
    call, line = line_of(agent, ok)

    async def transfer_answered(*answers: tuple[int, str, str]) -> str:
        """Transfer, answer the REFER 202 unless told otherwise, send the NOTIFYs; what the agent reads."""
        refers = len(wire.requests("REFER", call_id=d.call_id))
        attempt = asyncio.ensure_future(asyncio.to_thread(line.transfer, "+15551230000", 20))
        await wire.wait_for(lambda: list(wire.requests("REFER", call_id=d.call_id)), 5, refers + 1)
        refer = wire.requests("REFER", call_id=d.call_id)[-1]
        for status, body, state in answers:
            if status:
                wire.reply(refer, status)
            else:
                assert await notified(wire, d, body, state) == 200
        with pytest.raises(LineActionFailed) as failed:
            await asyncio.wait_for(attempt, 10)
        return str(failed.value)

    assert "603" in await transfer_answered((603, "", ""))
    refer = wire.requests("REFER", call_id=d.call_id)[-1]
    # A number goes to the phone's own address: it routes it (the dialog's remote target).
    assert refer.headers.get("Refer-To") == f"<sip:+15551230000@{wire.here}>"

    busy = await transfer_answered(
        (202, "", ""),
        (0, "SIP/2.0 100 Trying\r\n", "active"),
        (0, "SIP/2.0 486 Busy Here\r\n", "terminated;reason=noresource"),
    )
    assert busy == "the transfer failed: 486 Busy Here"
    gone = await transfer_answered((202, "", ""), (0, "", "terminated;reason=timeout"))
    assert "without an outcome" in gone

    await asyncio.sleep(0.3)
    assert not call.ended and not wire.requests("BYE", call_id=d.call_id)
    assert call.call_id in await agent.active_ids()


async def test_notify_outside_a_transfer_is_481_and_of_another_event_489(start) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    agent = await start()
    wire = await agent.wire()
    d, _ = await agent.answered(wire)
    stranger = agent.dialogue(wire)
    wire.send(notify(stranger, "SIP/2.0 200 OK\r\n", "terminated"))
    assert (await wire.final(method="NOTIFY", call_id=stranger.call_id)).status == 481
    assert await notified(wire, d, "SIP/2.0 200 OK\r\n", "terminated") == 481  # no REFER of ours
    wire.send(d.request("NOTIFY", headers=["Event: presence", "Subscription-State: active"]))
    assert (await wire.final(method="NOTIFY", call_id=d.call_id, cseq=d.cseq)).status == 489


async def test_the_agents_digits_reach_the_phone_as_rfc_4733_events(start) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    agent = await start()
    wire, rtp = await agent.wire(), await agent.rtp()
    _, ok = await agent.answered(wire, rtp)
    _, line = line_of(agent, ok)
    await eventually(lambda: _true(len(rtp.packets) > 5), what="audio before the digits")
    began = time.monotonic()
    await asyncio.to_thread(line.send_dtmf, "1#", 10)
    took = time.monotonic() - began

    presses: dict[int, list[tuple[int, bool, int, bool]]] = {}  # RTP timestamp -> (event, end, duration, M)
    for data, _, _ in rtp.packets:
        if data[1] & 0x7F != 101:
            continue
        marker, timestamp = bool(data[1] & 0x80), struct.unpack("!I", data[4:8])[0]
        event_code, flags, duration = struct.unpack("!BBH", data[12:16])
        presses.setdefault(timestamp, []).append((event_code, bool(flags & 0x80), duration, marker))
    assert [packets[0][0] for packets in presses.values()] == [1, 11]  # "1", then "#"
    for packets in presses.values():
        assert packets[0][3] and not any(p[3] for p in packets[1:])  # the marker opens the event
        assert [p[1] for p in packets[-3:]] == [True, True, True]  # the end, sent three times
        assert packets[-1][2] == 1280  # 160 ms at 8 kHz
    assert 0.3 < took < 3.0, took  # returned once they had been sent, on the stream's clock


async def _true(value: bool) -> bool:
    return value


async def test_without_telephone_event_the_agents_digits_go_as_info(start) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    agent = await start()
    wire, rtp = await agent.wire(), await agent.rtp()
    wire.auto_answer["INFO"] = 200
    d, ok = await agent.answered(wire, rtp, formats="0", rtpmaps=("0 PCMU/8000",))
    assert "telephone-event" not in ok.body.decode()
    _, line = line_of(agent, ok)
    await asyncio.to_thread(line.send_dtmf, "5*", 10)
    infos = wire.requests("INFO", call_id=d.call_id)
    assert [i.headers.get("Content-Type") for i in infos] == ["application/dtmf-relay"] * 2
    assert [i.body.decode() for i in infos] == [
        "Signal=5\r\nDuration=160\r\n",
        "Signal=*\r\nDuration=160\r\n",
    ]
    assert not any(p[0][1] & 0x7F == 101 for p in rtp.packets)

    wire.auto_answer["INFO"] = 501
    with pytest.raises(LineActionFailed, match="501"):
        await asyncio.to_thread(line.send_dtmf, "7", 10)
    with pytest.raises(LineActionFailed, match="keypad"):
        await asyncio.to_thread(line.send_dtmf, "1x", 10)
