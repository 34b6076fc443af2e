"""The count of engines computing on the CPU, which the LLM asks before each step."""

from __future__ import annotations

import threading

import pytest

from parley.engines.compute_load import ComputeLoad


def test_it_is_busy_while_any_engine_runs_and_free_once_all_have_ended() -> None:
    load = ComputeLoad()
    assert not load.busy()
    with load.running():
        with load.running():
            assert load.busy()
        assert load.busy()  # one still runs
    assert not load.busy()


def test_a_run_that_fails_still_ends() -> None:
    load = ComputeLoad()
    with pytest.raises(RuntimeError), load.running():
        raise RuntimeError("the model failed")
    assert not load.busy()


def test_runs_on_many_threads_are_all_counted() -> None:
    load = ComputeLoad()

    def runs() -> None:
        for _ in range(2000):
            with load.running():
                pass

    threads = [threading.Thread(target=runs) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not load.busy()


def test_work_on_a_gpu_does_not_count() -> None:
    load = ComputeLoad()
    with load.running("cuda"):
        assert not load.busy()
    assert not load.busy()
