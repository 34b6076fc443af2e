"""A scenario's line: the caller's noise and level, and what the network does to its packets, the same
for the same seed and otherwise not; the codec it may have on each transport; the line in words. And the
SIP caller that a scenario calls with: its RTP on the line, and a transfer (REFER) it accepts and reports."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import soundfile

from parley.audio import PIPELINE_RATE, rms_dbfs
from parley.bench.listening import Mouth
from parley.bench.noises import SPEECH_DBFS
from parley.bench.sip_caller import SipCaller
from parley.scenarios.line import CallerLine
from parley.scenarios.scenario import Line, ScenarioError, Stall
from parley.transports.sip.dialog import Dialog
from parley.transports.sip.message import SipRequest, SipResponse, make_response, parse_message
from parley.transports.sip.refer import refer_request, sipfrag_status, subscription_terminated
from parley.transports.sip.rtp import RtpPacket
from parley.transports.sip.sdp import Negotiated
from parley.transports.sip.transactions import Peer, TransactionLayer


@pytest.fixture(scope="module")
def hiss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded noise: 3 s of white noise at 8 kHz, stereo (the line mixes and resamples it)."""
    path = tmp_path_factory.mktemp("noise") / "hiss.wav"
    noise = np.random.default_rng(1).normal(0.0, 0.1, (3 * 8000, 2))
    soundfile.write(str(path), noise, 8000)
    return path


def frames(line: CallerLine, rate: int, count: int, size: int) -> np.ndarray:
    """What `count` silent frames of `size` samples become on their way out."""
    add = line.noisy(rate)
    return np.concatenate([add(np.zeros(size, dtype=np.int16)) for _ in range(count)])


# the caller's sound


def test_the_noise_is_the_same_for_a_seed_and_another_for_another_seed(hiss: Path) -> None:
    line = Line(noise=str(hiss), snr_db=10.0)
    first, again = frames(CallerLine(line, 7), 8000, 50, 160), frames(CallerLine(line, 7), 8000, 50, 160)
    other = frames(CallerLine(line, 8), 8000, 50, 160)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


def test_the_noise_runs_on_from_frame_to_frame_at_the_snr_asked(hiss: Path) -> None:
    line = CallerLine(Line(noise=str(hiss), snr_db=10.0), 3)
    small, large = frames(line, 8000, 100, 160), frames(line, 8000, 50, 320)
    assert np.array_equal(small, large)  # one stretch of noise, however it is cut into frames
    assert abs(rms_dbfs(small) - (SPEECH_DBFS - 10.0)) < 0.5


def test_the_noise_is_under_the_speech_and_between_the_turns(hiss: Path) -> None:
    line = CallerLine(Line(noise=str(hiss), snr_db=5.0), 3)

    async def speak(mouth: Mouth) -> np.ndarray:
        mouth.play(np.full(640, 1000, dtype=np.int16))  # 40 ms: two of the four frames
        return np.concatenate([mouth.next_frame(0.0) for _ in range(4)])

    noisy = asyncio.run(speak(Mouth(16000, frame_filter=line.noisy(16000))))
    clean = asyncio.run(speak(Mouth(16000)))
    assert np.array_equal(noisy.astype(np.int32) - clean, frames(line, 16000, 4, 320))
    assert clean[:640].all() and not clean[640:].any()


def test_a_built_in_noise_is_made_and_levelled() -> None:
    out = frames(CallerLine(Line(noise="street", snr_db=15.0), 0), 16000, 100, 320)
    assert abs(rms_dbfs(out) - (SPEECH_DBFS - 15.0)) < 4.0  # street swells and fades over seconds


def test_a_clean_line_adds_nothing() -> None:
    assert not frames(CallerLine(Line(), 0), 8000, 5, 160).any()


def test_an_unreadable_noise_is_a_scenario_error(tmp_path: Path) -> None:
    bad = tmp_path / "rain.wav"
    bad.write_text("not audio")
    with pytest.raises(ScenarioError, match=r"rain.wav"):
        CallerLine(Line(noise=str(bad)), 0).noisy(8000)


