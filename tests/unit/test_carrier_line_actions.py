"""What the agent does to a carrier call, as the carrier sees it: `<Connect>` names our action URL (Twilio)
or is followed by a `<Redirect>` to it (Telnyx's TeXML); a transfer or a hang-up closes the stream and the
carrier's request to that URL is answered `<Dial>` or `<Hangup/>`; keypad digits arrive as DTMF tones in
the stream's audio. Played against the app with engine doubles by the scripted carrier of
test_media_stream."""

from __future__ import annotations

import asyncio
import base64
from xml.etree import ElementTree

import numpy as np
import pytest

from parley.audio import ulaw_decode
from parley.transports.base import LineActionFailed
from parley.transports.dtmf_tones import COLUMNS_HZ, LAYOUT, ROWS_HZ, dtmf_pcm
from parley.transports.twilio import twilio_signature
from tests.unit.test_media_stream import (
    PUBLIC,
    TELNYX_PUBLIC,
    client_for,
    no_calls,
    settings,
    streaming,
    telnyx_headers,
    wait_for_call,
)

RATE = 8000


def keys_heard(pcm: np.ndarray, rate: int = RATE) -> str:
    """The keys a DTMF detector hears: per 20 ms block the strongest row and column by the Goertzel
    power; a key is a run of at least two blocks with both well above the rest of the spectrum."""
    block = rate // 50
    keys, last, run = [], "", 0
    for i in range(0, pcm.size - block + 1, block):
        x = pcm[i : i + block].astype(np.float64)
        energy = float(np.sum(x**2)) or 1.0
        t = np.arange(block) / rate

        def power(hz: float, x: np.ndarray = x, t: np.ndarray = t) -> float:
            return float(abs(np.sum(x * np.exp(-2j * np.pi * hz * t))) ** 2) * 2 / block

        rows = [power(f) for f in ROWS_HZ]
        columns = [power(f) for f in COLUMNS_HZ]
        r, c = int(np.argmax(rows)), int(np.argmax(columns))
        key = LAYOUT[r][c] if rows[r] + columns[c] > 0.8 * energy else ""
        run = run + 1 if key and key == last else (1 if key else 0)
        if run == 2:
            keys.append(key)
        last = key
    return "".join(keys)


def test_every_key_is_heard_as_its_own_two_tones() -> None:
    keys = "123A456B789C*0#D"
    assert keys_heard(dtmf_pcm(keys, RATE)) == keys
    pcm = dtmf_pcm("5", RATE)
    assert pcm.size == RATE * 160 // 1000 and not pcm[RATE // 10 :].any()  # 100 ms tone, 60 ms pause
    assert 10_000 < np.abs(pcm).max() < 32767  # loud enough, never clipped


def connect_of(twiml: str) -> ElementTree.Element:
    connect = ElementTree.fromstring(twiml).find("Connect")
    assert connect is not None
    return connect


async def test_connect_names_the_action_and_texml_redirects_to_it_after_the_stream() -> None:
    c = await client_for(settings())
    try:
        twilio = await (
            await c.post("/twilio/voice", data={"CallSid": "CA1", "From": "+1", "To": "+2"})
        ).text()
        assert connect_of(twilio).attrib == {"action": f"{PUBLIC}/twilio/connect-action", "method": "POST"}
        telnyx = await (
            await c.post("/telnyx/voice", data={"CallSid": "v3:1", "From": "+1", "To": "+2"})
        ).text()
        root = ElementTree.fromstring(telnyx)
        assert [child.tag for child in root] == ["Connect", "Redirect"]
        redirect = root.find("Redirect")
        assert redirect is not None and redirect.text == f"{PUBLIC}/telnyx/connect-action"
        assert redirect.attrib == {"method": "POST"}
    finally:
        await c.close()


