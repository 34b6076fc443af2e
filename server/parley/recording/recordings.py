"""Call recordings for the process: which calls are recorded, and the writers and the store that keep them.

`Recordings.record` is how a call gets its `Recording` (call_recording.py) when its agent is recorded
(`--record-audio`, or the agent file's `record_audio` either way): the recording taps the call's
Outbound here, the call taps its caller's audio. The registry tells it when a call has ended, and the
recording is closed: its file is finished by a writer (writer.py) and kept by the store (saver.py),
off every call's path. The calls take turns over the writers, one for every CALLS_PER_WRITER calls the
process may hold: a writer is one thread, so one core at most, and Opus takes most of its time. Where a
recording will be is decided when the call starts, so the call's record and its `call.ended` event say
so at once; the record is updated when it has been stored (or failed).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parley.log import event
from parley.recording.call_recording import NOT_RECORDED, CallRecording, Recording
from parley.recording.formats import recording_format
from parley.recording.saver import RecordingSaver
from parley.recording.stores import FolderStore, RecordingStore, S3Store, utc_day_path
from parley.recording.writer import QUEUE_PIECES, STOP_TIMEOUT_S, RecordingWriter
from parley.recording_settings import RecordingSettings, parse_s3_url

log = logging.getLogger(__name__)

# Encoding a call in Opus took 1.3-1.5 % of a core (scripts/recording_cost.py, README): 32 calls keep a
# writer under half busy, with room for a loaded machine.
CALLS_PER_WRITER = 32

Keep = Callable[[str, dict[str, Any]], None]


class RecordedAgent(Protocol):
    """What of an agent decides its calls' recordings."""

    @property
    def record_audio(self) -> bool | None: ...

    @property
    def recording_notice(self) -> str: ...


class Tappable(Protocol):
    """The call's Outbound, as its recording taps it."""

    @property
    def rate(self) -> int: ...

    def tap(self, listen: Callable[[np.ndarray], None]) -> None: ...


class RecordedCall(Protocol):
    @property
    def recording(self) -> Recording: ...


class Recorder(Protocol):
    """What a call is built with to record itself."""

    def record(self, call_id: str, agent: RecordedAgent, outbound: Tappable) -> Recording: ...


def make_store(settings: RecordingSettings, data_dir: Path) -> RecordingStore:
    if settings.recordings_s3_url:
        bucket, prefix = parse_s3_url(settings.recordings_s3_url)
        return S3Store(bucket, prefix, settings.recordings_s3_endpoint, data_dir / "recordings-spool")
    return FolderStore(settings.resolved_recordings_dir(data_dir))


class Recordings:
    def __init__(
        self,
        settings: RecordingSettings,
        data_dir: Path,
        keep: Keep,
        *,
        max_calls: int = 1,
        queue_size: int = QUEUE_PIECES,
    ) -> None:
        self.default = settings.record_audio
        self.store = make_store(settings, data_dir)
        self._keep = keep  # into the call's record: where its recording is, how it went
        self.saver = RecordingSaver(self.store, settings.recordings_retention_days)
        self.writers = [
            RecordingWriter(
                self._spool, self.saver.save, queue_size=queue_size, name=f"recordings-writer-{n}"
            )
            for n in range(math.ceil(max_calls / CALLS_PER_WRITER))
        ]
        self._turns = itertools.cycle(self.writers)

    def start(self) -> None:
        """Start the store's thread now when there is a retention to keep (the purge runs at start); the
        writer starts with the first recorded call."""
        if self.saver.retention_s > 0:
            self.saver.start()

    def close(self) -> None:
        """Finish and store what is being recorded (blocking, bounded)."""
        for writer in self.writers:  # each ends its queue first: they finish side by side
            writer.stop()
        for writer in self.writers:
            writer.close(STOP_TIMEOUT_S)
        self.saver.close(STOP_TIMEOUT_S)

    def record(self, call_id: str, agent: RecordedAgent, outbound: Tappable) -> Recording:
        """The recording of a new call: NOT_RECORDED unless its agent is recorded."""
        recorded = agent.record_audio if agent.record_audio is not None else self.default != "off"
        if not recorded:
            return NOT_RECORDED
        writer = next(self._turns)
        self.saver.start()
        writer.start()
        fmt = recording_format("ogg" if self.default == "off" else self.default)
        key = f"{utc_day_path(time.time())}/{call_id}.{fmt.extension}"
        recording = CallRecording(
            call_id,
            key,
            self.store.location(key),
            fmt,
            agent.recording_notice,
            outbound.rate,
            writer,
            self._report,
        )
        outbound.tap(recording.agent)
        return recording

    # the registry's observer (the event loop; never blocks)

    def call_added(self, call: RecordedCall) -> None:
        pass

    def call_ended(self, call: RecordedCall) -> None:
        call.recording.close()

    # internals

    def _spool(self, recording: CallRecording) -> Path:
        return self.store.spool_path(recording.key)

    def _report(self, recording: CallRecording) -> None:
        """A recording moved on (any thread): tell its call's record."""
        state = recording.state
        if state == "empty":
            return
        if state in ("saved", "dropped"):  # a failure is logged where it happened, with its error
            level = logging.INFO if state == "saved" else logging.WARNING
            event(log, f"recording_{state}", level, call_id=recording.call_id, location=recording.location)
        self._keep(recording.call_id, recording.describe())
