"""The queue thread behind the recordings and the call records: in order, never blocking its callers,
periodic work on time, and what was queued done before it stops."""

from __future__ import annotations

import threading
import time

from parley.queue_worker import QueueWorker


def test_items_are_done_in_order_and_what_was_queued_before_the_stop_is_done() -> None:
    done: list[int] = []
    ended = threading.Event()
    worker: QueueWorker[int] = QueueWorker("t", done.append, maxsize=100, wake_s=10, at_end=ended.set)
    worker.start()
    assert all(worker.offer(n) for n in range(50))
    assert worker.close(5.0)
    assert done == list(range(50)) and ended.is_set()


def test_a_full_queue_refuses_at_once() -> None:
    gate = threading.Event()
    worker: QueueWorker[int] = QueueWorker("t", lambda _: gate.wait(5), maxsize=2, wake_s=10)
    worker.start()
    worker.offer(0)  # taken by the thread, which waits on the gate
    time.sleep(0.1)
    assert worker.offer(1) and worker.offer(2)
    started = time.monotonic()
    assert not worker.offer(3)
    assert time.monotonic() - started < 0.1
    assert not worker.close(0.2)  # no room for the stop: it did not end
    gate.set()
    assert worker.close(5.0)


def test_periodic_work_runs_after_each_item_and_when_nothing_comes() -> None:
    ticks: list[float] = []
    worker: QueueWorker[int] = QueueWorker(
        "t", lambda _: None, maxsize=10, wake_s=0.05, periodic=lambda: ticks.append(time.monotonic())
    )
    worker.start()
    time.sleep(0.3)
    quiet_ticks = len(ticks)
    worker.offer(1)
    worker.stop()  # never blocks; close waits
    assert worker.close(5.0)
    assert quiet_ticks >= 3  # at the start, then every wake
    assert len(ticks) >= quiet_ticks + 1  # after the item


def test_start_twice_and_close_unstarted_are_harmless() -> None:
    worker: QueueWorker[int] = QueueWorker("t", lambda _: None, maxsize=1, wake_s=1)
    assert worker.close(0.1)  # never started: nothing to wait for
    worker.start()
    worker.start()
    assert worker.close(5.0)
