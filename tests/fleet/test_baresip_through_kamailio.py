"""A real softphone through Kamailio (issue 46, item 1): two tagged parley instances with the real models
on one throw-away PostgreSQL, behind Debian's Kamailio running the deployed config
(deploy/kamailio/kamailio.cfg, but for its addresses), called by Debian's baresip (tests/peers/baresip.py)
dialling Kamailio's address. The dispatcher spreads the phones' calls over both instances, each phone
hears the greeting and then the answer to its own question, and each phone's ACK and BYE go along the
route set Kamailio recorded (to Kamailio, addressed to the instance that holds the call), which ends the
call there as hung up. Slow (two services, a proxy and four softphones): `make test-all`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from parley.audio import PIPELINE_RATE, resample
from parley.bench.common import letters_alike
from parley.bench.fleet import instance_tag
from parley.bench.service import Service, metric_value
from parley.bench.speech import espeak, trim
from parley.engines.stt import SttEngine
from tests.fleet.conftest import behind_kamailio
from tests.fleet.kamailio import Kamailio
from tests.peers.baresip import CODEC_RATE, Baresip, TracedMessage, silence_wav, write_source_wav
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

TAGS = (instance_tag(0), instance_tag(1))
QUESTIONS = (  # a different reply for each phone: hearing another phone's would show
    "what is the capital city of japan",
    "how do i make a cup of tea",
    "tell me something interesting about the moon",
    "what should i cook for dinner tonight",
)
GREETED = ("parley", "help you")  # words of the default greeting a phone hears first

T = TypeVar("T")


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], Kamailio]]:
    folder = tmp_path_factory.mktemp("baresip-fleet")
    tagged = [["--instance-tag", tag] for tag in TAGS]
    with behind_kamailio(folder, cluster.new_database(), tagged) as fleet:
        yield fleet


@dataclass
class Conversation:
    """One phone's call, as the test saw it: where it went, what the phone heard, when things happened."""

    phone: Baresip
    question: str
    index: int = -1  # the instance that held the call
    call_id: str = ""
    greeting: np.ndarray | None = None  # what the phone heard before it asked (G.711 rate)
    reply: np.ndarray | None = None  # what it heard after it asked
    timings: dict[str, float] | None = None


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s} s")
        time.sleep(every_s)


def live_call(services: list[Service], user: str) -> tuple[int, str] | None:
    """The instance holding the live call whose caller (the SIP From) is the phone `user`, and its id."""
    for index, service in enumerate(services):
        for call in service.get_json("/api/calls"):
            if str(call.get("caller", "")).startswith(f"sip:{user}@"):
                return index, str(call["id"])
    return None


def committed(service: Service, call_id: str, greeting: bool) -> dict[str, Any] | None:
    """The greeting (or else the first reply to the caller) once the phone has been sent all of it."""
    for turn in service.get_json(f"/api/calls/{call_id}")["transcript"]:
        if (turn["turn_id"] == "greeting") == greeting and turn["agent_state"] == "committed":
            return dict(turn)
    return None


def converse(services: list[Service], proxy: Kamailio, talk: Conversation, question_wav: Path) -> None:
    """Dial Kamailio, listen to the greeting, ask the question, listen to the reply, hang up."""
    phone = talk.phone
    started = time.monotonic()
    phone.dial(f"sip:parley@127.0.0.1:{proxy.port}")
    established = phone.wait_for_event("CALL_ESTABLISHED", timeout=30, fail_on=("CALL_CLOSED",)).at
    talk.index, talk.call_id = wait_for("live call", lambda: live_call(services, phone.user), 10)
    service = services[talk.index]
    wait_for("greeting", lambda: committed(service, talk.call_id, greeting=True), 60)
    time.sleep(0.5)  # the greeting's last packets reach the phone's recording
    asked = time.monotonic()
    heard, _ = phone.recorded_received()
    talk.greeting = heard
    phone.set_audio_source(question_wav)  # the phone says the question now, then stays silent
    turn = wait_for("reply", lambda: committed(service, talk.call_id, greeting=False), 120)
    answered = time.monotonic()
    time.sleep(1.0)  # the reply's last packets reach the phone's recording
    heard, rate = phone.recorded_received()
    # The recording holds the frames received since the answer (the instance sends RTP every 20 ms,
    # silence included): its last seconds since the question are the reply, wherever it began.
    talk.reply = heard[-int((time.monotonic() - asked) * rate) :]
    hung_up = time.monotonic()
    phone.hangup()  # its BYE goes to Kamailio, which Record-Routed the dialog
    closed = phone.wait_for_event("CALL_CLOSED", timeout=15).at
    talk.timings = {
        "answered_s": established - started,
        "greeting_done_s": asked - established,
        "reply_done_s": answered - asked,
        "response_s": float(turn.get("response_s") or 0.0),
        "bye_closed_s": closed - hung_up,
    }


def sent(phone: Baresip, method: str) -> TracedMessage:
    """The request `method` the phone sent (its last)."""
    mine = f"127.0.0.1:{phone.sip_port}"
    found = [m for m in phone.sip_messages() if m.status is None and m.method == method and m.source == mine]
    assert found, phone.describe(f"sent no {method}")
    return found[-1]


def received(phone: Baresip, method: str, status: int) -> TracedMessage:
    """The `status` response to the phone's `method` (its last)."""
    mine = f"127.0.0.1:{phone.sip_port}"
    found = [
        m for m in phone.sip_messages() if m.status == status and m.method == method and m.destination == mine
    ]
    assert found, phone.describe(f"received no {status} to its {method}")
    return found[-1]


