"""Carrier media streams with test engines: webhooks, the stream protocol, marks, clear, DTMF, garbage,
timeouts, tokens, signatures and capacity, over the real app and aiohttp's WebSocket client."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from parley import metrics
from parley.app import RUNTIME, create_app
from parley.audio import alaw_encode, ulaw_decode, ulaw_encode
from parley.call import Call
from parley.config import Settings, SettingsError
from parley.transports import media_stream
from parley.transports.twilio import TOKEN_PARAMETER, twilio_signature
from tests.doubles import loud, make_engines, quiet

PUBLIC = "https://parley.example.com"
FRAME = 160  # 20 ms at 8 kHz
TELNYX_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
TELNYX_PUBLIC = base64.b64encode(
    TELNYX_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()


def settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "sip": "off",
        "greeting": "Hello there.",
        "end_of_turn_ms": 300,
        "reopen_grace_ms": 300,
        "public_url": PUBLIC,
    }
    return Settings(**{**base, **overrides})


async def client_for(s: Settings) -> TestClient:  # type: ignore[type-arg]
    client: TestClient = TestClient(TestServer(create_app(s, engines=make_engines())))  # type: ignore[type-arg]
    await client.start_server()
    return client


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    c = await client_for(settings())
    yield c
    await c.close()


def errors(carrier: str, reason: str) -> float:
    labels = {"transport": carrier, "reason": reason}
    return metrics.REGISTRY.get_sample_value("parley_transport_errors_total", labels) or 0.0


class Carrier:
    """Plays Twilio (or Telnyx) on the far end of a stream: speaks mu-law frames at 20 ms, buffers what it
    is sent, echoes marks when told (or at once after a clear, as the carriers do) and records all."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, kind: str = "twilio") -> None:
        self.ws = ws
        self.kind = kind
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.pending_marks: list[str] = []
        self.echo = False
        self.close_reason = ""
        self.finished = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            msg = await self.ws.receive()
            if msg.type is not aiohttp.WSMsgType.TEXT:
                self.close_reason = msg.extra or "" if msg.type is aiohttp.WSMsgType.CLOSE else ""
                return
            message = json.loads(msg.data)
            self.received.append((time.monotonic(), message))
            if message["event"] == "mark":
                self.pending_marks.append(message["mark"]["name"])
                if self.echo:
                    await self.echo_marks()
            elif message["event"] == "clear":
                await self.echo_marks()  # the carrier's buffer is dropped; its marks come back at once

    async def send(self, event: str, **fields: Any) -> None:
        key = "streamSid" if self.kind == "twilio" else "stream_id"
        await self.ws.send_str(json.dumps({"event": event, key: "MZ1", **fields}))

    async def start(
        self, parameters: dict[str, str] | None = None, call_sid: str = "CA1", **extra: Any
    ) -> None:
        await self.ws.send_str(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        if self.kind == "twilio":
            start = {
                "accountSid": "AC1",
                "callSid": call_sid,
                "streamSid": "MZ1",
                "tracks": ["inbound"],
                "customParameters": parameters or {},
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                **extra,
            }
        else:
            start = {
                "call_control_id": call_sid,
                "from": "+15550001111",
                "to": "+15550002222",
                "custom_parameters": parameters or {},
                "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
                **extra,
            }
        await self.send("start", start=start)

    async def speak(self, pcm: np.ndarray, encode: Callable[[np.ndarray], bytes] = ulaw_encode) -> None:
        for i in range(0, pcm.size - FRAME + 1, FRAME):
            payload = base64.b64encode(encode(pcm[i : i + FRAME])).decode()
            await self.send("media", media={"track": "inbound", "payload": payload})
            await asyncio.sleep(0.02)

    async def echo_marks(self) -> None:
        marks, self.pending_marks = self.pending_marks, []
        for name in marks:
            await self.send("mark", mark={"name": name})

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [m for _, m in self.received if m["event"] == kind]

    async def wait(self, predicate: Callable[[], object], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"received so far: {[m['event'] for _, m in self.received]}"
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        await self.ws.close()
        await self.finished


def only_call(client: TestClient) -> Call:  # type: ignore[type-arg]
    calls = client.server.app[RUNTIME].registry.active()
    assert len(calls) == 1
    return calls[0]


async def wait_for_call(client: TestClient) -> Call:  # type: ignore[type-arg]
    deadline = time.monotonic() + 15
    while not client.server.app[RUNTIME].registry.active():
        assert time.monotonic() < deadline, "no call started"
        await asyncio.sleep(0.01)
    return only_call(client)


async def no_calls(client: TestClient) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + 15
    while client.server.app[RUNTIME].registry.active():
        assert time.monotonic() < deadline, "the call did not end"
        await asyncio.sleep(0.01)


async def streaming(client: TestClient, kind: str = "twilio", **start: Any) -> Carrier:  # type: ignore[type-arg]
    carrier = Carrier(await client.ws_connect(f"/{kind}/stream"), kind)
    await carrier.start(**start)
    return carrier


def parameters_of(twiml: str) -> dict[str, str]:
    stream = ElementTree.fromstring(twiml).find("./Connect/Stream")
    assert stream is not None
    return {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}


# the voice webhooks


async def test_twilio_is_told_to_connect_the_call_to_our_stream_with_its_parameters(client) -> None:  # type: ignore[no-untyped-def]
    form = {"CallSid": "CA1", "From": "+15550001111", "To": "+15550002222"}
    response = await client.post("/twilio/voice?team=sales", data=form)
    assert response.status == 200 and response.content_type == "text/xml"
    twiml = await response.text()
    stream = ElementTree.fromstring(twiml).find("./Connect/Stream")
    assert stream is not None and stream.attrib["url"] == "wss://parley.example.com/twilio/stream"
    assert parameters_of(twiml) == {"team": "sales", "caller": "+15550001111", "called": "+15550002222"}


async def test_telnyx_is_told_to_stream_both_ways_in_pcmu(client) -> None:  # type: ignore[no-untyped-def]
    response = await client.post("/telnyx/voice", data={"CallSid": "v3:abc", "From": "+1", "To": "+2"})
    stream = ElementTree.fromstring(await response.text()).find("./Connect/Stream")
    assert stream is not None and stream.attrib["url"] == "wss://parley.example.com/telnyx/stream"
    assert stream.attrib["bidirectionalMode"] == "rtp" and stream.attrib["bidirectionalCodec"] == "PCMU"


async def test_a_webhook_without_a_call_id_is_a_400(client) -> None:  # type: ignore[no-untyped-def]
    response = await client.post("/twilio/voice", data={"From": "+1"})
    assert response.status == 400 and "CallSid" in (await response.json())["error"]


def test_twilio_signatures_match_twilios_published_example() -> None:
    params = [
        ("CallSid", "CA1234567890ABCDE"),
        ("Caller", "+12349013030"),
        ("Digits", "1234"),
        ("From", "+12349013030"),
        ("To", "+18005551212"),
    ]
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    assert twilio_signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    assert twilio_signature("12345", url, list(reversed(params))) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


async def test_a_forged_twilio_webhook_is_refused_and_a_signed_one_answered() -> None:
    c = await client_for(settings(twilio_auth_token="12345"))
    try:
        form = {"CallSid": "CA1", "From": "+15550001111", "To": "+15550002222"}
        url = f"{PUBLIC}/twilio/voice?team=sales"
        good = twilio_signature("12345", url, list(form.items()))
        forged = await c.post("/twilio/voice?team=sales", data=form, headers={"X-Twilio-Signature": "AAAA"})
        assert forged.status == 403 and "signature" in (await forged.json())["error"]
        unsigned = await c.post("/twilio/voice?team=sales", data=form)
        assert unsigned.status == 403
        odd = await c.post("/twilio/voice?team=sales", data=form, headers={"X-Twilio-Signature": "caf\u00e9"})
        assert odd.status == 403
        tampered = await c.post(
            "/twilio/voice?team=sales", data={**form, "From": "+1999"}, headers={"X-Twilio-Signature": good}
        )
        assert tampered.status == 403
        signed = await c.post("/twilio/voice?team=sales", data=form, headers={"X-Twilio-Signature": good})
        assert signed.status == 200
        # A credential is set, so the webhook mints a stream token even without --stream-secret.
        assert TOKEN_PARAMETER in parameters_of(await signed.text())
    finally:
        await c.close()


def telnyx_headers(body: bytes, at: float | None = None) -> dict[str, str]:
    stamp = str(int(time.time() if at is None else at))
    signature = base64.b64encode(TELNYX_KEY.sign(stamp.encode() + b"|" + body)).decode()
    return {
        "telnyx-timestamp": stamp,
        "telnyx-signature-ed25519": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


async def test_a_forged_telnyx_webhook_is_refused_and_a_signed_one_answered() -> None:
    c = await client_for(settings(telnyx_public_key=TELNYX_PUBLIC))
    try:
        body = b"CallSid=v3%3Aabc&From=%2B15550001111&To=%2B15550002222"
        signed = await c.post("/telnyx/voice", data=body, headers=telnyx_headers(body))
        assert signed.status == 200
        assert parameters_of(await signed.text())["caller"] == "+15550001111"
        for headers in (
            telnyx_headers(b"CallSid=v3%3Aother"),  # signed for another body
            telnyx_headers(body, at=time.time() - 3600),  # a replay
            {"Content-Type": "application/x-www-form-urlencoded"},
        ):
            forged = await c.post("/telnyx/voice", data=body, headers=headers)
            assert forged.status == 403 and "error" in await forged.json()
    finally:
        await c.close()


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"telnyx_public_key": "not a key"}, "telnyx_public_key"),
        ({"public_url": "parley.example.com"}, "public_url"),
        ({"stream_start_timeout_s": 0}, "stream_start_timeout_s"),
    ],
)
def test_bad_carrier_settings_fail_at_start(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        create_app(settings(**overrides), engines=make_engines())


# the stream


async def test_the_caller_hears_the_greeting_as_media_each_chunk_followed_by_a_mark(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client, parameters={"caller": "+15550001111", "called": "+1555", "team": "x"})
    try:
        call = await wait_for_call(client)
        assert (
            call.transport == "twilio"
            and call.origin.caller == "+15550001111"
            and call.origin.called == "+1555"
        )
        assert call.origin.values == {}  # the default agent declares no caller_variables: none is set

        def sent() -> bytes:
            return b"".join(base64.b64decode(m["media"]["payload"]) for m in carrier.events("media"))

        # "Hello there.": 2 words of tone, and a mark after the last of its frames.
        await carrier.wait(lambda: len(sent()) >= 0.4 * 8000 and carrier.received[-1][1]["event"] == "mark")
        media = carrier.events("media")
        assert media and all(m["streamSid"] == "MZ1" for m in media)
        audio = ulaw_decode(sent())
        assert audio.size == 0.4 * 8000 and np.abs(audio).max() > 4000
        assert {len(base64.b64decode(m["media"]["payload"])) for m in media} == {FRAME}
        order = [m["event"] for _, m in carrier.received]
        assert order[0] == "media" and order[-1] == "mark"  # each chunk's frames, then its mark
    finally:
        await carrier.close()
    await no_calls(client)


async def test_a_reply_counts_as_heard_only_when_the_carrier_echoes_its_mark(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client)
    try:
        call = await wait_for_call(client)
        await carrier.wait(lambda: carrier.events("mark"))
        await asyncio.sleep(0.3)
        assert call.details()["transcript"] == []  # sent, not yet played: nothing committed
        await carrier.echo_marks()
        await carrier.wait(lambda: call.details()["transcript"])
        greeting = call.details()["transcript"][0]
        assert greeting["agent"] == "Hello there." and greeting["agent_state"] == "committed"
    finally:
        await carrier.close()


async def test_speaking_over_the_agent_clears_the_carriers_buffer_at_once() -> None:
    words = " ".join(f"w{n}" for n in range(1, 31))  # 30 words of tone: 6 s
    c = await client_for(settings(greeting=words + "."))
    carrier = await streaming(c)
    try:
        call = await wait_for_call(c)
        await carrier.wait(lambda: carrier.events("media"))
        await carrier.speak(np.concatenate([loud(600, rate=8000), quiet(400, rate=8000)]))
        await carrier.wait(lambda: carrier.events("clear"))
        await carrier.wait(lambda: call.details()["transcript"])
        greeting = call.details()["transcript"][0]
        assert greeting["agent_state"] == "interrupted"
        heard = greeting["agent"].split()
        assert heard == words.split()[: len(heard)] and len(heard) < 20  # cut about 1 s in, not at the end
    finally:
        await carrier.close()
        await c.close()


async def test_caller_speech_becomes_a_turn_and_the_reply_goes_out(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client)
    carrier.echo = True
    try:
        call = await wait_for_call(client)
        await carrier.wait(lambda: call.details()["transcript"])  # the greeting played out
        await carrier.speak(np.concatenate([loud(800, rate=8000), quiet(600, rate=8000)]))
        await carrier.wait(
            lambda: len(call.details()["transcript"]) == 2 and call.details()["transcript"][1]["agent"]
        )
        turn = call.details()["transcript"][1]
        assert (
            turn["user"] == "hello there"
            and "weather" in turn["agent"]
            and turn["agent_state"] == "committed"
        )
    finally:
        await carrier.close()


async def test_keypad_digits_reach_the_call(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client)
    carrier.echo = True
    try:
        call = await wait_for_call(client)
        for digit in "5#":
            await carrier.send("dtmf", dtmf={"track": "inbound_track", "digit": digit})
        await carrier.wait(lambda: any(t["user"] == "[DTMF 5#]" for t in call.details()["transcript"]))
    finally:
        await carrier.close()


async def test_garbage_is_counted_and_the_call_goes_on(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client)
    carrier.echo = True
    reasons = ("bad_json", "unknown_event", "bad_media", "bad_frame", "bad_dtmf", "bad_mark", "binary")
    before = {reason: errors("twilio", reason) for reason in reasons}
    try:
        call = await wait_for_call(client)
        await carrier.ws.send_str("{not json")
        await carrier.ws.send_str("[1, 2]")
        await carrier.send("dance")
        await carrier.send("media", media={"payload": "%%% not base64 %%%"})
        await carrier.send("media", media={"payload": base64.b64encode(b"\xff" * 100).decode()})
        await carrier.send("dtmf", dtmf={"digit": "X"})
        await carrier.send("mark", mark={})
        await carrier.ws.send_bytes(b"\x00\x01")
        await carrier.wait(lambda: all(errors("twilio", r) > before[r] for r in reasons))
        assert errors("twilio", "bad_json") >= before["bad_json"] + 2
        assert call.state != "ended" and client.server.app[RUNTIME].registry.get(call.call_id) is call
        await carrier.speak(np.concatenate([loud(800, rate=8000), quiet(600, rate=8000)]))
        await carrier.wait(lambda: any(t["user"] == "hello there" for t in call.details()["transcript"]))
    finally:
        await carrier.close()


async def test_stop_ends_the_call_and_a_closed_socket_does_too(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client)
    call = await wait_for_call(client)
    await carrier.send("stop", stop={"accountSid": "AC1", "callSid": "CA1"})
    await no_calls(client)
    assert call.ended and call.end_reason == "hangup"
    await carrier.close()
    second = await streaming(client, call_sid="CA2")
    await wait_for_call(client)
    await second.close()
    await no_calls(client)


async def test_a_carrier_that_falls_silent_is_hung_up(client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(media_stream, "MEDIA_TIMEOUT_S", 0.3)
    carrier = await streaming(client)
    call = await wait_for_call(client)
    await no_calls(client)
    assert call.end_reason == "media_timeout"
    await asyncio.wait_for(carrier.finished, 5)


async def test_a_stream_that_never_starts_is_closed_with_a_reason() -> None:
    c = await client_for(settings(stream_start_timeout_s=0.2))
    before = errors("twilio", "no_start")
    try:
        ws = await c.ws_connect("/twilio/stream")
        await ws.send_str(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        msg = await ws.receive(timeout=5)
        assert msg.type is aiohttp.WSMsgType.CLOSE
        assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION and "start" in msg.extra
        assert errors("twilio", "no_start") == before + 1
        assert c.server.app[RUNTIME].registry.active() == []
    finally:
        await c.close()


async def test_an_oversized_message_closes_the_stream(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client)
    await wait_for_call(client)
    await carrier.ws.send_str(json.dumps({"event": "media", "media": {"payload": "A" * 100_000}}))
    await carrier.finished
    assert carrier.ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    await no_calls(client)


async def webhook_parameters(c: TestClient, kind: str, call_sid: str) -> dict[str, str]:  # type: ignore[type-arg]
    response = await c.post(f"/{kind}/voice?team=sales", data={"CallSid": call_sid, "From": "+1", "To": "+2"})
    return parameters_of(await response.text())


async def refused(c: TestClient, **start: Any) -> str:  # type: ignore[type-arg]
    """The reason a stream was closed for: its token."""
    carrier = await streaming(c, **start)
    await asyncio.wait_for(carrier.finished, 5)
    assert carrier.ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
    assert c.server.app[RUNTIME].registry.active() == []
    return carrier.close_reason


async def test_a_stream_must_present_the_token_its_webhook_minted(tmp_path: Path) -> None:
    agent = tmp_path / "desk.toml"
    agent.write_text('system_prompt = "Desk."\ncaller_variables = ["team"]\nsip_users = ["*"]\n')
    c = await client_for(settings(stream_secret="s3cret", agent=(str(agent),)))
    try:
        params = await webhook_parameters(c, "twilio", "CA9")
        assert params[TOKEN_PARAMETER] and params["team"] == "sales"
        without = {k: v for k, v in params.items() if k != TOKEN_PARAMETER}
        assert "missing" in await refused(c, parameters=without, call_sid="CA9")
        assert "invalid" in await refused(c, parameters=params, call_sid="CA-other")
        assert "invalid" in await refused(c, parameters={**params, "team": "admin"}, call_sid="CA9")
        assert "invalid" in await refused(c, parameters={**params, TOKEN_PARAMETER: "9999999999.caf\u00e9"})
        carrier = await streaming(c, parameters=params, call_sid="CA9")
        call = await wait_for_call(c)
        assert TOKEN_PARAMETER not in call.origin.values and call.origin.values["team"] == "sales"
        await carrier.close()
        await no_calls(c)
        assert "used" in await refused(c, parameters=params, call_sid="CA9")  # one stream per token
    finally:
        await c.close()


async def test_a_telnyx_stream_in_pcma_is_heard_and_answered_without_a_stream_id(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(
        client,
        "telnyx",
        call_sid="v3:abc",
        media_format={"encoding": "PCMA", "sample_rate": 8000, "channels": 1},
    )
    carrier.echo = True
    try:
        call = await wait_for_call(client)
        assert (
            call.transport == "telnyx"
            and call.origin.caller == "+15550001111"
            and call.origin.called == "+15550002222"
        )
        await carrier.wait(lambda: carrier.events("mark"))
        assert all("streamSid" not in m and "stream_id" not in m for m in carrier.events("media"))
        await carrier.wait(lambda: call.details()["transcript"])
        await carrier.speak(np.concatenate([loud(800, rate=8000), quiet(600, rate=8000)]), encode=alaw_encode)
        await carrier.wait(lambda: any(t["user"] == "hello there" for t in call.details()["transcript"]))
    finally:
        await carrier.close()


async def test_at_capacity_the_webhook_answers_busy_and_a_stream_is_closed() -> None:
    c = await client_for(settings(max_calls=1))
    first = await streaming(c)
    try:
        await wait_for_call(c)
        busy = await c.post("/twilio/voice", data={"CallSid": "CA2", "From": "+1", "To": "+2"})
        reject = ElementTree.fromstring(await busy.text()).find("./Reject")
        assert busy.status == 200 and reject is not None and reject.attrib["reason"] == "busy"
        second = await streaming(c, call_sid="CA3")
        await asyncio.wait_for(second.finished, 5)
        assert (
            second.ws.close_code == aiohttp.WSCloseCode.TRY_AGAIN_LATER and "capacity" in second.close_reason
        )
        assert len(c.server.app[RUNTIME].registry.active()) == 1
    finally:
        await first.close()
        await c.close()


async def test_a_stream_asking_for_an_agent_this_service_lacks_is_closed(client) -> None:  # type: ignore[no-untyped-def]
    carrier = await streaming(client, parameters={"agent": "nobody"})
    await asyncio.wait_for(carrier.finished, 5)
    assert carrier.ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
    assert "no agent named" in carrier.close_reason
    assert client.server.app[RUNTIME].registry.active() == []
