"""The SIP user agent as a peer sees it (RFC 3261, 3264, 4733, 2617): hand-written requests over UDP (and
TCP) on 127.0.0.1 against the app started in-process with engine doubles.

Requests are text written in `tests.sip_wire`, not built by our serialiser; responses are parsed with
`parse_message`. Each test starts its own app and stops it, and checks that nothing of it is left running.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from parley.app import RUNTIME, SIP
from parley.bench.service import free_port
from parley.config import Settings
from parley.runtime import Runtime
from parley.transports.sip.digest import authorization_for
from parley.transports.sip.message import SipResponse
from parley.transports.sip.useragent import SipUserAgent
from tests.sip_app import SipApp, eventually
from tests.sip_wire import LOCAL, Dialogue, RtpPeer, SipWire, branch, offer, text, token

ALLOWED = {"INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "INFO", "NOTIFY"}
PCMA_OFFER: dict[str, Any] = {"formats": "8 101", "rtpmaps": ("8 PCMA/8000", "101 telephone-event/8000")}
H261_OFFER: dict[str, Any] = {"formats": "31", "rtpmaps": ("31 H261/90000",)}


@dataclass
class Agent(SipApp):
    """The app under test, its SIP port, and the raw peers talking to it."""

    async def get(self, path: str) -> Any:
        response = await self.client.get(path)
        assert response.status == 200, path
        return await response.json()

    async def active_ids(self) -> list[str]:
        return [c["id"] for c in await self.get("/api/calls")]

    async def call(self, call_id: str) -> dict[str, Any]:
        details: dict[str, Any] = await self.get(f"/api/calls/{call_id}")
        return details

    async def answered(
        self, wire: SipWire, rtp: RtpPeer | None = None, *, ack: bool = True, cseq: int = 1, **sdp: Any
    ) -> tuple[Dialogue, SipResponse]:
        """An INVITE answered 200 (and ACKed): our dialogue, and the 200."""
        d = self.dialogue(wire, cseq=cseq)
        wire.send(d.invite(offer(rtp.port if rtp else 9, **sdp)))
        ok = await wire.response(200, call_id=d.call_id)
        d.learn(ok)
        if ack:
            wire.send(d.ack())
        return d, ok


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Awaitable[Agent]]]:
    agents: list[Agent] = []

    async def start_agent(**overrides: Any) -> Agent:
        agent = await Agent.start(**overrides)
        agents.append(agent)
        return agent

    yield start_agent
    for agent in agents:
        ua = agent.client.app.get(SIP)
        runtime = agent.client.app[RUNTIME]
        await agent.close()
        if ua is not None:
            assert not ua._tasks
            assert not ua.layer.server and not ua.layer.client
            assert not ua.endpoint._tasks and not ua.endpoint._connections
        for call_id in list(runtime.registry._ended):
            call = runtime.registry.get(call_id)
            assert call is not None and call.threads_alive() == 0


def sdp_port(body: bytes) -> int:
    match = re.search(rb"^m=audio (\d+) RTP/AVP", body, re.MULTILINE)
    assert match, body
    return int(match.group(1))


def rtp_packet(pt: int, seq: int, ts: int, ssrc: int, payload: bytes, marker: bool = False) -> bytes:
    return struct.pack("!BBHII", 0x80, (0x80 if marker else 0) | pt, seq, ts, ssrc) + payload


# 1. OPTIONS


async def test_options_gets_200_with_allow_listing_the_methods_we_take(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d = agent.dialogue(wire)
    wire.send(d.request("OPTIONS", headers=["Accept: application/sdp"]))
    ok = await wire.response(200, method="OPTIONS", call_id=d.call_id)
    assert set(ok.headers.get_all("Allow")) == ALLOWED
    assert ok.to_tag  # 8.2.6.2
    via = ok.headers.get("Via") or ""
    assert via.startswith(f"SIP/2.0/UDP {wire.here};branch=")
    assert f"received={LOCAL}" in via and f"rport={wire.port}" in via  # RFC 3581 4


async def test_options_out_of_a_dialog_gets_503_while_draining_and_200_before(start) -> None:  # type: ignore[no-untyped-def]
    # A proxy's health probe (Kamailio's dispatcher): a draining instance is taken out of its set.
    agent = await start()
    wire = await agent.wire()
    d = agent.dialogue(wire)
    wire.send(d.request("OPTIONS"))
    await wire.response(200, method="OPTIONS", call_id=d.call_id)
    agent.client.app[RUNTIME].drain()
    probe = agent.dialogue(wire)
    wire.send(probe.request("OPTIONS"))
    refused = await wire.response(503, method="OPTIONS", call_id=probe.call_id)
    assert refused.reason == "Draining" and set(refused.headers.get_all("Allow")) == ALLOWED


# 2. a call, from INVITE to BYE


async def test_an_invite_is_answered_100_180_200_with_sdp_and_the_call_runs_until_bye(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire, rtp = await agent.wire(), await agent.rtp()
    d = agent.dialogue(wire)
    invite = d.invite(offer(rtp.port))
    wire.send(invite)
    ok = await wire.response(200, call_id=d.call_id)
    statuses = [r.status for r in wire.responses(method="INVITE", call_id=d.call_id)]
    assert statuses[:3] == [100, 180, 200]
    ringing = wire.responses(180, call_id=d.call_id)[0]
    assert ok.to_tag and ringing.to_tag == ok.to_tag
    assert ok.headers.get("Content-Type") == "application/sdp"
    assert ok.headers.get_all("Contact") and ok.headers.get("Allow")
    call_id = ok.headers.get("X-Parley-Call-Id")
    assert call_id
    answer = ok.body.decode()
    assert re.search(r"^m=audio \d+ RTP/AVP 0 101\r$", answer, re.MULTILINE), answer
    assert "a=rtpmap:0 PCMU/8000" in answer and f"c=IN IP4 {LOCAL}" in answer
    our_rtp = sdp_port(ok.body)
    assert 20000 <= our_rtp <= 29999 and our_rtp % 2 == 0
    d.learn(ok)
    wire.send(d.ack())

    # Symmetric RTP: media comes to the offered port, from the answered one, as PCMU.
    await eventually(lambda: _true(len(rtp.packets) >= 3), what="RTP towards the caller")
    data, source, _ = rtp.packets[0]
    assert source == (LOCAL, our_rtp) and data[1] & 0x7F == 0

    calls = await agent.get("/api/calls")
    assert [(c["id"], c["transport"]) for c in calls] == [(call_id, "sip")]

    # A retransmitted INVITE (same branch) opens no second call and gets the response again.
    await asyncio.sleep(0.1)  # the ACK is in
    copies = len(wire.responses(200, call_id=d.call_id, method="INVITE"))
    wire.send(invite)
    await wire.wait_for(lambda: list(wire.responses(200, method="INVITE", call_id=d.call_id)), 3, copies + 1)
    await asyncio.sleep(1.2)  # without the ACK the 200 would come again at 0.5 s and 1.5 s (13.3.1.4)
    assert len(wire.responses(200, method="INVITE", call_id=d.call_id)) == copies + 1
    assert await agent.active_ids() == [call_id]

    wire.send(d.request("BYE"))
    bye_ok = await wire.response(200, method="BYE", call_id=d.call_id)
    assert bye_ok.to_tag == ok.to_tag and bye_ok.from_tag == d.from_tag

    async def ended() -> bool:
        return (await agent.call(call_id))["state"] == "ended" and not await agent.active_ids()

    await eventually(ended, what="the call ends after BYE")
    assert (await agent.call(call_id))["ended_reason"] == "hangup"


async def _true(value: bool) -> bool:
    return value


# 3. codecs and bodies


async def test_a_pcma_only_offer_is_answered_with_pcma(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire, rtp = await agent.wire(), await agent.rtp()
    _, ok = await agent.answered(wire, rtp, **PCMA_OFFER)
    answer = ok.body.decode()
    assert re.search(r"^m=audio \d+ RTP/AVP 8 101\r$", answer, re.MULTILINE), answer
    assert "a=rtpmap:8 PCMA/8000" in answer and "PCMU" not in answer
    await eventually(lambda: _true(len(rtp.packets) >= 2), what="PCMA RTP")
    assert rtp.packets[0][0][1] & 0x7F == 8


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (offer(4000, **H261_OFFER), "application/sdp", 488),  # no codec we speak (RFC 3264 6)
        ("", "application/sdp", 488),  # no offer: we do not make one in the 2xx
        ("hello", "text/plain", 415),  # 21.4.13, with Accept
    ],
    ids=["no-common-codec", "no-body", "not-sdp"],
)
async def test_an_invite_we_cannot_answer_is_refused(start, body, content_type, status) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d = agent.dialogue(wire)
    wire.send(d.invite(body, content_type=content_type))
    final = await wire.final(method="INVITE", call_id=d.call_id)
    assert final.status == status
    assert final.to_tag  # 8.2.6.2
    if status == 415:
        assert "application/sdp" in (final.headers.get("Accept") or "")
    wire.send(d.ack(branch_id=d.invite_branch, to_tag=final.to_tag))
    assert await agent.active_ids() == []


# 4. CANCEL


async def test_a_cancel_before_the_answer_gets_200_and_the_invite_487(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(sip_ring_ms=3000)
    before = await agent.counter("parley_calls_total", transport="sip", outcome="cancelled")
    wire = await agent.wire()
    d = agent.dialogue(wire)
    wire.send(d.invite(offer(4000)))
    ringing = await wire.response(180, call_id=d.call_id)
    wire.send(d.cancel())
    cancel_ok = await wire.response(200, method="CANCEL", call_id=d.call_id)
    terminated = await wire.response(487, call_id=d.call_id)
    assert terminated.to_tag == ringing.to_tag  # the tag the early responses carried
    assert cancel_ok.to_tag == ringing.to_tag  # 9.2: SHOULD be the same as the INVITE's
    assert not wire.responses(200, method="INVITE", call_id=d.call_id)
    wire.send(d.ack(branch_id=d.invite_branch, to_tag=terminated.to_tag))
    await asyncio.sleep(1.3)  # Timer G would have sent the 487 again at 0.5 s and 1.5 s
    assert len(wire.responses(487, call_id=d.call_id)) == 1
    assert await agent.active_ids() == []

    async def counted() -> bool:
        now = await agent.counter("parley_calls_total", transport="sip", outcome="cancelled")
        return bool(now == before + 1)

    await eventually(counted, what="the cancelled call is counted")


async def test_a_cancel_matching_no_transaction_gets_481(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d = agent.dialogue(wire)
    d.invite_branch = branch()
    wire.send(d.cancel())
    final = await wire.final(method="CANCEL", call_id=d.call_id)
    assert final.status == 481


# 5. no ACK


async def test_a_2xx_never_acknowledged_is_retransmitted_then_the_agent_says_bye(start, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("parley.transports.sip.leg.TIMEOUT", 2.0)
    agent = await start()
    wire = await agent.wire()
    d, ok = await agent.answered(wire, ack=False)
    call_id = ok.headers.get("X-Parley-Call-Id") or ""
    copies = await wire.wait_for(
        lambda: [a.message for a in wire.arrivals(200, method="INVITE", call_id=d.call_id)], 2.5, 3
    )
    assert len(copies) >= 3
    times = [a.at for a in wire.arrivals(200, method="INVITE", call_id=d.call_id)]
    first, second = times[1] - times[0], times[2] - times[1]
    assert 0.3 < first < 1.0 and 0.7 < second < 2.0 and second > 1.4 * first  # T1, then doubled

    bye = await wire.request("BYE", call_id=d.call_id, timeout=6)  # answered 200 by the wire
    assert bye.from_tag == ok.to_tag and bye.to_tag == d.from_tag

    async def ended() -> bool:
        return bool((await agent.call(call_id))["state"] == "ended")

    await eventually(ended, what="the unacknowledged call ends")
    assert (await agent.call(call_id))["ended_reason"] == "no_ack"


# 6. re-INVITE


async def test_a_reinvite_to_hold_stops_our_rtp_and_one_back_to_sendrecv_resumes_it(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire, rtp = await agent.wire(), await agent.rtp()
    d, _ = await agent.answered(wire, rtp)
    await eventually(lambda: _true(len(rtp.packets) >= 5), what="RTP before the hold")

    wire.send(d.invite(offer(rtp.port, direction="sendonly", version=2)))
    held = await wire.final(method="INVITE", call_id=d.call_id, cseq=d.cseq)
    assert held.status == 200 and "a=recvonly" in held.body.decode()
    assert held.to_tag == d.to_tag
    wire.send(d.ack())
    await asyncio.sleep(0.1)
    during = len(rtp.packets)
    await asyncio.sleep(0.6)
    assert len(rtp.packets) == during, "RTP still flows towards a caller that holds the call"

    wire.send(d.invite(offer(rtp.port, direction="sendrecv", version=3)))
    resumed = await wire.final(method="INVITE", call_id=d.call_id, cseq=d.cseq)
    assert resumed.status == 200 and "a=sendrecv" in resumed.body.decode()
    wire.send(d.ack())
    await eventually(lambda: _true(len(rtp.packets) >= during + 5), what="RTP after the resume")


async def test_a_reinvite_while_our_2xx_awaits_its_ack_gets_491(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d, _ = await agent.answered(wire, ack=False)
    first_cseq, first_branch = d.invite_cseq, d.invite_branch
    wire.send(d.invite(offer(4000, version=2)))
    pending = await wire.final(method="INVITE", call_id=d.call_id, cseq=d.cseq)
    assert pending.status == 491 and pending.to_tag == d.to_tag
    wire.send(d.ack(branch_id=d.invite_branch))  # the 491's ACK: the re-INVITE's branch (17.1.1.3)
    wire.send(d.request("ACK", cseq=first_cseq))  # the first 2xx's ACK: a branch of its own
    assert first_branch != d.invite_branch
    await asyncio.sleep(0.1)

    def copies() -> tuple[int, int]:
        return len(wire.responses(491, call_id=d.call_id)), len(wire.responses(200, call_id=d.call_id))

    acked = copies()
    await asyncio.sleep(1.0)  # neither the 2xx nor the 491 comes again once ACKed
    assert copies() == acked


# 7. DTMF


async def test_info_with_dtmf_relay_reaches_the_transcript(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(keypad_timeout_ms=200)
    wire = await agent.wire()
    d, ok = await agent.answered(wire)
    call_id = ok.headers.get("X-Parley-Call-Id") or ""
    wire.send(d.request("INFO", body="Signal=5\r\nDuration=160\r\n", content_type="application/dtmf-relay"))
    assert (await wire.final(method="INFO", call_id=d.call_id)).status == 200
    await eventually(lambda: _said(agent, call_id, "[DTMF 5]"), what="the digit in the transcript")


async def test_info_with_another_type_gets_415_and_outside_a_dialog_481(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d, _ = await agent.answered(wire)
    wire.send(d.request("INFO", body="hello", content_type="text/plain"))
    unsupported = await wire.final(method="INFO", call_id=d.call_id)
    assert unsupported.status == 415
    stranger = agent.dialogue(wire)
    wire.send(stranger.request("INFO", body="Signal=5\r\n", content_type="application/dtmf-relay"))
    assert (await wire.final(method="INFO", call_id=stranger.call_id)).status == 481


async def test_rfc_4733_digits_over_rtp_reach_the_transcript(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(keypad_timeout_ms=200)
    wire, rtp = await agent.wire(), await agent.rtp()
    _, ok = await agent.answered(wire, rtp)
    call_id, our_rtp = ok.headers.get("X-Parley-Call-Id") or "", sdp_port(ok.body)
    assert "a=rtpmap:101 telephone-event/8000" in ok.body.decode()
    ssrc, seq, ts = 0x1234ABCD, 1000, 160_000
    for digit_event in (7, 11):  # "7", then "#" which ends the entry
        for i in range(6):  # a start (marker), updates, then the end three times (RFC 4733 2.5.1)
            end = i >= 3
            duration = 160 * min(i + 1, 4)
            payload = struct.pack("!BBH", digit_event, (0x80 if end else 0) | 10, duration)
            rtp.send(rtp_packet(101, seq, ts, ssrc, payload, marker=i == 0), our_rtp)
            seq += 1
            await asyncio.sleep(0.02)
        ts += 1600
    await eventually(lambda: _said(agent, call_id, "[DTMF 7#]"), what="RFC 4733 digits in the transcript")


async def _said(agent: Agent, call_id: str, words: str) -> bool:
    return any(turn["user"] == words for turn in (await agent.call(call_id))["transcript"])


# 8. the agent hangs up


async def test_a_call_ended_from_our_side_sends_the_peer_a_bye_in_its_dialog(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d, ok = await agent.answered(wire)
    call_id = ok.headers.get("X-Parley-Call-Id") or ""
    await asyncio.sleep(0.1)
    deleted = await agent.client.delete(f"/api/calls/{call_id}")
    assert deleted.status == 200
    bye = await wire.request("BYE", call_id=d.call_id)
    assert bye.uri == f"sip:caller@{wire.here}"  # our Contact: the remote target (12.2.1.1)
    assert bye.from_tag == ok.to_tag and bye.to_tag == d.from_tag
    number, method = bye.cseq
    assert method == "BYE" and 0 < number < 2**31
    assert (bye.branch or "").startswith("z9hG4bK")
    details = await agent.call(call_id)
    assert details["state"] == "ended" and details["ended_reason"] == "hangup"


# 9. methods and malformed input


async def test_a_known_method_we_do_not_take_gets_405_with_allow_and_an_unknown_one_501(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    subscribe, foo = agent.dialogue(wire), agent.dialogue(wire)
    wire.send(subscribe.request("SUBSCRIBE", headers=["Event: presence", "Expires: 60"]))
    wire.send(foo.request("FOO"))
    not_allowed = await wire.final(method="SUBSCRIBE", call_id=subscribe.call_id)
    assert not_allowed.status == 405 and set(not_allowed.headers.get_all("Allow")) == ALLOWED
    assert (await wire.final(method="FOO", call_id=foo.call_id)).status == 501


async def test_every_final_response_outside_a_dialog_carries_a_to_tag(start) -> None:  # type: ignore[no-untyped-def]
    """RFC 3261 8.2.6.2: the UAS MUST add a tag to To in every response but 100 to a request without one."""
    agent = await start()
    wire = await agent.wire()
    sent: list[tuple[str, Dialogue]] = []
    for method, kwargs in (
        ("OPTIONS", {}),
        ("SUBSCRIBE", {"headers": ["Event: presence"]}),
        ("FOO", {}),
        ("INVITE", {"body": "hi", "content_type": "text/plain"}),
        ("INVITE", {}),
        ("INFO", {"body": "Signal=1", "content_type": "application/dtmf-relay"}),
    ):
        d = agent.dialogue(wire)
        wire.send(d.request(method, **kwargs))
        sent.append((method, d))
    for method, d in sent:
        final = await wire.final(method=method, call_id=d.call_id)
        assert final.to_tag, f"{final.status} to {method} has no To-tag"
        if method == "INVITE":
            wire.send(d.ack(branch_id=d.invite_branch, to_tag=final.to_tag))


async def test_a_request_without_cseq_gets_400(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    call_id = f"{token()}@test"
    wire.send(
        text(
            [
                f"OPTIONS sip:agent@{LOCAL}:{agent.sip_port} SIP/2.0",
                f"Via: {wire.via(branch())}",
                "Max-Forwards: 70",
                f"From: <sip:caller@{wire.here}>;tag={token()}",
                f"To: <sip:agent@{LOCAL}:{agent.sip_port}>",
                f"Call-ID: {call_id}",
            ]
        )
    )

    def bad_requests() -> list[Any]:
        # Without a CSeq the 400 cannot carry one, so our own parser would refuse it: read the bytes.
        return [raw for raw in wire.unparsed if raw.startswith(b"SIP/2.0 400 ") and call_id.encode() in raw]

    deadline = time.monotonic() + 5
    while not bad_requests():
        assert time.monotonic() < deadline, "no 400 for a request without CSeq"
        await asyncio.sleep(0.02)


async def test_garbage_and_empty_datagrams_get_no_reply_and_the_ua_keeps_answering(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw.bind((LOCAL, 0))
        raw.setblocking(False)
        for junk in (
            b"",
            b"\x00\xff\xfe garbage \x80",
            b"\r\n\r\n",
            b"INVITE\r\n\r\n",
            b"SIP/2.0 200 OK\r\n\r\n",
        ):
            raw.sendto(junk, (LOCAL, agent.sip_port))
            wire.send(junk)
        await asyncio.sleep(0.5)
        with pytest.raises(BlockingIOError):
            raw.recv(65536)
        assert not wire.received and not wire.unparsed
    finally:
        raw.close()
    d = agent.dialogue(wire)
    wire.send(d.request("OPTIONS"))
    assert (await wire.final(method="OPTIONS", call_id=d.call_id)).status == 200


async def test_a_bye_for_an_unknown_dialog_gets_481(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d = agent.dialogue(wire)
    wire.send(d.request("BYE", to_tag="nosuchtag"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 481


async def test_an_in_dialog_request_with_a_lower_cseq_gets_500(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire()
    d, _ = await agent.answered(wire, cseq=10)
    wire.send(d.request("INFO", cseq=5, body="Signal=1", content_type="application/dtmf-relay"))
    assert (await wire.final(method="INFO", call_id=d.call_id, cseq=5)).status == 500
    wire.send(d.request("BYE", cseq=6))
    assert (await wire.final(method="BYE", call_id=d.call_id, cseq=6)).status == 500
    wire.send(d.request("OPTIONS", cseq=7))
    assert (await wire.final(method="OPTIONS", call_id=d.call_id, cseq=7)).status == 500
    assert len(await agent.active_ids()) == 1
    wire.send(d.request("BYE"))  # CSeq 11
    assert (await wire.final(method="BYE", call_id=d.call_id, cseq=11)).status == 200


# 10. refusals


async def test_at_capacity_an_invite_gets_503_with_retry_after(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(max_calls=1)
    wire = await agent.wire()
    await agent.answered(wire)
    second = agent.dialogue(wire)
    wire.send(second.invite(offer(4000)))
    refused = await wire.final(method="INVITE", call_id=second.call_id)
    assert refused.status == 503 and (refused.headers.get("Retry-After") or "").isdigit()
    assert refused.to_tag
    wire.send(second.ack(branch_id=second.invite_branch, to_tag=refused.to_tag))
    assert len(await agent.active_ids()) == 1


async def test_while_the_models_load_an_invite_gets_503_with_retry_after() -> None:
    port = free_port()
    runtime = Runtime(Settings(sip=f"{LOCAL}:{port}", greeting=""))  # engines None: still loading
    ua = SipUserAgent(runtime)
    await ua.start()
    wire = await SipWire.open(port)
    try:
        d = Dialogue(wire, f"sip:agent@{LOCAL}:{port}")
        wire.send(d.invite(offer(4000)))
        refused = await wire.final(method="INVITE", call_id=d.call_id)
        assert refused.status == 503 and (refused.headers.get("Retry-After") or "").isdigit()
        wire.send(d.ack(branch_id=d.invite_branch, to_tag=refused.to_tag))
    finally:
        await wire.close()
        await ua.close()
        await runtime.close()
    assert not ua._tasks and not ua.layer.server


# 11. digest


async def test_digest_challenge_then_right_credentials_get_200_and_a_wrong_password_401(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(sip_auth_user="trunk", sip_auth_password="pw")
    wire = await agent.wire()

    async def challenged(d: Dialogue) -> str:
        final = await wire.final(method="INVITE", call_id=d.call_id, cseq=d.cseq)
        assert final.status == 401 and final.to_tag
        challenge = final.headers.get("WWW-Authenticate") or ""
        assert challenge.startswith("Digest ") and 'realm="parley"' in challenge and "nonce=" in challenge
        wire.send(d.ack(branch_id=d.invite_branch, to_tag=final.to_tag))
        return challenge

    for password, status in (("pw", 200), ("wrong", 401)):
        d = agent.dialogue(wire)
        wire.send(d.invite(offer(4000)))
        challenge = await challenged(d)
        # 22.2: the same Call-ID and From, the next CSeq, a new branch, no To-tag, credentials.
        credentials = authorization_for(challenge, "INVITE", d.target, "trunk", password)
        wire.send(d.invite(offer(4000), headers=[f"Authorization: {credentials}"]))
        final = await wire.final(method="INVITE", call_id=d.call_id, cseq=d.cseq)
        assert final.status == status
        if status == 200:
            assert final.headers.get("X-Parley-Call-Id")
            d.learn(final)
            wire.send(d.ack())
        else:
            assert (final.headers.get("WWW-Authenticate") or "").startswith("Digest ")
            wire.send(d.ack(branch_id=d.invite_branch, to_tag=final.to_tag))
    assert len(await agent.active_ids()) == 1


# 12. allow-list


async def test_a_source_outside_the_allow_list_gets_403(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(sip_allow=("10.0.0.0/8",))
    wire = await agent.wire()
    d = agent.dialogue(wire)
    wire.send(d.invite(offer(4000)))
    forbidden = await wire.final(method="INVITE", call_id=d.call_id)
    assert forbidden.status == 403 and forbidden.to_tag
    assert await agent.active_ids() == []


# 13. TCP


async def test_options_over_tcp_is_answered_on_the_same_connection(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire("TCP")
    d = agent.dialogue(wire)
    wire.send(d.request("OPTIONS"))
    ok = await wire.final(method="OPTIONS", call_id=d.call_id)
    assert ok.status == 200 and (ok.headers.get("Via") or "").startswith("SIP/2.0/TCP ")


async def test_an_invite_over_tcp_gets_200_with_a_tcp_contact(start, caplog) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    wire = await agent.wire("TCP")
    d, ok = await agent.answered(wire)
    contact = ok.headers.get("Contact") or ""
    assert re.fullmatch(rf"<sip:[^@>]+@{LOCAL}:{agent.sip_port};transport=tcp>", contact), contact
    assert await agent.active_ids() == [ok.headers.get("X-Parley-Call-Id")]
    # The call is ended by the shutdown: its BYE comes over this connection (the wire answers it).
    await agent.client.close()
    assert wire.requests("BYE", call_id=d.call_id)
    assert not [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]  # a clean shutdown


# 14. outbound calls (UAC)


async def _dial(agent: Agent, wire: SipWire) -> str:
    response = await agent.client.post("/api/calls/sip", json={"to": f"sip:bob@{LOCAL}:{wire.port}"})
    assert response.status == 202
    body = await response.json()
    assert response.headers.get("Location") == f"/api/calls/{body['call_id']}"
    return str(body["call_id"])


async def test_an_outbound_call_invites_the_peer_and_is_active_once_answered(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(dial_trunks=(LOCAL,))
    wire, rtp = await agent.wire(), await agent.rtp()
    call_id = await _dial(agent, wire)
    invite = await wire.request("INVITE")
    assert invite.uri == f"sip:bob@{LOCAL}:{wire.port}"
    assert invite.from_tag and invite.to_tag is None and invite.headers.get_all("Contact")
    assert invite.headers.get("Content-Type") == "application/sdp"
    sdp = invite.body.decode()
    assert re.search(r"^m=audio \d+ RTP/AVP 0 8 101\r$", sdp, re.MULTILINE), sdp
    for rtpmap in ("0 PCMU/8000", "8 PCMA/8000", "101 telephone-event/8000"):
        assert f"a=rtpmap:{rtpmap}" in sdp
    their_rtp = sdp_port(invite.body)

    tag = token()
    wire.reply(invite, 180, to_tag=tag)
    wire.reply(
        invite,
        200,
        to_tag=tag,
        headers=[f"Contact: {wire.contact}"],
        body=offer(rtp.port, formats="0 101"),
        content_type="application/sdp",
    )
    ack = await wire.request("ACK", call_id=invite.call_id)
    assert ack.cseq == (invite.cseq[0], "ACK") and ack.to_tag == tag and ack.from_tag == invite.from_tag
    assert ack.uri == f"sip:caller@{wire.here}"  # the Contact of our 200 (13.2.2.4)
    assert ack.branch != invite.branch  # the ACK of a 2xx is a transaction of its own
    wire.reply(  # our 200 again, as if the ACK were lost: every copy is ACKed (13.2.2.4)
        invite,
        200,
        to_tag=tag,
        headers=[f"Contact: {wire.contact}"],
        body=offer(rtp.port, formats="0 101"),
        content_type="application/sdp",
    )
    await wire.wait_for(lambda: list(wire.requests("ACK", call_id=invite.call_id)), 3, 2)

    async def active() -> bool:
        return call_id in await agent.active_ids()

    await eventually(active, what="the outbound call is active")
    await eventually(lambda: _true(len(rtp.packets) >= 3), what="RTP to the answered peer")
    assert rtp.packets[0][1] == (LOCAL, their_rtp) and rtp.packets[0][0][1] & 0x7F == 0


async def test_an_outbound_call_answered_486_ends_busy(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(dial_trunks=(LOCAL,))
    wire = await agent.wire()
    call_id = await _dial(agent, wire)
    invite = await wire.request("INVITE")
    tag = token()
    wire.reply(invite, 180, to_tag=tag)
    wire.reply(invite, 486, to_tag=tag)
    ack = await wire.request("ACK", call_id=invite.call_id)
    # 17.1.1.3: the ACK of a non-2xx is part of the INVITE's transaction: same branch, To with our tag.
    assert ack.branch == invite.branch and ack.to_tag == tag and ack.cseq == (invite.cseq[0], "ACK")

    async def busy() -> bool:
        details = await agent.call(call_id)
        return bool(details["state"] == "ended" and details["ended_reason"] == "busy")

    await eventually(busy, what="the call record says busy")
    assert call_id not in await agent.active_ids()


async def test_dialling_a_bad_destination_is_400_and_with_sip_off_409(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start()
    for body in ({"to": "mailto:bob@example.com"}, {"to": "bob"}, {"to": 5}, {}):
        response = await agent.client.post("/api/calls/sip", json=body)
        assert response.status == 400, body
        assert "error" in await response.json()
    off = await start(sip="off")
    response = await off.client.post("/api/calls/sip", json={"to": f"sip:bob@{LOCAL}:5060"})
    assert response.status == 409


async def test_a_cancel_in_the_same_tcp_segment_as_its_invite_leaves_no_call(start) -> None:  # type: ignore[no-untyped-def]
    agent = await start(sip_ring_ms=500)
    wire = await agent.wire("TCP")
    d = agent.dialogue(wire)
    wire.send(d.invite(offer(4000)) + d.cancel())
    assert (await wire.final(method="CANCEL", call_id=d.call_id)).status == 200
    assert (await wire.final(method="INVITE", call_id=d.call_id)).status == 487
    await asyncio.sleep(1.0)
    assert [r.status for r in wire.responses(method="INVITE", call_id=d.call_id) if r.status >= 200] == [487]
    assert await agent.active_ids() == []


async def test_a_chosen_port_busy_for_tcp_is_passed_over_for_one_free_for_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Port 0 lets the kernel choose the UDP port; the same number may already be a TCP connection's
    # local port (the 100-call churn met it: "address already in use"). The endpoint takes another.
    from parley.transports.sip import endpoint as module

    real_start_server = asyncio.start_server
    refused: list[int] = []

    async def busy_once(handler: Any, host: str, port: int) -> asyncio.Server:
        if not refused:
            refused.append(port)
            raise OSError(98, f"error while attempting to bind on address ({host!r}, {port}): address in use")
        return await real_start_server(handler, host, port)

    monkeypatch.setattr(module.asyncio, "start_server", busy_once)
    sip = module.SipEndpoint(lambda message, peer: None)
    await sip.start(LOCAL, 0)
    try:
        assert refused and sip.port not in refused
        with socket.create_connection((LOCAL, sip.port), timeout=2):
            pass  # TCP listens at the UDP port
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind((LOCAL, refused[0]))  # the first UDP socket was let go
        finally:
            probe.close()
    finally:
        await sip.close()