async def test_a_transfer_closes_the_stream_and_twilio_is_told_to_dial_the_number() -> None:
    c = await client_for(settings(twilio_auth_token="12345", stream_secret=""))
    try:
        form = {"CallSid": "CA7", "From": "+15550001111", "To": "+15550002222"}
        voice_url = f"{PUBLIC}/twilio/voice"
        voice = await c.post(
            "/twilio/voice",
            data=form,
            headers={"X-Twilio-Signature": twilio_signature("12345", voice_url, list(form.items()))},
        )
        stream = ElementTree.fromstring(await voice.text()).find("./Connect/Stream")
        assert stream is not None
        parameters = {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}
        carrier = await streaming(c, parameters=parameters, call_sid="CA7")
        call = await wait_for_call(c)
        assert call.line is not None
        await asyncio.to_thread(call.line.transfer, "+15551230000", 5)
        await asyncio.wait_for(carrier.finished, 10)  # our side closed the stream: <Connect> ends
        await no_calls(c)
        assert call.end_reason == "transferred"

        async def action(sid: str, signature: str | None = None) -> tuple[int, str]:
            params = {"CallSid": sid, "AccountSid": "AC1", "CallStatus": "in-progress"}
            url = f"{PUBLIC}/twilio/connect-action"
            good = twilio_signature("12345", url, list(params.items()))
            headers = {"X-Twilio-Signature": good if signature is None else signature}
            response = await c.post("/twilio/connect-action", data=params, headers=headers)
            return response.status, await response.text()

        assert (await action("CA7", signature="AAAA"))[0] == 403  # forged: and the transfer stays
        status, twiml = await action("CA7")
        assert status == 200 and twiml.endswith(
            "<Response><Dial><Number>+15551230000</Number></Dial></Response>"
        )
        status, twiml = await action("CA7")  # asked again (a retry): the transfer was taken once
        assert status == 200 and twiml.endswith("<Response><Hangup /></Response>")
    finally:
        await c.close()


async def test_the_agent_hanging_up_closes_the_stream_and_the_action_answers_hangup() -> None:
    c = await client_for(settings())
    try:
        carrier = await streaming(c, call_sid="CA8")
        call = await wait_for_call(c)
        assert call.line is not None
        call.line.hang_up("agent_hangup")
        await asyncio.wait_for(carrier.finished, 10)
        await no_calls(c)
        response = await c.post("/twilio/connect-action", data={"CallSid": "CA8"})
        assert response.status == 200 and (await response.text()).endswith("<Response><Hangup /></Response>")
        assert call.end_reason == "agent_hangup"
    finally:
        await c.close()


async def test_a_telnyx_transfer_to_a_sip_address_is_dialled_after_the_redirect() -> None:
    c = await client_for(settings(telnyx_public_key=TELNYX_PUBLIC))
    try:
        body = b"CallSid=v3%3Aabc&From=%2B15550001111&To=%2B15550002222"
        voice = await c.post("/telnyx/voice", data=body, headers=telnyx_headers(body))
        stream = ElementTree.fromstring(await voice.text()).find("./Connect/Stream")
        assert stream is not None
        parameters = {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}
        carrier = await streaming(c, "telnyx", parameters=parameters, call_sid="v3:abc")
        call = await wait_for_call(c)
        assert call.line is not None
        await asyncio.to_thread(call.line.transfer, "sip:desk@pbx.example.com", 5)
        await asyncio.wait_for(carrier.finished, 10)
        action = b"CallSid=v3%3Aabc&CallStatus=in-progress"
        forged = await c.post(
            "/telnyx/connect-action", data=action, headers=telnyx_headers(b"CallSid=v3%3Aother")
        )
        assert forged.status == 403
        response = await c.post("/telnyx/connect-action", data=action, headers=telnyx_headers(action))
        assert (await response.text()).endswith(
            "<Response><Dial><Sip>sip:desk@pbx.example.com</Sip></Dial></Response>"
        )
    finally:
        await c.close()


async def test_the_agents_digits_are_played_as_dtmf_tones_in_the_stream() -> None:
    c = await client_for(settings(greeting=""))
    try:
        carrier = await streaming(c)
        call = await wait_for_call(c)
        assert call.line is not None
        await asyncio.to_thread(call.line.send_dtmf, "1#", 5)
        await carrier.wait(lambda: len(carrier.events("media")) >= 16)  # 2 x 160 ms
        pcm = np.concatenate(
            [ulaw_decode(base64.b64decode(m["media"]["payload"])) for m in carrier.events("media")]
        )
        assert keys_heard(pcm) == "1#"
        with pytest.raises(LineActionFailed, match="keypad"):
            await asyncio.to_thread(call.line.send_dtmf, "9!", 5)
        assert not call.ended
        await carrier.close()
    finally:
        await c.close()
