"""Phone calls over SIP with real peers from Debian (baresip, SIPp) and the real models, on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from parley.audio import resample
from parley.bench.caller import Caller
from parley.bench.common import letters_alike, word_overlap
from parley.bench.interruption import speech_onset_s
from parley.bench.service import Service, metric_value
from parley.bench.sip_caller import SipCaller
from parley.bench.speech import espeak, trim
from parley.engines.stt import SttEngine
from tests.peers.baresip import Baresip, silence_wav, write_source_wav
from tests.peers.sipp import can_play_pcap, run_sipp

QUESTION = "what is the capital city of japan"


def sip_target(service: Service) -> str:
    return f"127.0.0.1:{service.sip_port}"


def wait_until(predicate, timeout: float = 30.0, every: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError("condition not met in time")


def sip_calls(service: Service) -> list[dict[str, object]]:
    return [c for c in service.get_json("/api/calls") if c["transport"] == "sip"]


def post_json(service: Service, path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{service.base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# make test-all, for the default suite's margin under 12 minutes: baresip's keys and its dial-out stay in
# make test, and four baresip phones ask and hear their answers through Kamailio (tests/fleet).
@pytest.mark.slow
def test_a_softphone_calls_the_agent_asks_a_question_and_hears_the_answer(
    service: Service, whisper: SttEngine, tmp_path: Path
) -> None:
    question = trim(espeak(QUESTION))
    lead_s = 5.0  # the greeting plays first
    wav = write_source_wav(
        tmp_path / "question.wav", question, 16000, lead_silence_s=lead_s, tail_silence_s=60
    )
    with Baresip(audio=wav) as phone:
        phone.dial(service.sip_uri)
        phone.wait_for_event("CALL_ESTABLISHED", timeout=15, fail_on=("CALL_CLOSED",))
        call = wait_until(lambda: next(iter(sip_calls(service)), None), timeout=10)
        turn = wait_until(
            lambda: next(
                (
                    t
                    for t in service.get_json(f"/api/calls/{call['id']}")["transcript"]
                    if t["turn_id"] != "greeting" and t["agent_state"] == "committed"
                ),
                None,
            ),
            timeout=60,
        )
        time.sleep(1.0)  # the last of the reply reaches the phone's recording
        heard, rate = phone.recorded_received()
        phone.hangup()
        phone.wait_for_event("CALL_CLOSED", timeout=10)
    assert word_overlap(turn["user"], QUESTION) >= 0.7, turn["user"]
    assert "tokyo" in turn["agent"].lower() or len(turn["agent"].split()) >= 3
    asked_end = lead_s + question.size / 16000
    reply = heard[int(asked_end * rate) :]
    text = whisper.transcribe(resample(reply, rate, 16000)).text
    # a short reply over 8 kHz: a word Whisper splits wrong must not fail it, other words must
    assert word_overlap(text, turn["agent"]) >= 0.6 or letters_alike(text, turn["agent"]) >= 0.8, (
        f"the phone heard {text!r}, the agent said {turn['agent']!r}"
    )
    wait_until(lambda: not sip_calls(service), timeout=10)
    assert service.get_json(f"/api/calls/{call['id']}")["state"] == "ended"


def test_keys_pressed_on_a_softphone_reach_the_call(service: Service, tmp_path: Path) -> None:
    with Baresip(audio=silence_wav(tmp_path / "quiet.wav", 60)) as phone:
        phone.dial(service.sip_uri)
        phone.wait_for_event("CALL_ESTABLISHED", timeout=15, fail_on=("CALL_CLOSED",))
        call = wait_until(lambda: next(iter(sip_calls(service)), None), timeout=10)
        time.sleep(0.5)
        phone.send_dtmf("42#")
        turn = wait_until(
            lambda: next(
                (
                    t
                    for t in service.get_json(f"/api/calls/{call['id']}")["transcript"]
                    if t["user"].startswith("[DTMF")
                ),
                None,
            ),
            timeout=20,
        )
        phone.hangup()
    assert turn["user"] == "[DTMF 42#]"


def test_the_agent_dials_a_softphone_and_it_hears_the_greeting(
    service: Service, whisper: SttEngine, tmp_path: Path
) -> None:
    with Baresip(audio=silence_wav(tmp_path / "quiet.wav", 60), auto_answer=True) as phone:
        status, body = post_json(service, "/api/calls/sip", {"to": phone.uri})
        assert status == 202, body
        phone.wait_for_event("CALL_ESTABLISHED", timeout=15, fail_on=("CALL_CLOSED",))
        wait_until(
            lambda: any(
                t["turn_id"] == "greeting" and t["agent_state"] == "committed"
                for t in service.get_json(f"/api/calls/{body['call_id']}")["transcript"]
            ),
            timeout=30,
        )
        time.sleep(0.5)
        heard, rate = phone.recorded_received()
        request = urllib.request.Request(f"{service.base_url}/api/calls/{body['call_id']}", method="DELETE")
        with urllib.request.urlopen(request, timeout=10) as r:
            status = r.status
        phone.wait_for_event("CALL_CLOSED", timeout=10)  # our BYE reached it
    assert status == 200
    text = whisper.transcribe(resample(heard, rate, 16000)).text.lower()
    assert "parley" in text or "help you" in text, text
    record = service.get_json(f"/api/calls/{body['call_id']}")
    assert record["state"] == "ended" and record["called"].startswith("sip:")


@pytest.mark.skipif(not can_play_pcap(), reason="SIPp's pcap play needs root or CAP_NET_RAW")
@pytest.mark.slow  # make test-all; a softphone's keys and the unit tests cover DTMF and PCMA in make test
def test_sipp_plays_its_pcma_pcap_with_rfc2833_digits_into_a_call(service: Service) -> None:
    digits_before = metric_value(service.metrics_text(), "parley_dtmf_digits_total", {"transport": "sip"})
    result = run_sipp("uac_pcap", sip_target(service), calls=1, timeout_s=60)
    assert result.ok, result.describe()
    assert (
        metric_value(service.metrics_text(), "parley_dtmf_digits_total", {"transport": "sip"}) > digits_before
    )


def _service_fds_and_call_threads(service: Service) -> tuple[int, float]:
    """Open files of the service, and the stage threads of calls it still runs."""
    assert service.process is not None
    fds = len(os.listdir(f"/proc/{service.process.pid}/fd"))
    return fds, metric_value(service.metrics_text(), "parley_call_threads")


def test_fifty_sipp_calls_at_ten_a_second_all_succeed_and_leave_nothing_behind(service: Service) -> None:
    wait_until(lambda: not sip_calls(service), timeout=20)
    fds_before, _ = _service_fds_and_call_threads(service)
    # At most 12 at once: the point is the SIP stack at 10 calls/s, not the --max-calls limit (16) that
    # slower call teardown on a loaded machine could reach.
    result = run_sipp("uac", sip_target(service), calls=50, rate=10, limit=12, timeout_s=120)
    assert result.ok and result.successful == 50, result.describe()
    wait_until(lambda: not sip_calls(service), timeout=30)
    text = service.metrics_text()
    assert metric_value(text, "parley_sip_dialogs") == 0
    assert metric_value(text, "parley_calls_active", {"transport": "sip"}) == 0

    def settled() -> bool:
        fds, call_threads = _service_fds_and_call_threads(service)
        return fds <= fds_before and call_threads == 0

    wait_until(settled, timeout=20)  # RTP sockets closed, stage threads joined


async def test_garbage_on_the_sip_port_disturbs_no_call(service: Service) -> None:
    async with Caller(service.base_url) as browser:
        await browser.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            for junk in (b"\x00\xff" * 300, b"INVITE sip:x SIP/2.0\r\n\r\n", b"", b"hello\r\n\r\n"):
                s.sendto(junk, ("127.0.0.1", service.sip_port))
            s.sendto(
                b"OPTIONS sip:parley@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKx\r\n"
                b"From: <sip:a@b>;tag=1\r\nTo: <sip:parley@127.0.0.1>\r\nCall-ID: junk\r\n\r\n",
                ("127.0.0.1", service.sip_port),
            )
            reply = s.recv(65536)  # no CSeq: a 400, sent back to where the request came from (rport-less)
        assert reply.startswith(b"SIP/2.0 400")
        asked, spoken_end = await browser.say(trim(espeak("how do i make a cup of tea")))
        await browser.wait_for_audio(after=spoken_end, timeout=30)
        said = await browser.wait_for_event("user_transcript", timeout=10, after=asked)
        assert "tea" in said["text"].lower()


async def test_a_caller_on_the_phone_interrupts_and_the_rtp_audio_stops(service: Service) -> None:
    async with SipCaller(service.base_url, service.sip_uri) as phone:
        await phone.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        _, asked = await phone.say(espeak("tell me a story about a brave little dragon"))
        await phone.wait_for_audio(after=asked, timeout=30)
        await asyncio.sleep(0.6)
        interruption = espeak("sorry to stop you, can you tell me the time in london instead")
        playback = phone.mic.play(interruption)
        onset = await playback.started + speech_onset_s(interruption)
        silent_at = await phone.wait_for_silence(after=onset, hold_s=0.5, timeout=10)
        assert silent_at - onset < 1.0, "the agent kept talking over the caller"
        cut = await phone.wait_for_event("agent_done", timeout=20, interrupted=True)
        barge = await phone.wait_for_event("barge_in", timeout=5)
        assert barge["by"] == "speech" and cut["text"]
        await playback.finished
        # The answer to the interruption, and the transcript its turn ended with (the turn can end in
        # the clip's trailing silence, so its transcript may come out before the clip has finished).
        answer = await phone.wait_for_event("agent_done", timeout=60, after=onset, interrupted=False)
        said = phone.latest_event("user_transcript", turn_id=answer["turn_id"])
        assert said is not None and "london" in said["text"].lower()
