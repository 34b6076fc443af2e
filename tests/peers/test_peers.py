"""The SIP peer drivers against each other: baresip <-> baresip, SIPp <-> SIPp, and each against the other.

These pin down what baresip 1.0.0 and SIPp 3.6 actually do (see the module docstrings of baresip.py and
sipp.py), so a changed Debian package shows up here before it breaks a test of the agent.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.peers.baresip import Baresip, silence_wav, synthesize_speech, write_source_wav
from tests.peers.sipp import SippUas, can_play_pcap, run_sipp, write_play_scenario, write_rtp_pcap

pytestmark = pytest.mark.slow

needs_tools = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("baresip", "sipp", "espeak-ng")),
    reason="needs baresip, sipp (sip-tester) and espeak-ng",
)
needs_raw_socket = pytest.mark.skipif(
    not can_play_pcap(), reason="SIPp's pcap play needs root or CAP_NET_RAW"
)


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) if samples.size else 0.0


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet waited for) still answers kill 0: look at its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def hello() -> Iterator[tuple[np.ndarray, int]]:
    yield synthesize_speech("hello there")


@needs_tools
def test_baresip_calls_baresip_says_hello_and_presses_5(
    tmp_path: Path, hello: tuple[np.ndarray, int]
) -> None:
    speech, rate = hello
    speech_s = speech.size / rate
    question = write_source_wav(tmp_path / "hello.wav", speech, rate, tail_silence_s=60)
    with (
        Baresip(user="agent", auto_answer=True, directory=tmp_path / "a") as agent,
        Baresip(user="caller", audio=question, directory=tmp_path / "b") as caller,
    ):
        caller.dial(agent.uri)
        caller.wait_for_event("CALL_ESTABLISHED", fail_on=("CALL_CLOSED",))
        agent.wait_for_event("CALL_ESTABLISHED")
        # Let the whole question play (then the WAV is silence), then press 5.
        caller.wait_for_event("CALL_RTPESTAB")
        time.sleep(speech_s + 0.8)
        caller.send_dtmf("5")
        start = agent.wait_for_event("CALL_DTMF_START", fail_on=("CALL_CLOSED",))
        assert start.param == "5", agent.describe("wrong digit")
        agent.wait_for_event("CALL_DTMF_END")
        assert agent.received_dtmf() == "5"
        caller.hangup()
        closed = agent.wait_for_event("CALL_CLOSED")
        assert closed.param == "Connection reset by peer"
        caller.wait_for_event("CALL_CLOSED")

        heard, heard_rate = agent.recorded_received()
        said, said_rate = caller.recorded_sent()
        pids = (agent.pid, caller.pid)
    assert heard_rate == said_rate == 8000
    first = heard[: int(speech_s * heard_rate)]
    after = heard[int((speech_s + 0.3) * heard_rate) :]
    assert rms(first) > 1000, f"the agent heard no speech (RMS {rms(first):.0f})"
    assert after.size > 0 and rms(after) < 50, (
        f"the speech was not followed by silence (RMS {rms(after):.0f})"
    )
    assert rms(said[: int(speech_s * said_rate)]) > 1000
    assert not any(alive(pid) for pid in pids)


@needs_tools
def test_barge_in_layout_by_switching_the_source_mid_call(
    tmp_path: Path, hello: tuple[np.ndarray, int]
) -> None:
    """Silence first, speech when the test says so: `set_audio_source` in the running call. Also the
    manual answer path: CALL_INCOMING, then accept()."""
    speech, rate = hello
    question = write_source_wav(tmp_path / "hello.wav", speech, rate, tail_silence_s=60)
    with (
        Baresip(user="agent", directory=tmp_path / "a") as agent,
        Baresip(
            user="caller", audio=silence_wav(tmp_path / "quiet.wav", 60), directory=tmp_path / "b"
        ) as caller,
    ):
        caller.dial(agent.uri)
        incoming = agent.wait_for_event("CALL_INCOMING")
        assert incoming.peer_uri == "sip:caller@127.0.0.1"
        agent.accept()
        agent.wait_for_event("CALL_ESTABLISHED", fail_on=("CALL_CLOSED",))
        caller.wait_for_event("CALL_ESTABLISHED", fail_on=("CALL_CLOSED",))
        time.sleep(1.5)
        caller.set_audio_source(question)
        time.sleep(speech.size / rate + 0.5)
        caller.hangup()
        agent.wait_for_event("CALL_CLOSED")
        heard, heard_rate = agent.recorded_received()
    quiet = heard[:heard_rate]  # the first second: before the switch
    loud = heard[int(1.4 * heard_rate) : int((1.5 + speech.size / rate + 0.2) * heard_rate)]
    assert rms(quiet) < 50, f"RMS {rms(quiet):.0f} before the switch"
    assert rms(loud) > 1000, f"RMS {rms(loud):.0f} after the switch"


@needs_tools
def test_aufile_ends_the_call_at_the_end_of_the_file(tmp_path: Path, hello: tuple[np.ndarray, int]) -> None:
    """Why source WAVs get a silence tail: baresip 1.0.0 closes the call when aufile reaches the end."""
    speech, rate = hello
    short = write_source_wav(tmp_path / "short.wav", speech, rate, tail_silence_s=0.2)
    with (
        Baresip(user="agent", auto_answer=True, directory=tmp_path / "a") as agent,
        Baresip(user="caller", audio=short, directory=tmp_path / "b") as caller,
    ):
        caller.dial(agent.uri)
        caller.wait_for_event("CALL_ESTABLISHED", fail_on=("CALL_CLOSED",))
        closed = caller.wait_for_event("CALL_CLOSED", timeout=10)
        assert closed.param == "end of file"
        assert any(e.kind == "AUDIO_ERROR" and "end of file" in e.param for e in caller.events)
        agent.wait_for_event("CALL_CLOSED")


@needs_tools
def test_sipp_uac_against_sipp_uas(tmp_path: Path) -> None:
    with SippUas(directory=tmp_path / "uas") as uas:
        result = run_sipp("uac", uas.target, calls=5, rate=5, timeout_s=30, directory=tmp_path / "uac")
        assert result.ok, result.describe()
        assert (result.successful, result.failed, result.created) == (5, 0, 5)
        pid = uas.process.pid if uas.process else None
    assert uas.result is not None
    assert (uas.result.returncode, uas.result.successful, uas.result.failed) == (0, 5, 0), (
        uas.result.describe()
    )
    assert not alive(pid)


@needs_tools
def test_sipp_reports_failed_calls(tmp_path: Path) -> None:
    """A UAC against a baresip that does not know the request-URI's user: 404, exit 1, counted failed."""
    with Baresip(user="agent", auto_answer=True, directory=tmp_path / "a") as agent:
        result = run_sipp(
            "uac", f"127.0.0.1:{agent.sip_port}", service="nobody", calls=2, rate=10, timeout_s=20
        )
    assert result.returncode == 1, result.describe()
    assert (result.successful, result.failed) == (0, 2)
    assert "404 Not Found" in result.error_log


