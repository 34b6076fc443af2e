"""Call recordings over real calls (our SIP caller, G.711 RTP at real-time pace, and the aiortc WebRTC
caller, against the app in-process with engine doubles): the caller asks, the agent answers, and the
recording holds the caller's question on its left channel and the agent's reply on its right, where and
as long as the caller heard them, cut where a barge-in cut the reply. Stored in a folder, or in S3 (moto's
server, a real S3 API on loopback); a store that fails, or a folder that cannot be written, costs the
recording, never the call."""

from __future__ import annotations

import asyncio
import io
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from parley.app import RUNTIME
from parley.bench.caller import Caller
from parley.bench.sip_caller import SipCaller
from parley.config import Settings
from tests.doubles import ScriptedLlm, loud, make_engines
from tests.robustness.test_defects import app_client
from tests.s3_server import aws_test_credentials, moto_s3
from tests.sip_app import SipApp, eventually
from tests.unit.test_agent_tools import SECRET, Backend

RATE = 16000
FRAME = RATE // 50  # 20 ms
QUESTION_S = 0.7
REPLY = "Sure, the weather is fine today. Anything else?"  # the test TTS: 0.2 s of tone a word
LONG_REPLY = " ".join(["and then the dragon flew over the hills"] * 4)


def bursts(channel: np.ndarray, gap_s: float = 0.15) -> list[tuple[float, float]]:
    """Stretches of sound in a channel (seconds from the recording's start), split at `gap_s` of quiet."""
    frames = channel[: channel.size // FRAME * FRAME].reshape(-1, FRAME).astype(np.float64)
    loud_frames = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > 800)
    runs: list[list[float]] = []
    for index in loud_frames:
        at = index * FRAME / RATE
        if runs and at - runs[-1][1] <= gap_s:
            runs[-1][1] = at + FRAME / RATE
        else:
            runs.append([at, at + FRAME / RATE])
    return [(start, end) for start, end in runs]


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0


def span(channel: np.ndarray, start: float, end: float) -> np.ndarray:
    return channel[int(start * RATE) : int(end * RATE)]


