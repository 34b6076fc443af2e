"""The VAD worker: every call's VAD on one thread, the model batched across calls, each lane in order."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from parley.call import Call
from parley.config import Settings
from parley.engines.vad import CHUNK_SAMPLES, SileroVad, load_vad
from parley.engines.vad_batching import LaneEnded, VadWorker
from parley.pipeline.messages import InboundFrame, KeypadDigit
from parley.pipeline.vad_stage import VadInbox
from tests.doubles import LoudnessVad, LoudnessVadStream, ScriptedStt, loud, make_engines, quiet
from tests.unit.test_call import Line
from tests.unit.test_engines_speech import needs_espeak, speech


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class CountingVad(LoudnessVad):
    """Records each batch's size; `hold` keeps the first batch until it is set."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.fail_next = False

    def probabilities(self, pairs: Sequence[tuple[Any, np.ndarray]]) -> list[float]:
        self.hold.wait(5)
        self.sizes.append(len(pairs))
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("model failed")
        return super().probabilities(pairs)


class Lane:
    """A lane of chunks given by the test: what the worker asks of a call's VAD stage."""

    def __init__(self, name: str, worker: VadWorker) -> None:
        self.name = name
        self.worker = worker
        self.stream = LoudnessVadStream()
        self.chunks: deque[np.ndarray] = deque()
        self.heard_levels: list[float] = []
        self.errors: list[BaseException] = []
        self.idles: list[float] = []
        self.ended = False
        self.done = threading.Event()
        self.raise_on_heard = False
        self.last_put = time.monotonic()

    def give(self, *levels: float) -> None:
        self.chunks.extend(np.full(CHUNK_SAMPLES, level, dtype=np.int16) for level in levels)
        self.last_put = time.monotonic()
        self.worker.ready(self)

    def end(self) -> None:
        self.ended = True
        self.worker.ready(self)

    def next_chunk(self) -> np.ndarray | None:
        if self.ended:
            raise LaneEnded(self.name)
        if not self.chunks:
            return None
        self._current = self.chunks.popleft()
        return self._current

    def heard(self, probability: float) -> None:
        if self.raise_on_heard:
            raise ValueError("lane bug")
        self.heard_levels.append(float(self._current[0]) if probability else -float(self._current[0]))

    def failed(self, error: BaseException) -> None:
        self.errors.append(error)

    def last_item_at(self) -> float:
        return self.last_put

    def idle(self, now: float) -> None:
        self.idles.append(now)

    def finished(self) -> None:
        self.done.set()


@pytest.fixture
def engine() -> CountingVad:
    return CountingVad()


@pytest.fixture
def worker(engine: CountingVad) -> Any:
    worker = VadWorker(engine)
    yield worker
    worker.close()


def test_lanes_ready_together_share_one_model_run_and_each_hears_its_own_chunks_in_order(
    engine: CountingVad, worker: VadWorker
) -> None:
    a, b = Lane("a", worker), Lane("b", worker)
    engine.hold.clear()  # the first batch waits while b joins
    worker.add(a)
    a.give(1000, 1001, 1002)
    wait_for(lambda: worker.thread is not None)
    worker.add(b)
    b.give(2000, 2001, 2002)
    engine.hold.set()
    wait_for(lambda: len(a.heard_levels) == 3 and len(b.heard_levels) == 3)
    assert a.heard_levels == [1000, 1001, 1002] and b.heard_levels == [2000, 2001, 2002]
    assert 2 in engine.sizes and sum(engine.sizes) == 6, engine.sizes
    assert worker.batches < worker.chunks == 6


def test_a_failing_lane_or_model_run_costs_only_its_own_chunks(
    engine: CountingVad, worker: VadWorker
) -> None:
    good, bad = Lane("good", worker), Lane("bad", worker)
    bad.raise_on_heard = True
    worker.add(good)
    worker.add(bad)
    good.give(1000)
    bad.give(3000)
    wait_for(lambda: good.heard_levels == [1000] and len(bad.errors) == 1)
    engine.fail_next = True
    good.give(1001)
    wait_for(lambda: len(good.errors) == 1)
    good.give(1002)
    wait_for(lambda: good.heard_levels == [1000, 1002])
    assert isinstance(bad.errors[0], ValueError) and isinstance(good.errors[0], RuntimeError)


def test_a_lane_without_items_is_told_it_is_idle(worker: VadWorker) -> None:
    lane = Lane("quiet", worker)
    worker.add(lane)
    wait_for(lambda: len(lane.idles) >= 2, timeout=2.0)
    assert lane.idles[1] - lane.idles[0] >= 0.09
    lane.give(1000)  # audio again: heard at once, not after an idle period
    wait_for(lambda: lane.heard_levels == [1000], timeout=0.5)