@needs_tools
def test_baresip_dials_sipp_uas_and_hears_its_echo(tmp_path: Path, hello: tuple[np.ndarray, int]) -> None:
    speech, rate = hello
    question = write_source_wav(tmp_path / "hello.wav", speech, rate, tail_silence_s=60)
    with (
        SippUas(rtp_echo=True, directory=tmp_path / "uas") as uas,
        Baresip(user="caller", audio=question, directory=tmp_path / "b") as caller,
    ):
        caller.dial(uas.uri("agent"))
        caller.wait_for_event("CALL_ESTABLISHED", fail_on=("CALL_CLOSED",))
        time.sleep(speech.size / rate + 0.5)
        caller.hangup()
        caller.wait_for_event("CALL_CLOSED")
        heard, heard_rate = caller.recorded_received()
        pid = caller.pid
    assert uas.result is not None and uas.result.successful == 1, uas.result and uas.result.describe()
    assert rms(heard[: int(speech.size / rate * heard_rate)]) > 1000, "the echo of the speech was not heard"
    assert caller.process is not None and caller.process.returncode is not None
    assert not alive(pid)


@needs_tools
def test_a_failing_test_leaves_no_process(tmp_path: Path) -> None:
    pids: list[int | None] = []
    with pytest.raises(RuntimeError, match="boom"), Baresip(directory=tmp_path / "a") as phone:
        pids.append(phone.pid)
        raise RuntimeError("boom")
    assert pids[0] is not None and not alive(pids[0])


@needs_tools
@needs_raw_socket
def test_sipp_plays_our_pcap_with_a_digit_into_baresip(tmp_path: Path, hello: tuple[np.ndarray, int]) -> None:
    speech, rate = hello
    seconds = write_rtp_pcap(tmp_path / "hello.pcap", speech, rate, codec="PCMA", dtmf="5")
    scenario = write_play_scenario(
        tmp_path / "play.xml", tmp_path / "hello.pcap", play_ms=int(seconds * 1000)
    )
    with Baresip(user="agent", auto_answer=True, codecs=("PCMA",), directory=tmp_path / "a") as agent:
        result = run_sipp(str(scenario), f"127.0.0.1:{agent.sip_port}", service="agent", timeout_s=30)
        assert result.ok, result.describe()
        agent.wait_for_event("CALL_DTMF_START")
        agent.wait_for_event("CALL_CLOSED")
        heard, heard_rate = agent.recorded_received()
        assert agent.received_dtmf() == "5", agent.describe("no digit")
    assert rms(heard[: int(speech.size / rate * heard_rate)]) > 1000


@needs_tools
@needs_raw_socket
def test_built_in_uac_pcap_plays_debians_pcaps(tmp_path: Path) -> None:
    """`-sn uac_pcap` finds pcap/g711a.pcap through the driver's `pcap` link to /usr/share/sip-tester."""
    with Baresip(user="agent", auto_answer=True, directory=tmp_path / "a") as agent:
        result = run_sipp("uac_pcap", f"127.0.0.1:{agent.sip_port}", service="agent", timeout_s=40)
        assert result.ok, result.describe()
        agent.wait_for_event("CALL_CLOSED")
        heard, heard_rate = agent.recorded_received()
        assert "1" in agent.received_dtmf(), agent.describe("no digit 1 from dtmf_2833_1.pcap")
    assert heard.size > 5 * heard_rate and rms(heard) > 500
