"""A recordings' writer: a thread that turns the tapped audio of many calls into files.

A writer serves many calls, not one: a call already runs a thread per stage, and encoding a call's two
channels costs a small share of a core, so the process runs a writer for every so many calls it may hold
(recordings.py), and each writer's bounded queue bounds the memory its recordings may take. The taps
offer it pieces (never waiting); it lays each call's pieces on that call's timeline, resamples the
agent's to the recording's rate, and encodes what both sides have laid, about once a second. When a call
ends it finishes the file and hands it to the store (saver.py), which may be slow: the writer never waits
for it.

A recording whose file cannot be written (a full disk, a folder gone) fails alone: the writer drops it,
counts it, and goes on with the others. Nothing here ever reaches back into a call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile

from parley.audio import StreamResampler
from parley.log import event
from parley.queue_worker import QueueWorker
from parley.recording.call_recording import SETTLED, CallRecording, Piece
from parley.recording.formats import RATE
from parley.recording.stores import private_folder
from parley.recording.timeline import AGENT, StereoTimeline

log = logging.getLogger(__name__)

# Pieces (one 20 ms frame or caller packet each): ~3 s of 32 calls' audio, ~10 MB.
QUEUE_PIECES = 10_000
ENCODE_EVERY_S = 1.0  # a call's laid audio is encoded this often: few, larger writes
SWEEP_EVERY_S = 1.0  # dropped recordings are let go, and quiet ones checked, this often
# A recording that gets no audio for this long belongs to a call that ended without the registry hearing
# of it (a transport that failed while connecting): it is finished with what it has.
ABANDONED_AFTER_S = 600.0
STOP_TIMEOUT_S = 10.0

Spool = Callable[[CallRecording], Path]
Save = Callable[[CallRecording, Path], None]


@dataclass(eq=False)
class _Finish:
    recording: CallRecording


@dataclass(eq=False)
class _Open:
    """A recording being written."""

    recording: CallRecording
    path: Path
    sound: soundfile.SoundFile
    timeline: StereoTimeline = field(default_factory=lambda: StereoTimeline(RATE))
    resampler: StreamResampler | None = None
    encoded_at: float = field(default_factory=time.monotonic)
    heard_at: float = field(default_factory=time.monotonic)
    frames: int = 0


class RecordingWriter:
    def __init__(self, spool: Spool, save: Save, *, queue_size: int = QUEUE_PIECES, name: str = "") -> None:
        self._spool = spool  # where a recording's file is written before it is stored
        self._save = save  # hands a finished file to the store
        self._open: dict[int, _Open] = {}
        self._worker: QueueWorker[Piece | _Finish] = QueueWorker(
            name or "recordings-writer",
            self._take,
            maxsize=queue_size,
            wake_s=SWEEP_EVERY_S,
            periodic=self._sweep_if_due,
            at_end=self._finish_all,
        )
        self._swept_at = 0.0

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        """Ask the thread to finish every recording still open and end, after what is queued (never
        blocks; `close` waits for it)."""
        self._worker.stop()

    def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Finish every recording still open and stop (blocking; waits up to `timeout`)."""
        self._worker.close(timeout)

    # the taps' side (the transports' threads; never blocks)

    def offer(self, piece: Piece) -> bool:
        return self._worker.offer(piece)

    def finish(self, recording: CallRecording) -> bool:
        return self._worker.offer(_Finish(recording))

    # the writer's thread

    def _take(self, item: Piece | _Finish) -> None:
        try:
            if isinstance(item, _Finish):
                finishing = self._open.get(id(item.recording))
                if finishing is not None:
                    self._finish(finishing)
            else:
                self._add(item)
        except Exception as exc:
            self._fail(item.recording, exc)

    def _finish_all(self) -> None:
        for open_ in list(self._open.values()):
            self._finish(open_)

    def _sweep_if_due(self) -> None:
        if time.monotonic() - self._swept_at >= SWEEP_EVERY_S:
            self._sweep()

    def _add(self, piece: Piece) -> None:
        recording = piece.recording
        open_ = self._open.get(id(recording))
        if open_ is None:
            if recording.state in SETTLED or recording.file_written:
                return  # given up, or a piece tapped as the call ended, queued behind its finish
            open_ = self._begin(recording)
        pcm = piece.pcm
        if piece.side == AGENT and piece.rate != RATE:
            if open_.resampler is None:
                open_.resampler = StreamResampler(piece.rate, RATE)
            pcm = open_.resampler.process(pcm)
        now = time.monotonic()
        open_.timeline.add(piece.side, piece.start, pcm)
        open_.heard_at = now
        if now - open_.encoded_at >= ENCODE_EVERY_S:
            self._encode(open_, open_.timeline.take(now))

    def _begin(self, recording: CallRecording) -> _Open:
        path = self._spool(recording)
        private_folder(path.parent)
        # Created readable by its owner only, before libsndfile opens it (which keeps the mode).
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        fmt = recording.format
        try:
            sound = soundfile.SoundFile(
                path, "w", samplerate=RATE, channels=2, format=fmt.container, subtype=fmt.subtype
            )
        except Exception:
            path.unlink(missing_ok=True)
            raise
        open_ = _Open(recording, path, sound)
        self._open[id(recording)] = open_
        return open_

    def _encode(self, open_: _Open, stereo: np.ndarray) -> None:
        if stereo.size:
            open_.sound.write(stereo)
            open_.frames += stereo.shape[0]
        open_.encoded_at = time.monotonic()

    def _finish(self, open_: _Open) -> None:
        recording = open_.recording
        del self._open[id(recording)]
        if recording.state in SETTLED:  # dropped as the call ended: a file with a hole is not kept
            self._discard(open_)
            return
        try:
            if open_.resampler is not None:  # what its filter still holds
                tail = open_.resampler.process(np.zeros(0, dtype=np.int16), last=True)
                open_.timeline.append(AGENT, tail)
            self._encode(open_, open_.timeline.take(None))
            open_.sound.close()
        except Exception as exc:
            self._fail(recording, exc, open_)
            return
        recording.written(open_.frames / RATE)
        self._save(recording, open_.path)

    def _fail(self, recording: CallRecording, exc: BaseException, open_: _Open | None = None) -> None:
        open_ = open_ or self._open.pop(id(recording), None)
        self._discard(open_)
        if recording.settle("failed"):
            event(
                log,
                "recording_failed",
                logging.WARNING,
                call_id=recording.call_id,
                error=f"{type(exc).__name__}: {exc}",
            )

    def _sweep(self) -> None:
        """Let go of recordings given up (their taps stopped), and finish those whose call went quiet
        for good."""
        now = time.monotonic()
        self._swept_at = now
        for open_ in list(self._open.values()):
            if open_.recording.state == "dropped":
                del self._open[id(open_.recording)]
                self._discard(open_)
            elif now - open_.heard_at > ABANDONED_AFTER_S:
                open_.recording.close()
                self._finish(open_)

    @staticmethod
    def _discard(open_: _Open | None) -> None:
        if open_ is None:
            return
        with contextlib.suppress(Exception):
            open_.sound.close()
        with contextlib.suppress(OSError):
            open_.path.unlink()