def test_speech_is_set_to_a_calls_level_its_pauses_left_out() -> None:
    line = CallerLine(Line(), 0)
    t = np.arange(PIPELINE_RATE) / PIPELINE_RATE
    tone = (3000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    paused = np.concatenate([tone, np.zeros(PIPELINE_RATE, dtype=np.int16), tone])
    assert abs(rms_dbfs(line.level(tone)) - SPEECH_DBFS) < 0.1
    assert abs(rms_dbfs(line.level(paused)[:PIPELINE_RATE]) - SPEECH_DBFS) < 0.1
    assert not line.level(np.zeros(800, dtype=np.int16)).any()


# the packets


async def through(line: CallerLine, count: int) -> list[int]:
    """Send packets 0..count-1 at once; the numbers that arrived, in the order they arrived."""
    arrived: list[int] = []
    send = line.impair(arrived.append)
    for n in range(count):
        send(n)
    await asyncio.sleep(line.line.jitter_ms / 1000 + 0.03)
    return arrived


async def test_the_same_packets_are_lost_for_a_seed_and_others_for_another() -> None:
    line = Line(loss=0.1)
    first, again = await through(CallerLine(line, 7), 2000), await through(CallerLine(line, 7), 2000)
    other = await through(CallerLine(line, 8), 2000)
    assert first == again
    assert first != other
    counted = CallerLine(line, 7)
    assert len(await through(counted, 2000)) == 2000 - counted.lost
    assert counted.sent == 2000 and 0.08 < counted.lost / 2000 < 0.12


async def delays(line: CallerLine, count: int) -> tuple[list[int], np.ndarray]:
    """Send packets 0..count-1 at once: their arrival order, and how late each arrived (s)."""
    loop = asyncio.get_running_loop()
    arrived: dict[int, float] = {}

    def arrive(n: int) -> None:
        arrived[n] = loop.time()

    send = line.impair(arrive)
    sent = []
    for n in range(count):
        sent.append(loop.time())
        send(n)
    await asyncio.sleep(line.line.jitter_ms / 1000 + 0.03)
    return list(arrived), np.array([arrived[n] - sent[n] for n in range(count)])


async def test_jitter_delays_packets_the_same_way_for_a_seed_and_reorders_them() -> None:
    line = Line(jitter_ms=100)
    (order, first), (_, again) = await delays(CallerLine(line, 7), 40), await delays(CallerLine(line, 7), 40)
    _, other = await delays(CallerLine(line, 8), 40)
    # Timers fire a little late on a busy machine, never early: compared to within 20 ms.
    assert np.abs(first - again).max() < 0.02
    assert np.abs(first - other).mean() > 0.02  # 33 ms apart on average, drawn apart
    assert first.min() >= 0 and first.max() < 0.1 + 0.03 and first.max() - first.min() > 0.05
    assert sorted(order) == list(range(40)) and order != sorted(order)  # all came; some overtook others


async def test_a_stall_holds_the_packets_then_delivers_them_at_once_in_order() -> None:
    loop = asyncio.get_running_loop()
    line = CallerLine(Line(stalls=(Stall(at_s=0.05, ms=100),)), 0)
    arrived: list[tuple[int, float]] = []

    def arrive(n: int) -> None:
        arrived.append((n, loop.time()))

    send = line.impair(arrive)
    sent: list[float] = []
    for n in range(25):
        sent.append(loop.time())
        send(n)
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    stalled = [n for n, t in enumerate(sent) if 0.05 <= t - sent[0] < 0.15]
    assert len(stalled) >= 5 and line.held == len(stalled)
    assert [n for n, _ in arrived] == list(range(25))  # nothing lost, the burst in order
    burst = [t - sent[0] for n, t in arrived if n in stalled]
    assert min(burst) >= 0.15 - 0.002 and max(burst) - min(burst) < 0.005  # at once, at the stall's end
    assert all(t - s < 0.005 for (n, t), s in zip(arrived, sent, strict=True) if n not in stalled)


async def test_a_send_that_is_a_coroutine_runs_and_close_drops_what_is_still_on_the_line() -> None:
    line = CallerLine(Line(jitter_ms=20), 1)
    arrived: list[int] = []

    async def send(n: int) -> None:
        arrived.append(n)

    impaired = line.impair(send)
    for n in range(10):
        impaired(n)
    await asyncio.sleep(0.04)
    assert sorted(arrived) == list(range(10))
    for n in range(10, 20):
        impaired(n)
    line.close()
    impaired(20)
    await asyncio.sleep(0.04)
    assert sorted(arrived) == list(range(10))


# codec and words


def test_each_transport_has_its_codecs() -> None:
    assert CallerLine(Line(), 0).codec_for("sip") == "PCMU"
    assert CallerLine(Line(), 0).codec_for("webrtc") == "opus"
    assert CallerLine(Line(), 0).codec_for("carrier") == "mulaw"
    assert CallerLine(Line(codec="pcma"), 0).codec_for("sip") == "PCMA"
    with pytest.raises(ScenarioError, match="opus is webrtc's"):
        CallerLine(Line(codec="opus"), 0).codec_for("sip")
    with pytest.raises(ScenarioError, match="carrier"):
        CallerLine(Line(codec="PCMU"), 0).codec_for("carrier")
    with pytest.raises(ScenarioError, match="webrtc"):
        CallerLine(Line(codec="mulaw"), 0).codec_for("webrtc")


def test_the_line_in_words() -> None:
    line = Line(codec="PCMU", loss=0.02, jitter_ms=40, stalls=(Stall(4.0, 800),), noise="street", snr_db=10)
    assert CallerLine(line, 7).describe() == (
        "PCMU, 2% loss, jitter 0-40 ms, 1 stall (800 ms at 4 s), street noise at 10 dB SNR, seed 7"
    )
    assert CallerLine(Line(), 3).describe() == "clean line, seed 3"


# the SIP caller


class Datagrams(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self.received.append(data)


async def test_the_sip_callers_rtp_is_lost_after_it_was_numbered() -> None:
    line = CallerLine(Line(loss=0.3), 4)
    expected = await through(CallerLine(Line(loss=0.3), 4), 100)
    phone = SipCaller("http://127.0.0.1:9", "sip:agent@127.0.0.1:5060", line=line)
    peer = Datagrams()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: peer, local_addr=("127.0.0.1", 0)
    )
    rtp = await phone._open_rtp()
    try:
        port = transport.get_extra_info("sockname")[1]
        rtp.configure(Negotiated("127.0.0.1", port, "PCMU", 0, None, "sendrecv"))
        rtp.trust_sdp_address()
        for _ in range(100):
            rtp.send_frame(np.zeros(160, dtype=np.int16))
        await asyncio.sleep(0.05)
    finally:
        rtp.close()
        transport.close()
    numbers = [RtpPacket.parse(data).sequence_number for data in peer.received]
    assert line.lost == 100 - len(expected) > 15 and len(numbers) == len(expected)
    # The packets the line let through, and gaps in the numbering where it lost one.
    assert [(n - numbers[0]) % 65536 for n in numbers] == [i - expected[0] for i in expected]


def service_side(phone: Dialog) -> Dialog:
    """The service's end of the SIP caller's dialog."""
    return Dialog(
        call_id=phone.call_id,
        local_tag=phone.remote_tag,
        remote_tag=phone.local_tag,
        local_uri="<sip:agent@127.0.0.1:5060>",
        remote_uri=phone.local_uri,
        remote_target="sip:caller@127.0.0.1:5072",
        route_set=[],
        local_contact="<sip:agent@127.0.0.1:5060>",
        via_host="127.0.0.1:5060",
        transport="UDP",
        fallback=Peer("UDP", "127.0.0.1", 5072),
    )


async def test_the_sip_caller_accepts_a_transfer_and_reports_the_new_call_answered() -> None:
    phone = SipCaller("http://127.0.0.1:9", "sip:agent@127.0.0.1:5060")
    sent: list[SipRequest | SipResponse] = []
    phone.layer = TransactionLayer(lambda message, _: sent.append(parse_message(message.to_bytes())))
    dialog = phone.dialog = Dialog(
        call_id="c1@127.0.0.1",
        local_tag="phone",
        remote_tag="service",
        local_uri="<sip:caller@127.0.0.1:5072>",
        remote_uri="<sip:agent@127.0.0.1:5060>",
        remote_target="sip:agent@127.0.0.1:5060",
        route_set=[],
        local_contact="<sip:caller@127.0.0.1:5072>",
        via_host="127.0.0.1:5072",
        transport="UDP",
        fallback=Peer("UDP", "127.0.0.1", 5060),
    )
    service = Peer("UDP", "127.0.0.1", 5060)
    refer = refer_request(service_side(dialog), "sip:desk@127.0.0.1:5999")
    phone._on_message(parse_message(refer.to_bytes()), service)
    await asyncio.sleep(0)

    accepted, notify = sent[0], sent[1]
    assert isinstance(accepted, SipResponse) and accepted.status == 202
    assert phone.transferred_to == "sip:desk@127.0.0.1:5999"
    assert isinstance(notify, SipRequest) and notify.method == "NOTIFY"
    assert (notify.call_id, notify.from_tag, notify.to_tag) == ("c1@127.0.0.1", "phone", "service")
    assert notify.headers.get("Event") == "refer" and notify.headers.get("Contact")
    assert subscription_terminated(notify.headers.get("Subscription-State"))
    assert notify.headers.get("Content-Type") == "message/sipfrag"
    assert sipfrag_status(notify.body) == (200, "OK")

    # The service's 200 ends the NOTIFY's transaction; a REFER of another call is not ours.
    phone._on_message(parse_message(make_response(notify, 200).to_bytes()), service)
    await asyncio.sleep(0)
    assert all(task.done() for task in phone._tasks)
    other = refer_request(service_side(Dialog(**{**vars(dialog), "call_id": "c2@127.0.0.1"})), "sip:x@y")
    phone._on_message(parse_message(other.to_bytes()), service)
    assert isinstance(sent[-1], SipResponse) and sent[-1].status == 481
    phone.dialog = None
    await phone.hangup()


def test_the_noise_is_made_before_the_call_so_the_callers_packets_wait_for_nothing() -> None:
    from parley.scenarios import line as line_module

    line = CallerLine(Line(noise="street", snr_db=15), seed=4)
    line_module._noises.clear()
    line.prepare()  # in a thread, before the call (scenarios/runner.py)
    assert ("street", 0, 0) in line_module._noises
    made = line_module._noises[("street", 0, 0)]
    line.noisy(8000)  # on the event loop, as the caller starts: the same noise, not made again
    assert line_module._noises[("street", 0, 0)] is made
