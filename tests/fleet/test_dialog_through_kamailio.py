"""A call's own requests through Kamailio both ways (issue 46, item 1): two parley instances with the real
speech models behind Debian's Kamailio running the deployed config (deploy/kamailio/kamailio.cfg, but
for its addresses). The caller's re-INVITEs (hold, then resume) follow the route set Kamailio recorded
to the instance that holds the call and are answered there, and the call goes on after the resume; the
agent's REFER (its `transfer` built-in) reaches the caller through Kamailio, and the caller's NOTIFY
comes back through it to that instance, which ends the call as transferred.

The agent's model is a scripted OpenAI-compatible endpoint (tests/openai_endpoint.py): asked for a
person, it calls `transfer`, so the transfer does not hang on what a language model makes of the
request; the caller's speech is still heard by the real Whisper and the agent's words spoken by the
real voice. Slow (two services and a proxy): `make test-all`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from parley.bench.listening import SPEECH_DBFS
from parley.bench.service import Service
from parley.bench.sip_caller import SipCaller
from parley.bench.speech import espeak, trim
from parley.engines.stt import SttEngine
from parley.transports.sip.message import SipRequest, SipResponse
from parley.transports.sip.sdp import SessionDescription, offer, parse_sdp
from parley.transports.sip.transactions import Peer
from tests.fleet.conftest import behind_kamailio
from tests.fleet.kamailio import Kamailio
from tests.fleet.test_sip_through_kamailio import ended
from tests.openai_endpoint import ScriptedEndpoint
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

TAGS = ("k1", "k2")
DESK = "sip:desk@127.0.0.1:5999"  # where the agent transfers callers; the caller only reports it answered
AGENT = f"""
system_prompt = "You are the front desk of Acme. Put callers through to a person when they ask for one."
greeting = "Thank you for calling Acme. Our assistant answers every call. How may I help you today?"
sip_users = ["*"]

[builtins]
transfer = ["{DESK}"]
"""


class Transferee(SipCaller):
    """The bench SIP caller, keeping the requests that reached it (and from where) and the answer to its
    NOTIFY: what a test needs to see of the paths the transfer's messages took."""

    def __init__(self, base_url: str, sip_uri: str) -> None:
        super().__init__(base_url, sip_uri)
        self.received: list[tuple[SipRequest, Peer]] = []
        self.notify_answer: SipResponse | None = None

    def _on_message(self, message: SipRequest | SipResponse, peer: Peer) -> None:
        if isinstance(message, SipRequest):
            self.received.append((message, peer))
        super()._on_message(message, peer)

    async def _notify(self, notify: SipRequest, peer: Peer) -> None:
        with contextlib.suppress(TimeoutError):
            self.notify_answer = await self.layer.request(notify, peer)

    def got(self, method: str) -> list[tuple[SipRequest, Peer]]:
        return [(request, peer) for request, peer in self.received if request.method == method]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], Kamailio]]:
    folder = tmp_path_factory.mktemp("dialogs")
    agent = folder / "front-desk.toml"
    agent.write_text(AGENT)
    with ScriptedEndpoint() as model:
        args = [["--instance-tag", tag, "--agent", str(agent), "--llm-url", model.url] for tag in TAGS]
        with behind_kamailio(folder, cluster.new_database(), args) as fleet:
            yield fleet


def instance_of(call_id: str) -> int:
    """The instance that holds a call, as its id names it (c-<tag>-...)."""
    return TAGS.index(call_id.split("-")[1])


async def reinvite(caller: SipCaller, direction: str, version: int) -> SessionDescription:
    """Send a re-INVITE in the call's dialog (along its route set) offering the same stream with
    `direction`, ACK its 200 and return the answer's SDP."""
    assert caller.dialog is not None and caller.rtp is not None
    sdp = offer(
        address="127.0.0.1",
        port=caller.rtp.local_port,
        session_id=1,
        session_version=version,
        codecs=(caller.codec,),
    ).replace("a=sendrecv", f"a={direction}")
    invite = caller.dialog.request("INVITE", body=sdp.encode(), content_type="application/sdp")
    hop = caller.dialog.next_hop()
    answer = await asyncio.wait_for(caller.layer.start_client(invite, hop).final, 10)
    assert answer.status == 200, (answer.status, answer.reason)
    caller.endpoint.send(caller.dialog.ack(invite.cseq[0]), hop)
    return parse_sdp(answer.body.decode())


def speech_heard(caller: SipCaller, start: float, end: float) -> int:
    """Frames of speech-level audio the caller received in [start, end)."""
    heard = caller.heard
    return sum(
        start <= t < end and level > SPEECH_DBFS for t, level in zip(heard.times, heard.levels, strict=False)
    )