def hangups(service: Service) -> float:
    """The SIP calls the instance has ended by the caller's BYE so far (its metrics)."""
    return metric_value(
        service.metrics_text(), "parley_calls_total", {"transport": "sip", "outcome": "hangup"}
    )


def ended(service: Service, call_id: str) -> dict[str, Any] | None:
    record: dict[str, Any] = service.get_json(f"/api/calls/{call_id}")
    return record if record.get("state") == "ended" else None


def test_softphones_through_kamailio_are_spread_and_each_hears_its_own_answer(
    fleet: tuple[list[Service], Kamailio], whisper: SttEngine, tmp_path: Path
) -> None:
    services, proxy = fleet
    hung_up = [hangups(s) for s in services]
    talks: list[Conversation] = []
    try:
        for n, question in enumerate(QUESTIONS):
            folder = tmp_path / f"phone{n + 1}"
            phone = Baresip(
                user=f"phone{n + 1}", audio=silence_wav(folder / "quiet.wav", 180), directory=folder
            )
            talks.append(Conversation(phone, question))
            phone.start()
        wavs = [
            write_source_wav(
                tmp_path / f"question{n + 1}.wav",
                trim(espeak(t.question)),
                PIPELINE_RATE,
                lead_silence_s=0.3,
                tail_silence_s=120,
            )
            for n, t in enumerate(talks)
        ]
        # All at once: the dispatcher's round robin sees four INVITEs, whatever their order.
        with ThreadPoolExecutor(len(talks)) as pool:
            for done in [
                pool.submit(converse, services, proxy, t, w) for t, w in zip(talks, wavs, strict=True)
            ]:
                done.result()
    finally:
        for talk in talks:
            talk.phone.close()

    spread = sorted(t.index for t in talks)
    print(f"\nspread over the instances: {spread}")
    assert spread == [0, 0, 1, 1], [(t.phone.user, t.index, t.call_id) for t in talks]

    replies = []
    for talk in talks:
        # The call's id names the instance it was found live on (the instances are tagged).
        assert talk.call_id.startswith(f"c-{TAGS[talk.index]}-"), (talk.index, talk.call_id)
        record = wait_for("ended record", partial(ended, services[talk.index], talk.call_id), 15)
        # Ended by the BYE that came through the proxy (a lost BYE would end it by the media timeout,
        # as "rtp_timeout", much later).
        assert record["ended_reason"] == "hangup", record
        replies.append(" ".join(t["agent"] for t in record["transcript"] if t["turn_id"] != "greeting"))
        check_route(talk, services, proxy)
    # Each instance ended its own two calls, as hung up (it counts a call as it closes it).
    deadline = time.monotonic() + 10
    while (grown := [hangups(s) - b for s, b in zip(services, hung_up, strict=True)]) != [2, 2]:
        assert time.monotonic() < deadline, grown
        time.sleep(0.2)

    for mine, talk in enumerate(talks):
        assert talk.greeting is not None and talk.reply is not None and talk.timings is not None
        # Without the silences around the speech, which Whisper may fill by repeating what it heard.
        greeting = whisper.transcribe(trim(resample(talk.greeting, CODEC_RATE, PIPELINE_RATE))).text.lower()
        heard = whisper.transcribe(trim(resample(talk.reply, CODEC_RATE, PIPELINE_RATE))).text.lower()
        alike = [letters_alike(heard, reply) for reply in replies]
        others = max(a for n, a in enumerate(alike) if n != mine)
        timings = " ".join(f"{k}={v:.2f}" for k, v in talk.timings.items())
        print(
            f"{talk.phone.user} -> instance {talk.index} ({talk.call_id}): asked {talk.question!r}\n"
            f"  heard greeting {greeting!r}\n  heard reply {heard!r}\n  agent said {replies[mine]!r}\n"
            f"  alike own {alike[mine]:.2f}, best other {others:.2f}; {timings}"
        )
        assert any(word in greeting for word in GREETED), greeting
        # Each phone heard the reply its own call's agent gave (whatever the model made of the question),
        # and nobody else's; what it transcribes over 8 kHz may split words, hence letters.
        assert alike[mine] >= 0.5 and alike[mine] >= others + 0.2, (heard, replies, alike)


def check_route(talk: Conversation, services: list[Service], proxy: Kamailio) -> None:
    """The phone's in-dialog requests followed the Record-Route: sent to Kamailio, with a Route naming it,
    addressed (request-URI: the instance's Contact) to the instance that holds the call."""
    phone, kamailio, instance = (
        talk.phone,
        f"127.0.0.1:{proxy.port}",
        f"127.0.0.1:{services[talk.index].sip_port}",
    )
    answer = received(phone, "INVITE", 200)
    assert answer.header("X-Parley-Call-Id") == talk.call_id, answer.lines  # the call the phone got
    assert kamailio in (answer.header("Record-Route") or ""), answer.lines
    for method in ("ACK", "BYE"):
        request = sent(phone, method)
        assert request.destination == kamailio, request.lines
        assert kamailio in (request.header("Route") or ""), request.lines
        assert instance in request.start_line, (instance, request.lines)
        print(f"{phone.user} {request.start_line} -> {request.destination}, Route: {request.header('Route')}")
    received(phone, "BYE", 200)  # and the instance's answer came back the same way
