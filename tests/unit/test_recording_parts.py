"""The parts of a call recording without a call: the timeline that lays the two sides on one clock, the
writer and its bounded queue, the folder store and its retention, the settings and the agent-file keys."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from parley import metrics
from parley.agent.agentfile import AgentFileError, load_agent_file
from parley.config import Settings, SettingsError
from parley.recording.call_recording import NOT_RECORDED, CallRecording
from parley.recording.formats import RATE, recording_format
from parley.recording.recordings import Recordings
from parley.recording.stores import FolderStore, S3Store
from parley.recording.timeline import AGENT, CALLER, LAG_S, StereoTimeline
from parley.recording.writer import RecordingWriter
from parley.settings_sources import validate
from tests.s3_server import BUCKET, aws_test_credentials, moto_s3


def tone(seconds: float, hz: float = 440.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * hz * t) * 8000).astype(np.int16)


def loud_at(channel: np.ndarray, rate: int = RATE, frame_s: float = 0.02) -> np.ndarray:
    """Per 20 ms frame: whether it holds sound."""
    n = int(rate * frame_s)
    frames = channel[: channel.size // n * n].reshape(-1, n).astype(np.float64)
    return np.sqrt((frames**2).mean(axis=1)) > 500


# the timeline


def test_each_side_lands_where_its_clock_says_with_silence_where_it_sent_nothing() -> None:
    timeline = StereoTimeline(RATE)
    timeline.add(AGENT, 100.0, tone(0.5))  # the greeting, from t = 0
    timeline.add(CALLER, 101.0, tone(0.3, 200))  # the caller speaks a second in, after sending nothing
    timeline.add(AGENT, 102.0, tone(0.4))  # the reply, 2 s in: the agent side was quiet in between
    stereo = timeline.take(None)
    assert stereo.shape == (int(2.4 * RATE), 2)
    caller, agent = loud_at(stereo[:, 0]), loud_at(stereo[:, 1])
    assert np.flatnonzero(caller).tolist() == list(range(50, 65))  # 1.0-1.3 s
    assert np.flatnonzero(agent).tolist() == list(range(25)) + list(range(100, 120))


def test_pieces_a_little_late_or_early_close_up_instead_of_leaving_gaps() -> None:
    timeline = StereoTimeline(RATE)
    frame = tone(0.02)
    for n in range(50):  # 20 ms frames stamped with up to 10 ms of jitter either way
        timeline.add(AGENT, 10.0 + 0.02 * n + (0.01 if n % 2 else -0.01), frame)
    stereo = timeline.take(None)
    assert stereo.shape[0] == 50 * frame.size  # nothing inserted, nothing lost
    assert loud_at(stereo[:, 1]).all()


def test_a_side_that_sends_nothing_is_filled_in_behind_the_clock() -> None:
    timeline = StereoTimeline(RATE)
    for n in range(100):  # two seconds of the agent, the caller silent (a phone that sends no packets)
        timeline.add(AGENT, 5.0 + 0.02 * n, tone(0.02))
    taken = timeline.take(5.0 + 2.0)
    assert taken.shape[0] == round((2.0 - LAG_S) * RATE)  # handed out, not held for the caller side
    assert not taken[:, 0].any()
    assert timeline.take(None).shape[0] == round(LAG_S * RATE)


# the writer


class Keeper:
    """What a recording reports, in order (the writer's and store's threads)."""

    def __init__(self) -> None:
        self.states: list[str] = []

    def __call__(self, recording: CallRecording) -> None:
        self.states.append(recording.state)


def recording(call_id: str, sink: RecordingWriter, report: Keeper, fmt: str = "ogg") -> CallRecording:
    chosen = recording_format(fmt)
    key = f"2026/01/02/{call_id}.{chosen.extension}"
    return CallRecording(call_id, key, key, chosen, "", 8000, sink, report)


def wait_for(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.02)


def dropped() -> float:
    return metrics.REGISTRY.get_sample_value("parley_recordings_total", {"outcome": "dropped"}) or 0.0


def test_a_full_queue_gives_the_recording_up_and_counts_it_never_waiting() -> None:
    saved: list[Path] = []
    writer = RecordingWriter(lambda r: Path("/nonexistent/x"), lambda r, p: saved.append(p), queue_size=3)
    report = Keeper()
    rec = recording("c-full", writer, report)
    before = dropped()
    started = time.perf_counter()
    for _ in range(10):  # the writer is not running: the fourth piece finds the queue full
        rec.agent(tone(0.02, rate=8000))
    assert time.perf_counter() - started < 0.05  # the taps never waited
    assert rec.state == "dropped" and report.states == ["dropped"]
    assert dropped() == before + 1
    rec.close()  # the call ends later: nothing more happens to it
    assert rec.describe()["state"] == "dropped" and not saved


def test_a_folder_that_cannot_be_written_fails_the_recording_alone(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    store, good_store = FolderStore(blocked), FolderStore(tmp_path / "good")
    paths = {"c-bad": store, "c-good": good_store}
    saved: list[Path] = []
    writer = RecordingWriter(
        lambda r: paths[r.call_id].spool_path(r.key), lambda r, p: (saved.append(p), r.settle("saved"))
    )
    writer.start()
    try:
        bad, good = Keeper(), Keeper()
        bad_rec, good_rec = recording("c-bad", writer, bad), recording("c-good", writer, good)
        for _ in range(25):
            bad_rec.agent(tone(0.02, rate=8000))
            good_rec.agent(tone(0.02, rate=8000))
            good_rec.caller(tone(0.02, 200))
        bad_rec.close()
        good_rec.close()
        wait_for(lambda: bad_rec.state == "failed" and good_rec.state == "saved")
    finally:
        writer.close()
    assert bad.states[-1:] == ["failed"] and good.states == ["saving", "saved"]
    assert [p.name for p in saved] == ["c-good.ogg.part"]
    audio, rate = soundfile.read(saved[0], dtype="int16")
    assert rate == RATE and audio.shape[1] == 2 and abs(audio.shape[0] / RATE - 0.5) < 0.1
    assert good_rec.describe()["duration_s"] == pytest.approx(0.5, abs=0.1)


def test_webrtc_audio_at_48_khz_lands_as_long_as_it_played(tmp_path: Path) -> None:
    saved: list[Path] = []
    writer = RecordingWriter(lambda r: tmp_path / f"{r.call_id}.part", lambda r, p: saved.append(p))
    writer.start()
    chosen = recording_format("ogg")
    rec = CallRecording("c-48k", "c-48k.ogg", "c-48k.ogg", chosen, "", 48000, writer, Keeper())
    pulled = tone(1.0, rate=48000)
    for start in range(0, pulled.size, 960):  # what aiortc pulls: 20 ms frames at 48 kHz
        rec.agent(pulled[start : start + 960])
    rec.close()
    writer.close()
    audio, rate = soundfile.read(saved[0], dtype="int16")
    assert rate == RATE and abs(audio.shape[0] / RATE - 1.0) < 0.03
    assert loud_at(audio[:, 1])[2:-2].all() and not loud_at(audio[:, 0]).any()


# the folder store


def test_the_folder_keeps_files_for_their_owner_and_purges_old_ones(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "recordings")
    old, new = "2026/01/01/c-old.ogg", "2026/03/01/c-new.ogg"
    for key in (old, new):
        spool = store.spool_path(key)
        spool.parent.mkdir(parents=True, exist_ok=True)
        spool.write_bytes(b"OggS")
        store.save(spool, key, "audio/ogg")
    assert store.location(new) == str(tmp_path / "recordings" / new)
    month_ago = time.time() - 30 * 86400
    os.utime(tmp_path / "recordings" / old, (month_ago, month_ago))
    assert store.purge(time.time() - 7 * 86400) == 1
    assert not (tmp_path / "recordings/2026/01").exists()  # its emptied folders went with it
    assert (tmp_path / "recordings" / new).exists()


def test_the_bucket_purge_deletes_old_objects_under_its_prefix_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    aws_test_credentials(monkeypatch)
    with moto_s3() as (endpoint, client):
        store = S3Store(BUCKET, "parley/", endpoint, tmp_path / "spool")
        for key in ("2026/01/01/c-1.ogg", "2026/01/02/c-2.ogg"):
            spool = store.spool_path(key)
            spool.parent.mkdir(exist_ok=True)
            spool.write_bytes(b"OggS")
            store.save(spool, key, "audio/ogg")
            assert not spool.exists()  # uploaded, then gone from the spool
        client.put_object(Bucket=BUCKET, Key="other/keep.ogg", Body=b"OggS")  # someone else's
        assert store.location("2026/01/01/c-1.ogg") == f"s3://{BUCKET}/parley/2026/01/01/c-1.ogg"
        assert store.purge(time.time() - 86400) == 0  # nothing is a day old yet
        assert store.purge(time.time() + 60) == 2  # as if they were: both go, the other prefix stays
        left = [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert left == ["other/keep.ogg"]


def test_recordings_are_written_readable_by_their_owner_only(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "recordings")
    writer = RecordingWriter(lambda r: store.spool_path(r.key), lambda r, p: None)
    writer.start()
    rec = recording("c-mode", writer, Keeper(), fmt="wav")
    rec.agent(tone(0.02, rate=8000))
    rec.close()
    writer.close()
    spool = store.spool_path(rec.key)
    assert spool.stat().st_mode & 0o777 == 0o600
    for folder in (spool.parent, tmp_path / "recordings"):
        assert folder.stat().st_mode & 0o777 == 0o700


# which calls are recorded


class Outbound:
    rate = 8000

    def __init__(self) -> None:
        self.taps: list[object] = []

    def tap(self, listen: object) -> None:
        self.taps.append(listen)


class AgentKeys:
    def __init__(self, record_audio: bool | None, notice: str = "") -> None:
        self.record_audio = record_audio
        self.recording_notice = notice


@pytest.mark.parametrize(
    ("service", "agent", "recorded", "fmt"),
    [
        ("off", None, False, None),
        ("off", True, True, "ogg"),  # an agent turns it on: Opus
        ("wav", None, True, "wav"),
        ("wav", False, False, None),  # and off
    ],
)
def test_an_agent_file_turns_recording_on_or_off_over_the_service(
    tmp_path: Path, service: str, agent: bool | None, recorded: bool, fmt: str | None
) -> None:
    recordings = Recordings(Settings(record_audio=service), tmp_path, lambda call_id, value: None)
    outbound = Outbound()
    rec = recordings.record("c-1", AgentKeys(agent, "This call is recorded."), outbound)
    try:
        if not recorded:
            assert rec is NOT_RECORDED and not outbound.taps
            assert rec.opening("Hello.") == "Hello." and rec.describe() is None
            return
        assert outbound.taps and rec.opening("Hello.") == "This call is recorded. Hello."
        described = rec.describe()
        assert described is not None and described["format"] == fmt and described["state"] == "recording"
        assert described["location"].startswith(str(tmp_path / "recordings" / time.strftime("%Y/")))
        assert described["location"].endswith(f"/c-1.{fmt}")
    finally:
        recordings.close()


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"record_audio": "mp3"}, "record_audio must be one of off, wav, ogg"),
        ({"recordings_s3_url": "https://bucket/x"}, "s3://BUCKET"),
        ({"recordings_s3_url": "s3://B/x"}, "s3://BUCKET"),
        ({"recordings_s3_endpoint": "http://minio:9000"}, "needs recordings_s3_url"),
        ({"recordings_s3_url": "s3://rec", "recordings_s3_endpoint": "minio:9000"}, "http(s)://"),
        ({"recordings_retention_days": -1}, "recordings_retention_days"),
    ],
)
def test_bad_recording_settings_are_refused_with_what_is_wrong(
    settings: dict[str, object], words: str
) -> None:
    with pytest.raises(SettingsError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate(Settings(**settings))  # type: ignore[arg-type]


def test_the_agent_file_keys_are_read_and_a_bad_one_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "desk.toml"
    path.write_text('system_prompt = "x"\nrecord_audio = true\nrecording_notice = "Recorded, {caller}."\n')
    agent = load_agent_file(path)
    assert agent.record_audio is True and agent.recording_notice == "Recorded, {caller}."
    assert load_agent_file(write(tmp_path, 'system_prompt = "x"\n')).record_audio is None
    with pytest.raises(AgentFileError, match=r"line 2: record_audio must be true or false"):
        load_agent_file(write(tmp_path, 'system_prompt = "x"\nrecord_audio = "yes"\n'))
    with pytest.raises(AgentFileError, match=r"line 3: recording_notice must be a string"):
        load_agent_file(write(tmp_path, 'system_prompt = "x"\n\nrecording_notice = 1\n'))


def write(folder: Path, text: str) -> Path:
    path = folder / "agent.toml"
    path.write_text(text)
    return path
