"""SIP through Kamailio (issue 46, item 1): two parley instances with the real models behind Debian's
Kamailio running the deployed config (deploy/kamailio/kamailio.cfg, but for its addresses). Callers
that dial Kamailio are spread over the instances by its dispatcher (round robin), each hears the answer
to its own question, and the requests of a dialog (a BYE, an INFO carrying a key) follow its
Record-Route to the instance that holds the call.
SIPp's calls go through it too. Slow (two services and a proxy): `make test-all`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.bench.common import letters_alike
from parley.bench.service import Service, metric_value
from parley.bench.sip_caller import SipCaller
from parley.bench.speech import espeak, trim
from parley.engines.stt import SttEngine
from tests.fleet.conftest import behind_kamailio
from tests.fleet.kamailio import Kamailio
from tests.peers.sipp import run_sipp
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

THROUGH_PROXY = Path(__file__).parent / "scenarios" / "uac_through_proxy.xml"

QUESTIONS = (  # a different reply for each caller: hearing another caller's would show
    "what is the capital city of japan",
    "how do i make a cup of tea",
    "tell me something interesting about the moon",
    "what should i cook for dinner tonight",
)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], Kamailio]]:
    folder = tmp_path_factory.mktemp("fleet")
    with behind_kamailio(folder, cluster.new_database()) as fleet:
        yield fleet


def holder(services: list[Service], call_id: str) -> int | None:
    """The instance whose live calls include this one. (Any instance answers `/api/calls/<id>` of an
    ended call from the shared records, so only the live list says where a call is.)"""
    for index, service in enumerate(services):
        if any(call["id"] == call_id for call in service.get_json("/api/calls")):
            return index
    return None


def ended(service: Service, call_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        record: dict[str, Any] = service.get_json(f"/api/calls/{call_id}")
        if record.get("state") == "ended" or time.monotonic() > deadline:
            return record
        time.sleep(0.2)


async def test_calls_through_kamailio_are_spread_and_each_caller_hears_its_own_answer(
    fleet: tuple[list[Service], Kamailio], whisper: SttEngine
) -> None:
    services, proxy = fleet

    async def call(question: str) -> tuple[int | None, str, str]:
        caller = SipCaller(services[0].base_url, f"sip:parley@127.0.0.1:{proxy.port}")
        await caller.connect()
        try:
            index = await asyncio.to_thread(holder, services, caller.call_id)
            greeting = await caller.wait_for_audio(after=0.0, timeout=30)
            await caller.wait_for_silence(after=greeting, hold_s=0.8, timeout=30)
            _, spoken_end = await caller.say(trim(espeak(question)))
            start = await caller.wait_for_audio(after=spoken_end, timeout=30)
            # Four calls at once on two cores: a reply asked for again ("Sure, ...") paused 1.5 s after
            # its first word, and the caller took the rest for another turn's.
            silent = await caller.wait_for_silence(after=start, hold_s=3.0, timeout=60)
            audio = caller.audio_between(start - 0.2, silent + 0.2)
            heard = (await asyncio.to_thread(whisper.transcribe, audio)).text.lower()
        finally:
            await caller.hangup()  # its BYE goes to Kamailio, which Record-Routed the dialog
        return index, heard, caller.call_id

    results = await asyncio.gather(*(call(question) for question in QUESTIONS))

    assert sorted(index for index, *_ in results if index is not None) == [0, 0, 1, 1], results
    replies = []
    for index, _, call_id in results:
        assert index is not None
        record = await asyncio.to_thread(ended, services[index], call_id)
        # Ended by the BYE that came through the proxy (a lost BYE would end it by the media timeout,
        # as "rtp_timeout", much later).
        assert record["state"] == "ended" and record["ended_reason"] == "hangup", record
        replies.append(" ".join(t["agent"] for t in record["transcript"] if t["turn_id"] != "greeting"))
    # Each caller heard the reply its own call's agent gave (whatever the model made of the question),
    # and nobody else's.
    for mine, (_, heard, _) in enumerate(results):
        alike = [letters_alike(heard, reply) for reply in replies]
        others = max(a for n, a in enumerate(alike) if n != mine)
        # (What the caller transcribes may be the reply's start alone: four calls at once on two cores
        # can leave a pause inside a reply longer than the silence that ends the recording.)
        assert alike[mine] >= 0.5 and alike[mine] >= others + 0.2, (heard, replies, alike)


async def test_an_info_in_the_dialog_reaches_the_instance_of_the_call(
    fleet: tuple[list[Service], Kamailio],
) -> None:
    # A key pressed as SIP INFO (application/dtmf-relay) goes where the BYE goes: along the route set
    # Kamailio recorded, to the instance that holds the call, and to no other.
    services, proxy = fleet
    caller = SipCaller(services[0].base_url, f"sip:parley@127.0.0.1:{proxy.port}")
    await caller.connect()
    try:
        index = await asyncio.to_thread(holder, services, caller.call_id)
        assert index is not None and caller.dialog is not None
        before = [_digits(s) for s in services]
        info = caller.dialog.request(
            "INFO", body=b"Signal=5\r\nDuration=160\r\n", content_type="application/dtmf-relay"
        )
        answer = await caller.layer.request(info, caller.dialog.next_hop())
        assert answer.status == 200, answer.status
        grown = [_digits(s) - b for s, b in zip(services, before, strict=True)]
        assert grown[index] == 1 and grown[1 - index] == 0, grown
    finally:
        await caller.hangup()


def _digits(service: Service) -> float:
    return metric_value(service.metrics_text(), "parley_dtmf_digits_total", {"transport": "sip"})


def test_sipp_calls_through_kamailio_reach_both_instances(fleet: tuple[list[Service], Kamailio]) -> None:
    services, proxy = fleet
    counted = [_calls_total(s) for s in services]
    result = run_sipp(str(THROUGH_PROXY), f"127.0.0.1:{proxy.port}", calls=6, rate=3, limit=6, timeout_s=60)
    assert result.ok, result.describe()
    deadline = time.monotonic() + 20  # each instance counts a call once it has ended it, after the BYE
    while True:
        grown = [_calls_total(s) - c for s, c in zip(services, counted, strict=True)]
        if sum(grown) >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    lines = [line for s in services for line in s.metrics_text().splitlines() if "calls_total" in line]
    assert grown == [3, 3], (grown, lines)


def _calls_total(service: Service) -> float:
    """The calls the instance has ended over SIP so far (its metrics)."""
    text = service.metrics_text()
    return sum(
        metric_value(text, "parley_calls_total", {"transport": "sip", "outcome": outcome})
        for outcome in ("hangup", "rtp_timeout", "no_ack")
    )