def test_the_thread_starts_with_the_first_lane_and_ends_with_the_last(worker: VadWorker) -> None:
    assert worker.thread is None
    a, b = Lane("a", worker), Lane("b", worker)
    worker.add(a)
    worker.add(b)
    first = worker.thread
    assert first is not None and first.is_alive()
    a.end()
    wait_for(a.done.is_set)
    assert worker.thread is first and worker.lanes() == 1
    b.end()
    wait_for(b.done.is_set)
    worker.settle(2.0)
    assert not first.is_alive() and worker.thread is None
    c = Lane("c", worker)
    worker.add(c)
    c.give(1000)
    wait_for(lambda: c.heard_levels == [1000])
    worker.close()
    assert c.done.is_set() and worker.thread is None
    with pytest.raises(RuntimeError):
        worker.add(Lane("late", worker))


def test_the_inbox_wakes_the_worker_once_a_whole_chunk_waits() -> None:
    inbox = VadInbox(CHUNK_SAMPLES)
    wakes: list[int] = []
    inbox.wake = lambda: wakes.append(len(inbox._items))
    frame = np.zeros(320, dtype=np.int16)
    inbox.put(InboundFrame(frame))
    assert wakes == []  # 320 of 512 samples
    inbox.put(InboundFrame(frame))
    assert wakes == [2]
    inbox.take_all()
    inbox.consumed = 512  # the worker cut one chunk; 128 samples are left over
    inbox.put(InboundFrame(frame))
    assert wakes == [2]  # 448
    inbox.put(InboundFrame(frame))
    assert wakes == [2, 2]  # 768
    inbox.put(KeypadDigit("5"))
    assert wakes == [2, 2, 3]  # a keypad digit does not wait for audio
    inbox.close()
    assert len(wakes) == 4


def test_two_calls_share_one_vad_thread_and_each_hears_its_own_caller() -> None:
    settings = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    engines = make_engines(stt=ScriptedStt())
    calls = [Call(f"c-vad{i}", "test", settings, engines, outbound_rate=16000) for i in range(2)]
    lines = [Line(call) for call in calls]
    try:
        for call, line in zip(calls, lines, strict=True):
            call.start()
            line.start()
        assert sum(t.name == "c-vad-worker" for t in threading.enumerate()) == 1
        # Only the first caller speaks: the second call must not take the first one's speech.
        talker = threading.Thread(target=lines[0].say, args=(np.concatenate([loud(800), quiet(600)]),))
        listener = threading.Thread(target=lines[1].say, args=(quiet(1400),))
        talker.start()
        listener.start()
        talker.join()
        listener.join()
        lines[0].wait(lambda: lines[0].event("user_transcript") is not None)
        assert lines[1].event("user_transcript") is None
        assert engines.vad_worker.chunks >= 2 * 40  # both calls' audio went through the worker
    finally:
        for call, line in zip(calls, lines, strict=True):
            line.stop()
            call.end()
            assert call.join(5.0)
        engines.close()
    assert all(t.name != "c-vad-worker" for t in threading.enumerate())


@pytest.fixture(scope="module")
def silero() -> SileroVad:
    return load_vad(Settings())


@needs_espeak
def test_silero_batched_gives_each_stream_what_it_gets_alone(silero: SileroVad, tmp_path: Any) -> None:
    words = speech("is the pharmacy open on sunday", tmp_path)
    pad = np.zeros(8000, dtype=np.int16)
    rng = np.random.default_rng(7)
    clips = [
        np.concatenate((pad, words, pad)),
        np.concatenate((pad, pad, words)),
        (rng.normal(0, 300, words.size + 16000)).astype(np.int16),
    ]
    count = min(clip.size for clip in clips) // CHUNK_SAMPLES
    alone = []
    for clip in clips:
        stream = silero.new_stream()
        alone.append(
            [stream.probability(clip[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES]) for i in range(count)]
        )
    streams = [silero.new_stream() for _ in clips]
    together: list[list[float]] = [[] for _ in clips]
    for i in range(count):
        pairs = [
            (s, clip[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES])
            for s, clip in zip(streams, clips, strict=True)
        ]
        for heard, p in zip(together, silero.probabilities(pairs), strict=True):
            heard.append(p)
    assert together == alone
    assert max(alone[0]) > 0.8 and max(alone[2]) < 0.5  # the speech was heard, the noise was not
    with pytest.raises(ValueError):
        silero.probabilities([(LoudnessVadStream(), clips[0][:CHUNK_SAMPLES])])
