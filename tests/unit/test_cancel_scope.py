"""CancelScope: generations bumped by cancel, and the discard that follows a cancel."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.pipeline import cancel as cancel_module
from parley.pipeline.cancel import CancelScope


def test_generation_starts_at_zero_and_nothing_is_discarded() -> None:
    scope = CancelScope()

    assert scope.generation == 0
    assert not scope.discarding
    assert not scope.is_stale(0)
    assert not scope.should_drop(0)
    assert not scope.should_drop(None)


def test_cancel_bumps_generation_and_starts_discarding() -> None:
    scope = CancelScope()

    scope.cancel()

    assert scope.generation == 1
    assert scope.discarding
    assert scope.is_stale(0)
    assert not scope.is_stale(1)


def test_every_cancel_moves_the_generation_on() -> None:
    scope = CancelScope()

    for expected in range(1, 6):
        scope.cancel()
        assert scope.generation == expected


def test_generation_wraps_at_the_modulus(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2**32 cancels would take too long; a small modulus exercises the same wrap.
    monkeypatch.setattr(cancel_module, "GENERATION_MODULUS", 3)
    scope = CancelScope()

    scope.cancel()
    scope.cancel()
    scope.cancel()

    assert scope.generation == 0
    assert scope.is_stale(2)
    assert not scope.is_stale(0)


def test_generation_modulus_is_two_to_the_32() -> None:
    assert cancel_module.GENERATION_MODULUS == 2**32


def test_is_stale_is_any_other_generation() -> None:
    scope = CancelScope()
    scope.cancel()
    scope.cancel()

    assert scope.is_stale(0)
    assert scope.is_stale(1)
    assert not scope.is_stale(2)
    assert scope.is_stale(3)


def test_response_done_without_generation_ends_discard() -> None:
    scope = CancelScope()
    scope.cancel()

    scope.response_done()

    assert not scope.discarding
    assert scope.generation == 1


def test_response_done_for_the_discarded_generation_ends_discard() -> None:
    scope = CancelScope()
    scope.cancel()

    scope.response_done(0)

    assert not scope.discarding


def test_response_done_for_the_current_generation_ends_discard() -> None:
    scope = CancelScope()
    scope.cancel()

    scope.response_done(1)

    assert not scope.discarding


def test_late_done_from_an_older_response_does_not_end_a_newer_discard() -> None:
    scope = CancelScope()
    scope.cancel()  # discards 0
    scope.cancel()  # discards 1, current 2

    scope.response_done(0)

    assert scope.discarding
    scope.response_done(1)
    assert not scope.discarding


def test_new_response_ends_discard() -> None:
    scope = CancelScope()
    scope.cancel()

    scope.new_response()

    assert not scope.discarding
    assert scope.generation == 1


def test_reset_clears_discard_and_keeps_the_counter() -> None:
    scope = CancelScope()
    scope.cancel()
    scope.cancel()

    scope.reset()

    assert not scope.discarding
    assert scope.generation == 2
    scope.cancel()
    assert scope.generation == 3


def test_stale_output_is_dropped() -> None:
    scope = CancelScope()
    scope.cancel()
    scope.new_response()

    assert scope.should_drop(0)
    assert not scope.should_drop(1)


def test_while_discarding_only_current_generation_output_passes() -> None:
    scope = CancelScope()
    scope.cancel()

    assert scope.should_drop(0)
    assert not scope.should_drop(1)
    assert scope.should_drop(2)


def test_untagged_output_is_dropped_only_while_discarding() -> None:
    scope = CancelScope()
    scope.cancel()

    assert scope.should_drop(None)
    scope.response_done()
    assert not scope.should_drop(None)


@given(st.lists(st.sampled_from(["cancel", "done", "done_old", "done_current", "new", "reset"]), max_size=40))
def test_generation_counts_cancels_and_work_from_before_a_cancel_is_always_dropped(ops: list[str]) -> None:
    scope = CancelScope()
    cancels = 0
    for op in ops:
        started = scope.generation
        if op == "cancel":
            scope.cancel()
            cancels += 1
            assert scope.discarding
            assert scope.should_drop(started)
            assert scope.should_drop(None)
        elif op == "done":
            scope.response_done()
            assert not scope.discarding
        elif op == "done_old":
            # Two back is never the discarded generation (that is always the one just before).
            before = scope.discarding
            scope.response_done(scope.generation - 2)
            assert scope.discarding == before
        elif op == "done_current":
            scope.response_done(scope.generation)
            assert not scope.discarding
        elif op == "new":
            scope.new_response()
            assert not scope.discarding
        else:
            scope.reset()
            assert not scope.discarding
        assert scope.generation == cancels
        assert not scope.should_drop(scope.generation)
        assert scope.should_drop(scope.generation + 1)


def test_readers_never_pass_output_of_a_cancelled_generation() -> None:
    scope = CancelScope()
    stop = threading.Event()
    failures: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            gen = scope.generation
            # Whatever a reader saw as current, an older generation is dropped.
            if gen > 0 and not scope.should_drop(gen - 1):
                failures.append(f"generation {gen - 1} passed after {gen}")

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for thread in readers:
        thread.start()
    for _ in range(5000):
        scope.cancel()
        scope.response_done(scope.generation)
    stop.set()
    for thread in readers:
        thread.join(timeout=5)

    assert failures == []
    assert scope.generation == 5000
