"""The recordings' store thread: keeps each finished file in the store, and deletes what is past the
retention, at start and then hourly.

Apart from the writer so that a slow store (an S3 endpoint timing out, retrying) holds up only the files
waiting for it, never the encoding of live calls. Its queue is bounded too: past it, a finished
recording fails rather than its file waiting on disk without end.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from parley.log import event
from parley.queue_worker import QueueWorker
from parley.recording.call_recording import CallRecording
from parley.recording.stores import RecordingStore

log = logging.getLogger(__name__)

QUEUE_FILES = 1000
PURGE_EVERY_S = 3600.0
IDLE_WAKE_S = 60.0  # the thread wakes this often without files, to purge on time


@dataclass(frozen=True)
class _File:
    recording: CallRecording
    path: Path


class RecordingSaver:
    def __init__(self, store: RecordingStore, retention_days: float) -> None:
        self.store = store
        self.retention_s = retention_days * 86400.0
        self._worker: QueueWorker[_File] = QueueWorker(
            "recordings-store",
            self._store,
            maxsize=QUEUE_FILES,
            wake_s=IDLE_WAKE_S,
            periodic=self._purge_if_due,
        )
        self._next_purge = 0.0

    def start(self) -> None:
        self._worker.start()

    def close(self, timeout: float) -> None:
        """Store what is queued for up to `timeout` seconds, then stop (blocking)."""
        if not self._worker.close(timeout):
            event(log, "recordings_not_stored", logging.WARNING, waiting=self._worker.pending())

    def save(self, recording: CallRecording, path: Path) -> None:
        """Queue a finished file (never blocks)."""
        if self._worker.offer(_File(recording, path)):
            return
        path.unlink(missing_ok=True)
        if recording.settle("failed"):
            event(
                log, "recording_failed", logging.WARNING, call_id=recording.call_id, error="store queue full"
            )

    def _store(self, item: _File) -> None:
        recording = item.recording
        try:
            self.store.save(item.path, recording.key, recording.format.content_type)
        except Exception as exc:
            item.path.unlink(missing_ok=True)
            if recording.settle("failed"):
                event(
                    log,
                    "recording_failed",
                    logging.WARNING,
                    call_id=recording.call_id,
                    error=f"{type(exc).__name__}: {exc}",
                )
            return
        recording.settle("saved")

    def _purge_if_due(self) -> None:
        now = time.time()
        if self.retention_s <= 0 or now < self._next_purge:
            return
        self._next_purge = now + PURGE_EVERY_S
        try:
            deleted = self.store.purge(now - self.retention_s)
        except Exception as exc:
            event(log, "recordings_purge_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            return
        if deleted:
            event(log, "recordings_purged", recordings=deleted, retention_days=self.retention_s / 86400)
