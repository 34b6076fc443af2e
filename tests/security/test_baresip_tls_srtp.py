"""A real softphone over SIP TLS with SDES-SRTP (issue 42, item 7): Debian's baresip 1.0 calls the service's
TLS listener with SRTP mandatory; each side hears the other through SRTP, and the call ends with a BYE on
the same TLS connection. With encryption required, the same phone's plain-RTP call is refused.

The service runs in-process with engine doubles (conftest.py's `start`): the agent's voice is a 440 Hz
tone (ToneTts), and the caller's "speech" a loud 200 Hz tone that the LoudnessVad takes for a turn. What
baresip 1.0 does over TLS and SRTP, and what it does not (it checks no server certificate), is written up
in tests/peers/baresip.py.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parley.app import RUNTIME, SIP
from tests.doubles import ToneTts, loud
from tests.peers.baresip import BARESIP, CODEC_RATE, MODULE_PATH, Baresip, tls_uri, write_source_wav
from tests.security.conftest import LOCAL, Service, Start, eventually
from tests.security.tls_peer import Certificate, start_tls

pytestmark = pytest.mark.skipif(
    shutil.which(BARESIP) is None or not (MODULE_PATH / "srtp.so").is_file(),
    reason="needs baresip 1.0 with its srtp.so module (Debian's baresip-core)",
)

SUITE = "AES_CM_128_HMAC_SHA1_80"  # the one suite baresip 1.0 offers
GREETING = "Hello, you are talking to the agent."
AGENT_TONE_HZ = 440.0
LOUD_RMS = 1000.0  # the agent's tone is ~5600 RMS as baresip decodes it, silence ~2


def secure_phone(tmp_path: Path, name: str, certificate: Certificate, mediaenc: str | None) -> Baresip:
    """baresip told to trust the service's certificate, with `mediaenc` ("srtp-mand": SRTP only; None:
    plain RTP)."""
    return Baresip(
        user=name,
        directory=tmp_path / name,
        tls_ca_file=certificate.cert_file,
        media_encryption=mediaenc,
    )


async def command(action: Callable[..., object], *args: Any) -> None:
    # baresip answers a command at once, but the service it talks to runs on this event loop: a
    # blocking wait here would stall the very call the command is about.
    await asyncio.to_thread(action, *args)


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    async def check() -> bool:
        return condition()

    await eventually(check, timeout, what)


async def call_details(service: Service, call_id: str) -> dict[str, Any]:
    response = await service.client.get(f"/api/calls/{call_id}", headers=service.auth)
    assert response.status == 200, await response.text()
    details: dict[str, Any] = await response.json()
    return details


def bye_answered(phone: Baresip) -> bool:
    return any(m.method == "BYE" and m.status == 200 for m in phone.sip_messages())


def loud_frames(samples: np.ndarray, rate: int) -> np.ndarray:
    """The 20 ms frames of a recording louder than LOUD_RMS, joined."""
    size = rate // 50
    frames = samples[: samples.size // size * size].astype(np.float64).reshape(-1, size)
    joined: np.ndarray = frames[np.sqrt(np.mean(frames**2, axis=1)) > LOUD_RMS].ravel()
    return joined


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    spectrum[0] = 0.0
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[int(np.argmax(spectrum))])


async def test_baresip_calls_over_tls_with_mandatory_srtp_and_each_side_hears_the_other(
    start: Start, certificate: Certificate, tmp_path: Path
) -> None:
    service, tls_port = await start_tls(start, certificate, greeting=GREETING)
    speech = write_source_wav(tmp_path / "speech.wav", loud(800, CODEC_RATE), CODEC_RATE, tail_silence_s=60)
    with secure_phone(tmp_path, "caller", certificate, "srtp-mand") as phone:
        await command(phone.dial, tls_uri("agent", LOCAL, tls_port))
        await phone.wait_for_event_async("CALL_ESTABLISHED", timeout=15, fail_on=("CALL_CLOSED",))
        (leg,) = service.client.app[SIP].legs.values()

        async def greeted() -> bool:
            transcript = (await call_details(service, leg.call_id))["transcript"]
            return any(t["turn_id"] == "greeting" and t["agent_state"] == "committed" for t in transcript)

        await eventually(greeted, 20.0, "the greeting played out")
        # baresip sends one plain RTCP APP "PING" as its stream starts (see baresip.py), refused by now.
        refused_at_start = leg.rtp.unauthenticated
        # The caller speaks only now, so its turn cannot cut the greeting whatever the timing.
        await command(phone.set_audio_source, speech)

        async def answered() -> bool:
            transcript = (await call_details(service, leg.call_id))["transcript"]
            return any(t["user"] == "hello there" and t["agent_state"] == "committed" for t in transcript)

        await eventually(answered, 20.0, "the caller's turn heard and answered")
        await until(lambda: leg.rtp.rtcp_received >= 1, "an authenticated SRTCP report from baresip")
        refused_in_call = leg.rtp.unauthenticated - refused_at_start
        received, invalid = leg.rtp.received, leg.rtp.invalid

        await command(phone.hangup)
        await phone.wait_for_event_async("CALL_CLOSED", timeout=15)
        # baresip closes the call as it sends the BYE: the 200 reaches its trace a moment later.
        await until(lambda: bye_answered(phone), "the 200 for the BYE in baresip's trace")
        await until(lambda: not service.client.app[SIP].legs, "the service to let the call go")
        heard, rate = phone.recorded_received()
        messages = phone.sip_messages()
        suites = phone.srtp_suites()
        log = phone.describe("after the call")

    # Signalling: all of it over TLS, the BYE on the same connection and answered.
    assert messages and {m.transport for m in messages} == {"TLS"}, log
    assert [m.status for m in messages if m.method == "BYE"] == [None, 200], log
    invite, bye = (next(m for m in messages if m.method == method) for method in ("INVITE", "BYE"))
    assert bye.source == invite.source, log  # baresip's end of the one TLS connection
    # Media: SRTP with the same suite on both sides; every packet of the call authenticated by the
    # service, SRTCP included, and decoded into the turn the caller spoke.
    assert suites == [SUITE], log
    assert leg.rtp.encrypted and leg.rtp.negotiated is not None and leg.rtp.negotiated.srtp is not None
    assert leg.rtp.negotiated.srtp.suite == SUITE
    assert received >= 100 and invalid == 0, (received, invalid)  # >= 2 s of 20 ms packets
    assert refused_at_start <= 1 and refused_in_call == 0, (refused_at_start, refused_in_call)
    # What the phone heard: the agent's tone, decrypted and decoded, at least as long as the greeting.
    voice = loud_frames(heard, rate)
    greeting_s = ToneTts().seconds_per_word * len(GREETING.split())
    assert voice.size >= 0.8 * greeting_s * rate, f"{voice.size / rate:.2f} s of the agent heard"
    assert abs(dominant_hz(voice, rate) - AGENT_TONE_HZ) < 10, dominant_hz(voice, rate)
    # The service's side of the hang-up: the caller's BYE ended the call.
    details = await call_details(service, leg.call_id)
    assert leg.remote_ended and (details["state"], details["ended_reason"]) == ("ended", "hangup")


async def test_required_encryption_refuses_baresips_plain_rtp_over_tls_with_488_and_takes_its_srtp(
    start: Start, certificate: Certificate, tmp_path: Path
) -> None:
    service, tls_port = await start_tls(start, certificate, sip_require_encryption=True)
    target = tls_uri("agent", LOCAL, tls_port)
    with secure_phone(tmp_path, "plain", certificate, None) as plain:
        await command(plain.dial, target)
        closed = await plain.wait_for_event_async("CALL_CLOSED", timeout=15, fail_on=("CALL_ESTABLISHED",))
        refusals = [m for m in plain.sip_messages() if m.method == "INVITE" and m.status == 488]
        assert closed.param == "488 Not Acceptable Here" and len(refusals) == 1, plain.describe("not a 488")
    assert refusals[0].transport == "TLS"
    assert "encrypted media is required" in (refusals[0].header("Warning") or "")
    assert not service.client.app[SIP].legs and not service.client.app[RUNTIME].registry.active()

    with secure_phone(tmp_path, "secure", certificate, "srtp-mand") as phone:
        await command(phone.dial, target)
        await phone.wait_for_event_async("CALL_ESTABLISHED", timeout=15, fail_on=("CALL_CLOSED",))
        (leg,) = service.client.app[SIP].legs.values()
        # RTPESTAB: baresip took the service's SRTP (it drops what fails its check); then the other way.
        await phone.wait_for_event_async("CALL_RTPESTAB", timeout=15, fail_on=("CALL_CLOSED",))
        await until(lambda: leg.rtp.received >= 10, "the phone's SRTP at the service")
        await command(phone.hangup)
        await phone.wait_for_event_async("CALL_CLOSED", timeout=15)
        await until(lambda: not service.client.app[SIP].legs, "the service to let the call go")
        assert phone.srtp_suites() == [SUITE], phone.describe("no SRTP")
    assert leg.rtp.encrypted and leg.remote_ended