async def recorded(app: SipApp, call_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """The call's recording once it settled, as `GET /api/calls/<id>` says."""
    found: dict[str, Any] = {}

    async def settled() -> bool:
        response = await app.client.get(f"/api/calls/{call_id}", headers=app.auth)
        found.update((await response.json())["recording"] or {})
        return found.get("state") in ("saved", "failed", "dropped")

    await eventually(settled, timeout, "the recording settled")
    return found


def caller_of(app: SipApp) -> SipCaller:
    return SipCaller(f"http://{app.client.host}:{app.client.port}", app.target)


@pytest.fixture
async def started() -> AsyncIterator[list[SipApp]]:
    apps: list[SipApp] = []
    yield apps
    for app in apps:
        await app.close()


async def ask(phone: SipCaller, seconds: float = QUESTION_S) -> tuple[float, float]:
    """The caller speaks once the greeting has played; returns when its speech began and ended."""
    await phone.wait_for_event("agent_done", timeout=15, turn_id="greeting")
    return await phone.say(loud(seconds * 1000))


async def test_the_recording_holds_the_question_left_and_the_reply_right_as_the_caller_heard_them(
    started: list[SipApp], tmp_path: Path
) -> None:
    app = await SipApp.start(greeting="Hello there", record_audio="ogg", recordings_dir=str(tmp_path))
    started.append(app)
    async with caller_of(app) as phone:
        asked, finished = await ask(phone)
        reply_at = await phone.wait_for_audio(after=finished, timeout=15)
        silent_at = await phone.wait_for_silence(after=reply_at, hold_s=0.4, timeout=15)
        live = await (await app.client.get(f"/api/calls/{phone.call_id}", headers=app.auth)).json()
    described = await recorded(app, phone.call_id)

    # Where it is was known while the call was live, and the record has how it went.
    path = tmp_path / time.strftime("%Y/%m/%d", time.gmtime()) / f"{phone.call_id}.ogg"
    assert live["recording"]["location"] == str(path) and live["recording"]["state"] == "recording"
    assert described["state"] == "saved" and described["location"] == str(path)
    assert (described["format"], described["codec"], described["channels"]) == (
        "ogg",
        "opus",
        ["caller", "agent"],
    )
    audio, rate = soundfile.read(path, dtype="int16")
    assert rate == RATE and audio.ndim == 2 and audio.shape[1] == 2
    assert described["duration_s"] == pytest.approx(audio.shape[0] / RATE, abs=0.05)
    caller, agent = audio[:, 0], audio[:, 1]

    asked_in = bursts(caller)
    greeting, reply = bursts(agent)  # the greeting and the reply, nothing else
    assert len(asked_in) == 1, asked_in
    question = asked_in[0]
    assert question[1] - question[0] == pytest.approx(QUESTION_S, abs=0.1)
    # The caller speaks once it heard the greeting's end (within a 20 ms frame of the agent_done event).
    assert greeting[1] <= question[0] + 0.05 and question[1] < reply[0]
    # As the caller heard it: the reply came as long after the question began, and lasted as long.
    assert reply[0] - question[0] == pytest.approx(reply_at - asked, abs=0.15)
    assert reply[1] - reply[0] == pytest.approx(silent_at - reply_at, abs=0.15)
    assert reply[1] - reply[0] == pytest.approx(0.2 * len(REPLY.split()), abs=0.15)
    # Each side on its own channel (away from the edges, where the other side may just have stopped).
    assert rms(span(agent, question[0] + 0.06, question[1])) < 100
    assert rms(span(caller, reply[0], reply[1])) < 100


@pytest.mark.slow  # the default suite has this part over another transport
async def test_a_webrtc_call_is_recorded_the_same_way(tmp_path: Path) -> None:
    settings = Settings(
        sip="off",
        greeting="Hello there",
        ice_addresses=("127.0.0.1",),
        record_audio="ogg",
        recordings_dir=str(tmp_path),
    )
    client = await app_client(settings)
    try:
        async with Caller(str(client.make_url("")).rstrip("/")) as browser:
            await browser.wait_for_event("agent_done", timeout=15, turn_id="greeting")
            asked, finished = await browser.say(loud(QUESTION_S * 1000))
            reply_at = await browser.wait_for_audio(after=finished, timeout=15)
            silent_at = await browser.wait_for_silence(after=reply_at, hold_s=0.4, timeout=15)
            call_id = browser.call_id
        found: dict[str, Any] = {}

        async def settled() -> bool:
            found.update((await (await client.get(f"/api/calls/{call_id}")).json())["recording"])
            return found["state"] == "saved"

        await eventually(settled, 15, "the recording saved")
    finally:
        await client.close()
    audio, _ = soundfile.read(found["location"], dtype="int16")
    (question,) = bursts(audio[:, 0])
    reply = bursts(audio[:, 1])[-1]
    assert question[1] - question[0] == pytest.approx(QUESTION_S, abs=0.1)
    # The browser pulls 48 kHz frames: resampled, they land where and as long as it heard them.
    assert reply[0] - question[0] == pytest.approx(reply_at - asked, abs=0.15)
    assert reply[1] - reply[0] == pytest.approx(silent_at - reply_at, abs=0.15)


async def test_a_reply_cut_by_a_barge_in_ends_in_the_recording_where_it_was_cut(
    started: list[SipApp], tmp_path: Path
) -> None:
    engines = make_engines(llm=ScriptedLlm(reply=LONG_REPLY))
    app = await SipApp.start(
        engines, greeting="Hello there", record_audio="wav", recordings_dir=str(tmp_path)
    )
    started.append(app)
    async with caller_of(app) as phone:
        _, finished = await ask(phone)
        reply_at = await phone.wait_for_audio(after=finished, timeout=15)
        await asyncio.sleep(1.0)
        cut_by, _ = await phone.say(loud(800))
        cut = await phone.wait_for_event("agent_done", timeout=15, interrupted=True)
    described = await recorded(app, phone.call_id)
    assert described["state"] == "saved" and cut["turn_id"] != "greeting"
    audio, _ = soundfile.read(described["location"], dtype="int16")
    caller, agent = audio[:, 0], audio[:, 1]

    question, interruption = bursts(caller)[:2]
    reply = next(b for b in bursts(agent) if b[0] > question[1])
    # The caller cut in where it did at its end: as long after the reply began.
    assert interruption[0] - reply[0] == pytest.approx(cut_by - reply_at, abs=0.15)
    # The reply fell silent as the caller cut in (the agent pauses on speech, then the cut flushes it),
    # not at its full length.
    assert interruption[0] < reply[1] < interruption[0] + 0.5, (reply, interruption)
    assert reply[1] - reply[0] < 0.2 * len(LONG_REPLY.split()) / 2


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    aws_test_credentials(monkeypatch)
    with moto_s3() as server:
        yield server


@pytest.fixture
async def events() -> AsyncIterator[tuple[Backend, str]]:
    """A team's backend that takes the signed call events."""
    backend = Backend()
    url = await backend.start()
    yield backend, url
    assert backend.server is not None
    await backend.server.close()


async def test_a_recording_stored_in_s3_is_read_back_from_the_bucket(
    started: list[SipApp], s3: tuple[str, Any], events: tuple[Backend, str]
) -> None:
    endpoint, client = s3
    backend, events_url = events
    app = await SipApp.start(
        greeting="Hello there",
        record_audio="ogg",
        recordings_s3_url="s3://recordings/calls/",
        recordings_s3_endpoint=endpoint,
        events_url=f"{events_url}/events",
        webhook_secret=SECRET,
    )
    started.append(app)
    async with caller_of(app) as phone:
        _, finished = await ask(phone)
        await phone.wait_for_audio(after=finished, timeout=15)
    described = await recorded(app, phone.call_id)

    key = f"calls/{time.strftime('%Y/%m/%d', time.gmtime())}/{phone.call_id}.ogg"
    assert described["state"] == "saved" and described["location"] == f"s3://recordings/{key}"
    stored = client.get_object(Bucket="recordings", Key=key)
    assert stored["ContentType"] == "audio/ogg"
    audio, rate = soundfile.read(io.BytesIO(stored["Body"].read()), dtype="int16")
    assert rate == RATE and audio.shape[1] == 2
    assert described["duration_s"] == pytest.approx(audio.shape[0] / RATE, abs=0.05)
    assert len(bursts(audio[:, 0])) == 1 and len(bursts(audio[:, 1])) >= 2
    # The call's stored record says where it is too (GET /api/calls/<id> from any instance of a fleet).
    records = app.client.app[RUNTIME].records
    await eventually(lambda: _has_recording(records, phone.call_id), 10, "the record has the recording")

    # And the signed call.ended event had where it would be, before the upload was done.
    def ended() -> list[dict[str, Any]]:
        return [e for e in backend.events if e["type"] == "call.ended" and e["call_id"] == phone.call_id]

    await eventually(lambda: _true(bool(ended())), 10, "call.ended delivered")
    assert ended()[0]["data"]["recording"]["location"] == f"s3://recordings/{key}"
    assert ended()[0]["data"]["recording"]["state"] in ("saving", "saved")


async def _true(value: bool) -> bool:
    return value


async def _has_recording(records: Any, call_id: str) -> bool:
    record = await asyncio.to_thread(records.get, call_id)
    return bool(record and record.get("recording", {}).get("state") == "saved")


def refused_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("store", ["s3_refuses", "folder_unwritable"])
async def test_a_store_that_fails_costs_the_recording_and_never_the_call(
    started: list[SipApp], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    if store == "s3_refuses":
        aws_test_credentials(monkeypatch)
        where: dict[str, str] = {
            "recordings_s3_url": "s3://recordings",
            "recordings_s3_endpoint": f"http://127.0.0.1:{refused_port()}",
        }
    else:
        blocked = tmp_path / "recordings"
        blocked.write_text("a file where the folder should be")
        where = {"recordings_dir": str(blocked)}
    app = await SipApp.start(greeting="Hello there", record_audio="ogg", **where)
    started.append(app)
    failed_before = await app.counter("parley_recordings_total", outcome="failed")
    async with caller_of(app) as phone:
        _, finished = await ask(phone)
        reply_at = await phone.wait_for_audio(after=finished, timeout=15)  # the agent answered
        await phone.wait_for_silence(after=reply_at, timeout=15)
        turn = await phone.wait_for_event("agent_done", timeout=10, interrupted=False, text=REPLY)
        assert turn["turn_id"] != "greeting"
    described = await recorded(app, phone.call_id, timeout=60)  # the S3 client retries first
    assert described["state"] == "failed"
    assert await app.counter("parley_recordings_total", outcome="failed") == failed_before + 1
    response = await app.client.get(f"/api/calls/{phone.call_id}", headers=app.auth)
    assert (await response.json())["ended_reason"] == "hangup"


async def test_the_recording_notice_is_said_first_and_an_agent_may_turn_recording_off(
    started: list[SipApp], tmp_path: Path
) -> None:
    recorded_agent = tmp_path / "desk.toml"
    recorded_agent.write_text(
        'system_prompt = "x"\ngreeting = "Hello there"\nsip_users = ["*"]\nrecord_audio = true\n'
        'recording_notice = "This call is recorded."\n'
    )
    private = tmp_path / "private.toml"
    private.write_text(
        'system_prompt = "x"\ngreeting = "Hello there"\nsip_users = ["private"]\n'
        'record_audio = false\nrecording_notice = "Never said."\n'
    )
    app = await SipApp.start(
        agent=(str(private), str(recorded_agent)), record_audio="wav", recordings_dir=str(tmp_path / "r")
    )
    started.append(app)
    async with caller_of(app) as phone:
        greeting = await phone.wait_for_event("agent_done", timeout=15, turn_id="greeting")
    assert greeting["text"] == "This call is recorded. Hello there"
    assert (await recorded(app, phone.call_id))["format"] == "wav"

    private_phone = SipCaller(
        f"http://{app.client.host}:{app.client.port}", app.target.replace("agent@", "private@")
    )
    async with private_phone:
        greeting = await private_phone.wait_for_event("agent_done", timeout=15, turn_id="greeting")
        assert greeting["text"] == "Hello there"
    response = await app.client.get(f"/api/calls/{private_phone.call_id}", headers=app.auth)
    assert (await response.json())["recording"] is None