async def test_reinvites_through_kamailio_hold_and_resume_the_call_at_its_instance(
    fleet: tuple[list[Service], Kamailio], whisper: SttEngine
) -> None:
    services, proxy = fleet
    caller = SipCaller(services[0].base_url, f"sip:parley@127.0.0.1:{proxy.port}")
    await caller.connect()
    call_id = caller.call_id
    try:
        index = instance_of(call_id)
        assert caller.dialog is not None and caller.rtp is not None and caller.rtp.negotiated is not None
        hop = caller.dialog.next_hop()
        assert (hop.host, hop.port) == ("127.0.0.1", proxy.port), hop  # Kamailio Record-Routed the call
        instance_rtp = caller.rtp.negotiated.remote_port

        await caller.wait_for_audio(after=0.0, timeout=30)  # the greeting has begun
        held = await reinvite(caller, "sendonly", version=2)
        held_at = time.monotonic()
        # Answered by the instance that holds the call (another has no such dialog: 481), for the same
        # stream, which it now only receives.
        audio = held.media[0]
        assert audio.port == instance_rtp and held.direction_for(audio) == "recvonly", held
        # On hold, the greeting goes on at the instance but none of it reaches the caller.
        await asyncio.sleep(2.0)
        assert speech_heard(caller, held_at + 0.2, time.monotonic()) == 0

        resumed = await reinvite(caller, "sendrecv", version=3)
        audio = resumed.media[0]
        assert audio.port == instance_rtp and resumed.direction_for(audio) == "sendrecv", resumed
        # The call goes on: what is left of the greeting, then an answer to a question.
        await caller.wait_for_silence(after=time.monotonic(), hold_s=0.8, timeout=30)
        _, spoken_end = await caller.say(trim(espeak("what time do you open tomorrow")))
        start = await caller.wait_for_audio(after=spoken_end, timeout=30)
        silent = await caller.wait_for_silence(after=start, hold_s=1.0, timeout=30)
        heard = await asyncio.to_thread(whisper.transcribe, caller.audio_between(start - 0.2, silent + 0.2))
        # The scripted model's reply to anything but a request it knows: "I can help you with your orders."
        assert "order" in heard.text.lower(), heard.text
        print(
            f"\nre-INVITE through Kamailio to {TAGS[index]}: hold and resume answered 200 there; "
            f"reply heard {start - spoken_end:.2f} s after the question: {heard.text.strip()!r}"
        )
    finally:
        await caller.hangup()
    record = await asyncio.to_thread(ended, services[index], call_id)
    assert record["state"] == "ended" and record["ended_reason"] == "hangup", record


async def test_the_agents_refer_and_the_callers_notify_go_through_kamailio(
    fleet: tuple[list[Service], Kamailio],
) -> None:
    services, proxy = fleet
    caller = Transferee(services[0].base_url, f"sip:parley@127.0.0.1:{proxy.port}")
    await caller.connect()
    call_id = caller.call_id
    try:
        index = instance_of(call_id)
        greeting = await caller.wait_for_audio(after=0.0, timeout=30)
        await caller.wait_for_silence(after=greeting, hold_s=0.8, timeout=40)
        _, spoken_end = await caller.say(trim(espeak("can i talk to a person please")))
        deadline = time.monotonic() + 40
        while not caller.got("BYE") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        took = time.monotonic() - spoken_end
    finally:
        await caller.hangup()

    refers = caller.got("REFER")
    assert len(refers) == 1, [r.method for r, _ in caller.received]
    refer, source = refers[0]
    # The REFER came from the instance through Kamailio: from Kamailio's address, with its Via on top
    # of the instance's.
    assert (source.host, source.port) == ("127.0.0.1", proxy.port), source
    assert len(refer.headers.get_all("Via")) == 2, refer.headers.get_all("Via")
    assert caller.transferred_to == DESK
    # The caller's NOTIFY went back along the route set, and the instance that holds the call (the other
    # knows no such dialog: 481) took it.
    assert caller.notify_answer is not None and caller.notify_answer.status == 200, caller.notify_answer
    byes = caller.got("BYE")
    assert byes and (byes[0][1].host, byes[0][1].port) == ("127.0.0.1", proxy.port), byes
    record = await asyncio.to_thread(ended, services[index], call_id)
    assert record["state"] == "ended" and record["ended_reason"] == "transferred", record
    print(
        f"\nREFER through Kamailio from {TAGS[index]}: call ended transferred {took:.2f} s after the request"
    )
