"""Bad input, tried systematically: hypothesis throws requests at a live service while a call runs.

Every HTTP route with any method, headers and body; offers whose SDP is a real one mutated line by line,
to `/offer` and `/whip`; messages from the page over the call's data channel; SIP datagrams; messages on
a carrier's media stream. Each gets its clear answer (an HTTP 4xx with a JSON `error`, a SIP 4xx, an
`error` event, or nothing at all for what is not a message), never a 500 and never a crash; and the call
that runs meanwhile keeps hearing the agent and is answered at the end. The service is the real app with
engine doubles (the inputs, not the models, are under test).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.bench.caller import Caller
from parley.bench.carrier import CarrierCaller
from parley.config import Settings
from tests.doubles import ToneTts, loud, make_engines, quiet
from tests.robustness.live import LiveService, LoopThread
from tests.robustness.test_defects import offer_sdp
from tests.sip_wire import SipWire, branch, token

# aiortc draws from `random` on its own timers (RTCP intervals of the call that runs meanwhile), which
# hypothesis takes for a strategy using it; none of these strategies do.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module:hypothesis.errors.HypothesisDeprecationWarning"
)

EXAMPLES = 150
TRIED: Counter[str] = Counter()  # bad inputs tried, by kind (printed at the end)
OUTCOMES: Counter[str] = Counter()  # what they got: the paths they reached
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same inputs on every run: a failure here is a failure on every machine
)


def mostly(valid: str, *others: str) -> st.SearchStrategy[str]:
    """The valid value three times in four, else one of the others: an input then has a defect or two,
    not ten, and reaches the code behind the first check."""
    return st.one_of(st.just(valid), st.just(valid), st.just(valid), st.sampled_from(others))


class Scene:
    """The live service, a client loop, and the call that must not notice any of it."""

    def __init__(self) -> None:
        options = Settings(
            greeting="Hello there.",
            ice_addresses=("127.0.0.1",),
            max_calls=40,
            max_dc_messages_per_s=1000.0,  # the fuzzer sends fast; the flood limit has its own test
            rtp_timeout_s=2.0,
        )
        self.service = LiveService(options, make_engines(tts=ToneTts(0.05))).start()
        self.clients = LoopThread("fuzz-clients")
        self.bystander = Caller(self.service.base_url)
        self.clients.run(self.bystander.connect())
        self.sip = self.clients.run(SipWire.open(self.service.sip_port))
        self.offer = self.clients.run(offer_sdp())

    def close(self) -> None:
        try:
            self.clients.run(self.sip.close())
            self.clients.run(self.bystander.hangup())
        finally:
            self.clients.close()
            self.service.stop()

    def bystander_hears_the_line(self) -> bool:
        """Audio frames (silence included) keep arriving: its media path is alive."""
        times = self.bystander.heard.times
        return bool(times) and time.monotonic() - times[-1] < 1.0


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    scene = Scene()
    yield scene
    print(f"\nbad inputs tried: {dict(TRIED)} ({sum(TRIED.values())} in all); outcomes {dict(OUTCOMES)}")
    scene.close()


# HTTP: every route, any method, headers and body

ROUTES = {  # path: the method it takes
    "/": "GET",
    "/offer": "POST",
    "/whip": "POST",
    "/whip/{id}": "DELETE",
    "/api/calls": "GET",
    "/api/calls/{id}": "GET",
    "/api/calls/{id}/events": "GET",
    "/api/calls/sip": "POST",
    "/api/ice": "GET",
    "/healthz": "GET",
    "/readyz": "GET",
    "/metrics": "GET",
    "/twilio/voice": "POST",
    "/twilio/stream": "GET",
    "/twilio/connect-action": "POST",
    "/telnyx/voice": "POST",
    "/telnyx/stream": "GET",
    "/telnyx/connect-action": "POST",
    "/app.js": "GET",
    "/{id}": "GET",
    "/{id}.js": "GET",
}
# POST /api/drain is left out on purpose: it is the operator's "take no more calls", which it does.
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
CONTENT_TYPES = [
    "application/json",
    "application/sdp",
    "application/x-www-form-urlencoded",
    "text/plain",
    "multipart/form-data; boundary=x",
    "application/json; charset=utf-16",
    "",
]
# Path segments a client can send: printable ASCII, or anything percent-encoded.
segments = st.one_of(
    st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#%"),
        min_size=1,
        max_size=24,
    ),
    st.text(min_size=1, max_size=12).map(lambda text: urllib.parse.quote(text, safe="")),
)
hex_ids = st.text("0123456789abcdef", min_size=8, max_size=16)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
bodies = st.one_of(
    st.binary(max_size=2048),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"sdp": st.text(max_size=200), "type": st.sampled_from(["offer", "answer", 7, None])},
        optional={"agent": json_values, "context": json_values, "to": st.text(max_size=60)},
    ).map(lambda v: json.dumps(v).encode()),
    st.integers(100, 5000).map(lambda depth: b"[" * depth + b"]" * depth),
)


@st.composite
def routes_and_methods(draw: st.DrawFn) -> tuple[str, str]:
    route = draw(st.sampled_from(sorted(ROUTES)))
    return route, draw(mostly(ROUTES[route], *METHODS))


@FUZZ
@given(
    route_and_method=routes_and_methods(),
    ident=segments,
    query=st.one_of(st.just(""), segments.map(lambda q: "?" + q + "=1")),
    content_type=mostly("application/json", *CONTENT_TYPES),
    # What a client can put in a header; bytes an HTTP parser refuses never reach the application.
    authorization=st.one_of(
        st.just(""), st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
    ),
    body=bodies,
)
def test_any_request_to_any_route_gets_a_clear_answer_and_never_a_500(
    scene: Scene,
    route_and_method: tuple[str, str],
    ident: str,
    query: str,
    content_type: str,
    authorization: str,
    body: bytes,
) -> None:
    route, method = route_and_method
    path = route.replace("{id}", ident) + query
    if route == "/api/calls/{id}/events" and method == "GET":
        path = "/api/calls/no-such-call/events"  # a live call's stream never ends: ask for one that is gone
    headers = {"Content-Type": content_type} if content_type else {}
    if authorization.strip():
        headers["Authorization"] = authorization.strip()
    TRIED["http"] += 1
    reply = scene.service.request(method, path, body if method != "GET" else b"", headers)
    OUTCOMES[f"http {reply.status}"] += 1
    assert reply.status < 500, (method, path, reply.status, reply.body[:200])
    if reply.status >= 400 and method != "HEAD":
        assert "error" in reply.json(), (method, path, reply.body[:200])
    if reply.status in (200, 201) and route in ("/offer", "/whip"):
        hang_up(scene, reply)


def hang_up(scene: Scene, reply: Any) -> None:
    """An offer that was good enough to answer: end its call at once (WHIP names it in `Location`)."""
    location = reply.headers.get("Location", "")
    call_id = location.rsplit("/", 1)[-1] if location else reply.json()["call_id"]
    assert scene.service.request("DELETE", f"/api/calls/{call_id}").status == 200


# SDP: a real offer, mutated

TRICKY_LINES = [
    "m=audio 9 UDP/TLS/RTP/SAVPF 0",
    "m=video 9 UDP/TLS/RTP/SAVPF 96",
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
    "a=mid:0",
    "a=mid:",
    "a=rtpmap:0 PCMU/8000",
    "a=rtpmap:111 opus/48000/2/9",
    "a=candidate:x 1 udp 1 127.0.0.1 notaport typ host",
    "a=candidate:1 1 UDP 2130706431 127.0.0.1 9 typ host",
    "a=fingerprint:sha-256 ZZ:ZZ",
    "a=fingerprint:md5 00",
    "a=setup:sideways",
    "a=ice-ufrag:",
    "a=ice-pwd:short",
    "a=group:BUNDLE 0 1 2 3",
    "a=ssrc:notanumber cname:x",
    "a=sendonly",
    "a=inactive",
    "a=extmap:999999 urn:x",
    "c=IN IP6 ::1",
    "c=IN IP4",
    "v=1",
    "o=- 0 0 IN IP4",
    "t=0",
    "=",
    "a=" + "x" * 500,
]


@st.composite
def mutated_offers(draw: st.DrawFn, base: str) -> str:
    lines = base.strip().split("\r\n")
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["drop", "duplicate", "swap", "insert", "garble", "truncate"]))
        at = draw(st.integers(0, len(lines) - 1))
        if kind == "drop" and len(lines) > 1:
            del lines[at]
        elif kind == "duplicate":
            lines.insert(at, lines[at])
        elif kind == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif kind == "insert":
            lines.insert(at, draw(st.sampled_from(TRICKY_LINES) | st.text(max_size=60)))
        elif kind == "garble":
            words = lines[at].split(" ")
            spot = draw(st.integers(0, len(words) - 1))
            words[spot] = draw(st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12))
            lines[at] = " ".join(words)
        else:
            lines = lines[: at + 1]
            lines[-1] = lines[-1][: draw(st.integers(0, len(lines[-1])))]
    newline = draw(st.sampled_from(["\r\n", "\n", "\r\n"]))
    return newline.join(lines) + newline


@FUZZ
@given(data=st.data(), whip=st.booleans())
def test_mutated_offers_are_answered_or_refused_never_a_500(
    scene: Scene, data: st.DataObject, whip: bool
) -> None:
    sdp = data.draw(mutated_offers(scene.offer))
    TRIED["sdp"] += 1
    if whip:
        reply = scene.service.request("POST", "/whip", sdp.encode(), {"Content-Type": "application/sdp"})
    else:
        body = json.dumps({"sdp": sdp, "type": "offer"}).encode()
        reply = scene.service.request("POST", "/offer", body, {"Content-Type": "application/json"})
    OUTCOMES[f"sdp {reply.status}"] += 1
    assert reply.status in (200, 201, 400, 413), (reply.status, reply.body[:300], sdp)
    if reply.status >= 400:
        assert reply.json()["error"]
    else:
        hang_up(scene, reply)


# the page's data channel

messages = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=300),
    json_values.map(json.dumps),
    st.fixed_dictionaries({"type": st.text(max_size=20)}, optional={"id": json_values}).map(json.dumps),
    st.fixed_dictionaries({"type": st.just("ping")}, optional={"id": json_values}).map(json.dumps),
    st.integers(4000, 6000).map(lambda n: "x" * n),  # over --max-dc-message-bytes
)


@FUZZ
@given(message=messages)
def test_every_message_from_the_page_gets_a_pong_or_an_error(scene: Scene, message: str | bytes) -> None:
    caller = scene.bystander
    before = len(answers(caller))
    TRIED["data channel"] += 1

    async def send_and_wait() -> None:
        assert caller.channel is not None and caller.channel.readyState == "open"
        caller.channel.send(message)
        deadline = time.monotonic() + 5
        while len(answers(caller)) == before:
            assert time.monotonic() < deadline, f"no answer to {message!r:.80}"
            await asyncio.sleep(0.005)

    scene.clients.run(send_and_wait())
    answer = answers(caller)[before]
    OUTCOMES[f"data channel {answer['type']}"] += 1
    assert answer["type"] in ("pong", "error")


def answers(caller: Caller) -> list[dict[str, Any]]:
    return [e for _, e in caller.events if e.get("type") in ("pong", "error")]


# SIP datagrams

SIP_METHODS = ["INVITE", "OPTIONS", "BYE", "CANCEL", "ACK", "INFO", "REGISTER", "NOTIFY", "FOO"]
SIP_STATUS = re.compile(rb"^SIP/2\.0 ([0-9]{3}) ")


@st.composite
def sip_datagrams(draw: st.DrawFn, port: int, target: str) -> bytes:
    method = draw(st.sampled_from(SIP_METHODS))
    ids = [draw(hex_ids) for _ in range(3)]
    lines = [
        f"{draw(mostly(method, '', 'IN VITE', method.lower() + '@'))} "
        f"{draw(mostly(target, 'sip:', '<>', 'tel:+1', target + ';x=' + 'y' * 300))} "
        f"{draw(mostly('SIP/2.0', 'SIP/3.0', 'HTTP/1.1', ''))}",
        f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK{ids[0]};rport",
        "Max-Forwards: " + draw(mostly("70", "0", "-1", "x")),
        f"From: <sip:fuzz@127.0.0.1:{port}>;tag={ids[1]}",
        f"To: <{target}>",
        f"Call-ID: {ids[2]}@fuzz",
        "CSeq: " + draw(mostly(f"1 {method}", "x INVITE", "1", "4294967296 OPTIONS", "")),
    ]
    for _ in range(draw(st.integers(0, 2))):
        action = draw(st.sampled_from(["drop", "garble", "add"]))
        at = draw(st.integers(1, len(lines) - 1))
        if action == "drop":
            del lines[at]
        elif action == "garble":
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))] + draw(st.text(max_size=20))
        else:
            lines.insert(
                at, draw(st.sampled_from(["Content-Length: 99999", "Contact: <", "X: " + "y" * 900]))
            )
    body = draw(mostly("", "v=0\r\n", "garbage", "v=0\r\nm=audio 0 RTP/AVP 0\r\n"))
    head = "\r\n".join([*lines, f"Content-Length: {len(body.encode())}"])
    raw = (head + "\r\n\r\n" + body).encode("utf-8", "replace")
    shape = draw(st.sampled_from(["whole", "whole", "whole", "truncated", "bytes"]))
    if shape == "truncated":
        return raw[: draw(st.integers(0, len(raw)))]
    return draw(st.binary(max_size=200)) if shape == "bytes" else raw


@FUZZ
@given(data=st.data())
def test_sip_datagrams_get_a_sip_answer_or_none_and_the_port_keeps_serving(
    scene: Scene, data: st.DataObject
) -> None:
    wire = scene.sip
    target = f"sip:agent@127.0.0.1:{scene.service.sip_port}"
    datagram = data.draw(sip_datagrams(wire.port, target))
    TRIED["sip"] += 1
    seen = len(wire.received), len(wire.unparsed)
    wire.send(datagram)
    time.sleep(0.02)
    # Responses our test parser cannot read (they copy the defect back: a CSeq "x INVITE") count too.
    raw = [item.raw for item in wire.received[seen[0] :]] + wire.unparsed[seen[1] :]
    statuses = [int(m.group(1)) for m in map(SIP_STATUS.match, raw) if m]
    OUTCOMES.update(f"sip {status}" for status in statuses)
    # Any status but a server error: 501 (a method we do not do) and 503 (busy) are answers too.
    assert all(status < 500 or status in (501, 503, 505, 513) for status in statuses), (
        statuses,
        datagram[:200],
    )


def test_after_all_that_the_sip_port_still_answers_options(scene: Scene) -> None:
    wire = scene.sip
    call_id = f"{token()}@fuzz"
    target = f"sip:agent@127.0.0.1:{scene.service.sip_port}"
    wire.send(
        "\r\n".join(
            [
                f"OPTIONS {target} SIP/2.0",
                f"Via: {wire.via(branch())}",
                "Max-Forwards: 70",
                f"From: <sip:fuzz@{wire.here}>;tag={token()}",
                f"To: <{target}>",
                f"Call-ID: {call_id}",
                "CSeq: 1 OPTIONS",
                "Content-Length: 0",
                "",
                "",
            ]
        )
    )
    assert scene.clients.run(wire.final(method="OPTIONS", call_id=call_id)).status == 200


# a carrier's media stream

stream_messages = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.fixed_dictionaries(
        {"event": st.sampled_from(["media", "mark", "dtmf", "connected", "start", "nonsense", 3])},
        optional={
            "media": st.one_of(json_values, st.fixed_dictionaries({"payload": st.text(max_size=400)})),
            "mark": json_values,
            "dtmf": st.one_of(json_values, st.fixed_dictionaries({"digit": st.text(max_size=3)})),
            "streamSid": st.text(max_size=40),
            "sequenceNumber": json_values,
        },
    ).map(json.dumps),
)


@pytest.fixture(scope="module")
def carrier(scene: Scene) -> Iterator[CarrierCaller]:
    caller = CarrierCaller(scene.service.base_url)
    scene.clients.run(caller.connect())
    yield caller
    scene.clients.run(caller.hangup())


@FUZZ
@given(message=stream_messages)
def test_garbage_on_a_carrier_stream_never_ends_its_call(
    scene: Scene, carrier: CarrierCaller, message: str
) -> None:
    TRIED["carrier stream"] += 1
    scene.clients.run(carrier.send_raw(message))
    assert carrier.close_code is None


def test_the_call_that_ran_meanwhile_was_never_disturbed(scene: Scene, carrier: CarrierCaller) -> None:
    """Last: the bystander is still connected, still hears its line, and its question is answered; so is
    the carrier caller's, after all the garbage on its stream."""
    assert scene.bystander_hears_the_line()
    assert scene.bystander.call_id in scene.service.active_calls()
    question = np.concatenate([loud(500), quiet(700)])
    for caller in (scene.bystander, carrier):
        asked, spoken_end = scene.clients.run(caller.say(question))
        scene.clients.run(caller.wait_for_event("agent_done", timeout=15, after=asked))
        heard = scene.clients.run(caller.wait_for_audio(after=spoken_end, timeout=15))
        assert heard > spoken_end
    assert carrier.close_code is None
    assert scene.service.request("GET", "/healthz").status == 200
