"""SpeculativeTurnTracker: revisions, reopen candidates, grace, commits, bounded memory, and races."""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from parley.pipeline import turns as turns_module
from parley.pipeline.turns import PENDING_REOPEN_WAIT_TIMEOUT_S, SpeculativeTurnTracker

T = "call-1:turn-1"
JOIN_S = 3.0


def _newest(tracker: SpeculativeTurnTracker, turn_id: str, limit: int = 64) -> int | None:
    """The newest revision the tracker holds for `turn_id`, or None when it does not know the turn."""
    if tracker.is_latest(turn_id, -1):  # revisions are never negative, so only an unknown turn says yes
        return None
    return next(r for r in range(limit) if tracker.is_latest(turn_id, r))


def _pending_bases(tracker: SpeculativeTurnTracker, turn_id: str, limit: int = 64) -> list[int]:
    return [r for r in range(limit) if tracker.has_pending_reopen(turn_id, r)]


class _Call:
    """Run a blocking tracker call on a thread; keep its result and how long it blocked."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.result: Any = None
        self.elapsed = 0.0
        self._thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        started = time.monotonic()
        self.result = fn(*args)
        self.elapsed = time.monotonic() - started

    def blocked(self, for_s: float = 0.05) -> bool:
        self._thread.join(timeout=for_s)
        return self._thread.is_alive()

    def join(self) -> Any:
        self._thread.join(timeout=JOIN_S)
        assert not self._thread.is_alive(), "the call never returned"
        return self.result


# -- revisions -------------------------------------------------------------------------------------------


def test_unknown_turn_is_latest_for_any_revision() -> None:
    tracker = SpeculativeTurnTracker()

    assert tracker.is_latest(T, 0)
    assert tracker.is_latest(T, 7)


def test_observe_records_the_newest_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 2)

    assert tracker.is_latest(T, 2)
    assert not tracker.is_latest(T, 1)


def test_revision_above_the_recorded_one_is_not_latest() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 2)

    assert not tracker.is_latest(T, 3)


def test_observe_never_lowers_the_newest_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 3)
    tracker.observe(T, 1)

    assert _newest(tracker, T) == 3


def test_turns_are_independent() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe("a", 2)
    tracker.observe("b", 0)

    assert tracker.is_latest("a", 2)
    assert tracker.is_latest("b", 0)
    assert tracker.is_latest("c", 5)


# -- "not speculative" -----------------------------------------------------------------------------------

NOT_SPECULATIVE = [(None, 0), (T, None), (None, None)]


@pytest.mark.parametrize(("turn_id", "revision"), NOT_SPECULATIVE)
def test_not_speculative_work_is_always_latest_and_committable(
    turn_id: str | None, revision: int | None
) -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 5)
    tracker.begin_reopen_candidate(T, 5)
    tracker.start_reopen_grace(T, 5, 10.0)

    assert tracker.is_latest(turn_id, revision) is True
    assert tracker.is_latest_after_pending_reopen(turn_id, revision) is True
    assert tracker.try_is_latest_after_pending_reopen(turn_id, revision) is True
    assert tracker.is_latest_after_reopen_grace(turn_id, revision) is True
    assert tracker.try_is_latest_after_reopen_grace(turn_id, revision) is True
    assert tracker.is_latest_after_stability_window(turn_id, revision, 10.0) is True
    assert tracker.commit_if_latest_after_pending_reopen(turn_id, revision) is True
    assert tracker.try_commit_if_latest_after_pending_reopen(turn_id, revision) is True
    assert tracker.commit_if_latest_after_reopen_grace(turn_id, revision) is True
    assert tracker.try_commit_if_latest_after_reopen_grace(turn_id, revision) is True


@pytest.mark.parametrize(("turn_id", "revision"), NOT_SPECULATIVE)
def test_not_speculative_work_has_nothing_pending_and_cannot_reopen(
    turn_id: str | None, revision: int | None
) -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)
    tracker.start_reopen_grace(T, 0, 10.0)

    assert tracker.has_pending_reopen(turn_id, revision) is False
    assert tracker.has_pending_reopen_or_grace(turn_id, revision) is False
    assert tracker.begin_reopen_candidate(turn_id, revision) is None
    assert tracker.confirm_reopen_candidate(turn_id, revision, 1) is False
    assert tracker.confirm_reopen_candidate(turn_id, 0, revision) is False


@pytest.mark.parametrize(("turn_id", "revision"), NOT_SPECULATIVE)
def test_not_speculative_work_changes_nothing(turn_id: str | None, revision: int | None) -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)

    tracker.observe(turn_id, revision)
    tracker.commit(turn_id, revision)
    tracker.start_reopen_grace(turn_id, revision, 10.0)
    tracker.wait_for_pending_reopen(turn_id, revision)
    if turn_id is None:
        tracker.cancel_reopen_candidate(turn_id, candidate)

    assert _newest(tracker, T) == 0
    assert not tracker.is_committed(T)
    assert tracker.has_pending_reopen(T, 0)
    assert not tracker.has_pending_reopen_or_grace(T, 1)


def test_is_committed_without_turn_is_false() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.commit(T, 0)

    assert tracker.is_committed(None) is False
    assert tracker.is_committed(None, 0) is False


# -- reopen candidates -----------------------------------------------------------------------------------


def test_begin_proposes_the_next_revision_without_changing_the_newest() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)

    assert tracker.begin_reopen_candidate(T, 0) == 1
    assert tracker.has_pending_reopen(T, 0)
    assert not tracker.has_pending_reopen(T, 1)
    assert tracker.is_latest(T, 0)
    assert not tracker.is_latest(T, 1)


def test_begin_on_the_same_base_returns_the_existing_candidate() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 4)

    assert tracker.begin_reopen_candidate(T, 4) == 5
    assert tracker.begin_reopen_candidate(T, 4) == 5
    assert _pending_bases(tracker, T) == [4]


def test_begin_is_refused_for_a_committed_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.commit(T, 0)

    assert tracker.begin_reopen_candidate(T, 0) is None
    assert not tracker.has_pending_reopen(T, 0)


def test_begin_is_refused_when_committed_above_the_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 1)
    tracker.commit(T, 1)

    assert tracker.begin_reopen_candidate(T, 0) is None
    assert tracker.begin_reopen_candidate(T, 1) is None


def test_begin_is_refused_for_a_superseded_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 2)

    assert tracker.begin_reopen_candidate(T, 1) is None
    assert tracker.begin_reopen_candidate(T, 3) is None


def test_begin_is_refused_while_a_candidate_on_another_base_is_pending() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    assert tracker.begin_reopen_candidate(T, 0) == 1
    tracker.observe(T, 1)

    assert tracker.begin_reopen_candidate(T, 1) is None
    assert _pending_bases(tracker, T) == [0]


def test_begin_on_an_unknown_turn_can_be_confirmed() -> None:
    tracker = SpeculativeTurnTracker()

    candidate = tracker.begin_reopen_candidate(T, 3)

    assert candidate == 4
    assert tracker.confirm_reopen_candidate(T, 3, candidate)
    assert tracker.is_latest(T, 4)
    assert not tracker.is_latest(T, 3)


def test_confirm_promotes_the_candidate_and_makes_the_base_stale() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)

    assert tracker.confirm_reopen_candidate(T, 0, candidate)
    assert not tracker.is_latest(T, 0)
    assert tracker.is_latest(T, 1)
    assert not tracker.has_pending_reopen(T, 0)


def test_confirm_ends_the_grace_of_the_base() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 10.0)
    candidate = tracker.begin_reopen_candidate(T, 0)

    assert tracker.confirm_reopen_candidate(T, 0, candidate)
    assert not tracker.has_pending_reopen_or_grace(T, 0)
    assert not tracker.has_pending_reopen_or_grace(T, 1)


@pytest.mark.parametrize(("base", "candidate"), [(0, 2), (1, 1), (1, 2)])
def test_confirm_with_numbers_that_do_not_match_keeps_the_entry(base: int, candidate: int) -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)

    assert not tracker.confirm_reopen_candidate(T, base, candidate)
    assert tracker.has_pending_reopen(T, 0)
    assert tracker.is_latest(T, 0)


def test_confirm_without_a_candidate_is_refused() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)

    assert not tracker.confirm_reopen_candidate(T, 0, 1)
    assert not tracker.confirm_reopen_candidate("unknown", 0, 1)
    assert tracker.is_latest(T, 0)


def test_a_commit_above_the_newest_revision_records_nothing_and_the_candidate_stands() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    tracker.commit(T, 1)  # not the newest revision: nothing is recorded

    assert not tracker.is_committed(T)
    assert tracker.confirm_reopen_candidate(T, 0, candidate)
    assert tracker.is_latest(T, 1)


def test_confirm_after_the_base_was_superseded_drops_the_entry() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    tracker.observe(T, 5)

    assert not tracker.confirm_reopen_candidate(T, 0, candidate)
    assert not tracker.has_pending_reopen(T, 0)
    assert tracker.is_latest(T, 5)


def test_cancel_drops_the_candidate() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)

    tracker.cancel_reopen_candidate(T, candidate)

    assert not tracker.has_pending_reopen(T, 0)
    assert tracker.is_latest(T, 0)
    assert not tracker.confirm_reopen_candidate(T, 0, candidate)


def test_cancel_without_a_candidate_number_drops_any_candidate() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)

    tracker.cancel_reopen_candidate(T)

    assert not tracker.has_pending_reopen(T, 0)


def test_cancel_of_another_candidate_keeps_the_entry() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)

    tracker.cancel_reopen_candidate(T, 7)
    tracker.cancel_reopen_candidate("other-turn")

    assert tracker.has_pending_reopen(T, 0)


def test_after_cancel_a_new_candidate_can_begin() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.cancel_reopen_candidate(T, tracker.begin_reopen_candidate(T, 0))

    assert tracker.begin_reopen_candidate(T, 0) == 1


# -- waiting out a candidate -----------------------------------------------------------------------------


def test_wait_for_pending_reopen_returns_at_once_without_a_candidate() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    started = time.monotonic()

    tracker.wait_for_pending_reopen(T, 0)
    tracker.wait_for_pending_reopen("unknown", 0)

    assert time.monotonic() - started < 0.5


def test_wait_for_pending_reopen_ignores_a_candidate_on_another_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)

    tracker.wait_for_pending_reopen(T, 1, timeout_s=0)

    assert tracker.has_pending_reopen(T, 0)


def test_wait_for_pending_reopen_timeout_drops_the_candidate_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger=turns_module.__name__):
        tracker.wait_for_pending_reopen(T, 0, timeout_s=0.05)

    assert 0.04 <= time.monotonic() - started < 1.0
    assert not tracker.has_pending_reopen(T, 0)
    assert tracker.is_latest(T, 0)
    assert any(record.levelno == logging.WARNING for record in caplog.records)


def test_wait_for_pending_reopen_default_timeout_is_two_seconds() -> None:
    assert PENDING_REOPEN_WAIT_TIMEOUT_S == 2.0


def test_wait_for_pending_reopen_is_released_by_confirm() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.wait_for_pending_reopen, T, 0)

    assert call.blocked()
    tracker.confirm_reopen_candidate(T, 0, candidate)
    call.join()

    assert call.elapsed < 1.0


def test_is_latest_after_pending_reopen_answers_at_once_without_a_candidate() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 1)

    assert tracker.is_latest_after_pending_reopen(T, 1)
    assert not tracker.is_latest_after_pending_reopen(T, 0)


def test_is_latest_after_pending_reopen_is_false_once_the_candidate_is_confirmed() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.is_latest_after_pending_reopen, T, 0)

    assert call.blocked()
    tracker.confirm_reopen_candidate(T, 0, candidate)

    assert call.join() is False


def test_is_latest_after_pending_reopen_is_true_once_the_candidate_is_cancelled() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.is_latest_after_pending_reopen, T, 0)

    assert call.blocked()
    tracker.cancel_reopen_candidate(T, candidate)

    assert call.join() is True


def test_try_is_latest_after_pending_reopen_answers_none_while_pending() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)

    assert tracker.try_is_latest_after_pending_reopen(T, 0) is None
    tracker.cancel_reopen_candidate(T, candidate)
    assert tracker.try_is_latest_after_pending_reopen(T, 0) is True
    tracker.observe(T, 1)
    assert tracker.try_is_latest_after_pending_reopen(T, 0) is False


def test_blocking_wait_times_out_and_drops_the_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns_module, "PENDING_REOPEN_WAIT_TIMEOUT_S", 0.05)
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)

    assert tracker.commit_if_latest_after_pending_reopen(T, 0) is True
    assert tracker.is_committed(T, 0)
    assert not tracker.has_pending_reopen(T, 0)


def test_a_candidate_that_outlived_the_timeout_no_longer_counts_as_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(turns_module, "PENDING_REOPEN_WAIT_TIMEOUT_S", 0.05)
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)
    time.sleep(0.06)

    assert tracker.try_is_latest_after_pending_reopen(T, 0) is True
    assert not tracker.has_pending_reopen(T, 0)


# -- grace -----------------------------------------------------------------------------------------------


def test_grace_is_left_until_it_runs_out() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 0.1)

    assert tracker.has_pending_reopen_or_grace(T, 0)
    assert not tracker.has_pending_reopen(T, 0)
    time.sleep(0.12)
    assert not tracker.has_pending_reopen_or_grace(T, 0)


def test_a_pending_candidate_counts_as_pending_or_grace() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)

    assert tracker.has_pending_reopen_or_grace(T, 0)
    assert not tracker.has_pending_reopen_or_grace(T, 1)


@pytest.mark.parametrize("grace_s", [0.0, -1.0])
def test_no_grace_without_positive_duration(grace_s: float) -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)

    tracker.start_reopen_grace(T, 0, grace_s)

    assert not tracker.has_pending_reopen_or_grace(T, 0)


def test_no_grace_for_a_superseded_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 1)

    tracker.start_reopen_grace(T, 0, 10.0)
    tracker.start_reopen_grace(T, 2, 10.0)

    assert not tracker.has_pending_reopen_or_grace(T, 0)
    assert not tracker.has_pending_reopen_or_grace(T, 1)
    assert not tracker.has_pending_reopen_or_grace(T, 2)


def test_no_grace_for_a_committed_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.commit(T, 0)

    tracker.start_reopen_grace(T, 0, 10.0)

    assert not tracker.has_pending_reopen_or_grace(T, 0)


def test_grace_on_an_unknown_turn_is_kept() -> None:
    tracker = SpeculativeTurnTracker()

    tracker.start_reopen_grace(T, 0, 10.0)

    assert tracker.has_pending_reopen_or_grace(T, 0)
    assert tracker.try_is_latest_after_reopen_grace(T, 0) is None


def test_grace_for_the_same_revision_only_ever_extends() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 0.05)

    tracker.start_reopen_grace(T, 0, 10.0)
    time.sleep(0.07)
    assert tracker.has_pending_reopen_or_grace(T, 0)

    tracker.start_reopen_grace(T, 0, 0.01)
    time.sleep(0.03)
    assert tracker.has_pending_reopen_or_grace(T, 0)


def test_grace_for_another_revision_replaces_the_old_one() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 10.0)
    tracker.observe(T, 1)

    tracker.start_reopen_grace(T, 1, 0.1)

    assert not tracker.has_pending_reopen_or_grace(T, 0)
    assert tracker.has_pending_reopen_or_grace(T, 1)
    time.sleep(0.12)
    assert not tracker.has_pending_reopen_or_grace(T, 1)


def test_is_latest_after_reopen_grace_waits_the_grace_out() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 0.1)
    started = time.monotonic()

    assert tracker.is_latest_after_reopen_grace(T, 0) is True
    assert time.monotonic() - started >= 0.09


def test_is_latest_after_reopen_grace_is_false_as_soon_as_the_turn_reopens() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 5.0)
    call = _Call(tracker.is_latest_after_reopen_grace, T, 0)

    assert call.blocked()
    candidate = tracker.begin_reopen_candidate(T, 0)
    assert call.blocked()
    tracker.confirm_reopen_candidate(T, 0, candidate)

    assert call.join() is False
    assert call.elapsed < 1.0


def test_is_latest_after_reopen_grace_waits_out_a_candidate_then_the_grace() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.is_latest_after_reopen_grace, T, 0)

    assert call.blocked()
    tracker.start_reopen_grace(T, 0, 0.3)
    tracker.cancel_reopen_candidate(T, candidate)
    assert call.blocked(0.03)

    assert call.join() is True


def test_try_is_latest_after_reopen_grace_answers_none_while_gated() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 0.1)

    assert tracker.try_is_latest_after_reopen_grace(T, 0) is None
    time.sleep(0.12)
    assert tracker.try_is_latest_after_reopen_grace(T, 0) is True

    candidate = tracker.begin_reopen_candidate(T, 0)
    assert tracker.try_is_latest_after_reopen_grace(T, 0) is None
    tracker.confirm_reopen_candidate(T, 0, candidate)
    assert tracker.try_is_latest_after_reopen_grace(T, 0) is False


# -- stability window ------------------------------------------------------------------------------------


def test_stability_window_holds_for_the_settle_time() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    started = time.monotonic()

    assert tracker.is_latest_after_stability_window(T, 0, 0.1) is True
    assert time.monotonic() - started >= 0.09


def test_stability_window_is_false_as_soon_as_the_turn_reopens() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    call = _Call(tracker.is_latest_after_stability_window, T, 0, 5.0)

    assert call.blocked()
    tracker.observe(T, 1)

    assert call.join() is False
    assert call.elapsed < 1.0


def test_stability_window_is_not_ended_by_a_cancelled_candidate() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    call = _Call(tracker.is_latest_after_stability_window, T, 0, 0.3)

    assert call.blocked(0.03)
    tracker.cancel_reopen_candidate(T, tracker.begin_reopen_candidate(T, 0))

    assert call.join() is True
    assert call.elapsed >= 0.29


def test_stability_window_waits_out_a_candidate_pending_at_its_end() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.is_latest_after_stability_window, T, 0, 0.02)

    assert call.blocked(0.1)
    tracker.confirm_reopen_candidate(T, 0, candidate)

    assert call.join() is False


@pytest.mark.parametrize("settle_s", [0.0, -1.0])
def test_stability_window_without_settle_time_only_waits_out_a_candidate(settle_s: float) -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    assert tracker.is_latest_after_stability_window(T, 0, settle_s) is True

    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.is_latest_after_stability_window, T, 0, settle_s)
    assert call.blocked()
    tracker.cancel_reopen_candidate(T, candidate)

    assert call.join() is True


# -- commits ---------------------------------------------------------------------------------------------


def test_commit_records_the_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 1)

    assert not tracker.is_committed(T)
    tracker.commit(T, 1)

    assert tracker.is_committed(T)
    assert tracker.is_committed(T, 0)
    assert tracker.is_committed(T, 1)
    assert not tracker.is_committed(T, 2)
    assert not tracker.is_committed("other-turn")


def test_commit_is_deferred_while_a_candidate_on_the_revision_is_pending() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)

    tracker.commit(T, 0)
    assert not tracker.is_committed(T)

    tracker.cancel_reopen_candidate(T, candidate)
    tracker.commit(T, 0)
    assert tracker.is_committed(T, 0)


def test_commit_of_an_untracked_turn_records_nothing() -> None:
    tracker = SpeculativeTurnTracker()

    tracker.commit(T, 0)

    assert not tracker.is_committed(T)
    assert tracker.begin_reopen_candidate(T, 0) == 1


def test_commit_of_an_older_revision_records_nothing() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 2)

    tracker.commit(T, 1)

    assert not tracker.is_committed(T)
    assert not tracker.is_committed(T, 1)
    assert tracker.begin_reopen_candidate(T, 2) == 3


def test_a_turn_id_recycled_after_reset_is_never_read_as_committed() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.commit(T, 0)
    tracker.reset()

    tracker.commit(T, 0)  # a late commit of the old turn, after the reset

    assert not tracker.is_committed(T)
    tracker.observe(T, 0)
    assert not tracker.is_committed(T)


def test_a_turn_id_recycled_after_pruning_is_never_read_as_committed() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=1)
    tracker.observe("t1", 0)
    tracker.observe("t2", 0)  # t1 is forgotten

    tracker.commit("t1", 0)

    assert not tracker.is_committed("t1")
    assert tracker.is_latest("t1", 5)


def test_commit_if_latest_on_an_untracked_turn_is_true_and_records_nothing() -> None:
    tracker = SpeculativeTurnTracker()

    assert tracker.commit_if_latest_after_pending_reopen(T, 0) is True
    assert tracker.try_commit_if_latest_after_pending_reopen(T, 0) is True
    assert tracker.commit_if_latest_after_reopen_grace(T, 0) is True
    assert tracker.try_commit_if_latest_after_reopen_grace(T, 0) is True
    assert not tracker.is_committed(T)
    assert tracker.is_latest(T, 9)


def test_commit_if_latest_refuses_a_superseded_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 1)

    assert tracker.commit_if_latest_after_pending_reopen(T, 0) is False
    assert tracker.try_commit_if_latest_after_pending_reopen(T, 0) is False
    assert tracker.commit_if_latest_after_reopen_grace(T, 0) is False
    assert tracker.try_commit_if_latest_after_reopen_grace(T, 0) is False
    assert tracker.commit_if_latest_after_pending_reopen(T, 2) is False
    assert not tracker.is_committed(T)


def test_commit_if_latest_commits_the_latest_revision() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 1)

    assert tracker.commit_if_latest_after_pending_reopen(T, 1) is True
    assert tracker.is_committed(T, 1)


def test_commit_if_latest_is_refused_once_the_pending_candidate_is_confirmed() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.commit_if_latest_after_pending_reopen, T, 0)

    assert call.blocked()
    assert tracker.confirm_reopen_candidate(T, 0, candidate)

    assert call.join() is False
    assert not tracker.is_committed(T)


def test_commit_if_latest_commits_once_the_pending_candidate_is_cancelled() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.commit_if_latest_after_pending_reopen, T, 0)

    assert call.blocked()
    tracker.cancel_reopen_candidate(T, candidate)

    assert call.join() is True
    assert tracker.is_committed(T, 0)


def test_try_commit_if_latest_answers_none_while_pending_and_records_nothing() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    candidate = tracker.begin_reopen_candidate(T, 0)

    assert tracker.try_commit_if_latest_after_pending_reopen(T, 0) is None
    assert tracker.try_commit_if_latest_after_reopen_grace(T, 0) is None
    assert not tracker.is_committed(T)

    tracker.cancel_reopen_candidate(T, candidate)
    assert tracker.try_commit_if_latest_after_pending_reopen(T, 0) is True
    assert tracker.is_committed(T, 0)


def test_commit_if_latest_after_grace_waits_the_grace_out_then_commits() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 0.1)
    started = time.monotonic()

    assert tracker.commit_if_latest_after_reopen_grace(T, 0) is True
    assert time.monotonic() - started >= 0.09
    assert tracker.is_committed(T, 0)


def test_commit_if_latest_after_grace_is_refused_when_the_turn_reopens_meanwhile() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 5.0)
    call = _Call(tracker.commit_if_latest_after_reopen_grace, T, 0)

    assert call.blocked()
    tracker.confirm_reopen_candidate(T, 0, tracker.begin_reopen_candidate(T, 0))

    assert call.join() is False
    assert not tracker.is_committed(T)


def test_try_commit_if_latest_after_grace_answers_none_while_grace_is_left() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.start_reopen_grace(T, 0, 0.1)

    assert tracker.try_commit_if_latest_after_reopen_grace(T, 0) is None
    assert tracker.try_commit_if_latest_after_pending_reopen(T, 0) is True  # grace does not gate this form
    time.sleep(0.12)
    assert tracker.try_commit_if_latest_after_reopen_grace(T, 0) is True
    assert tracker.is_committed(T, 0)


def test_reset_forgets_everything() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 3)
    tracker.commit(T, 3)
    tracker.observe("b", 0)
    tracker.begin_reopen_candidate("b", 0)
    tracker.observe("c", 0)
    tracker.start_reopen_grace("c", 0, 10.0)

    tracker.reset()

    assert _newest(tracker, T) is None
    assert not tracker.is_committed(T)
    assert not tracker.has_pending_reopen("b", 0)
    assert not tracker.has_pending_reopen_or_grace("c", 0)


def test_reset_releases_a_waiter() -> None:
    tracker = SpeculativeTurnTracker()
    tracker.observe(T, 0)
    tracker.begin_reopen_candidate(T, 0)
    call = _Call(tracker.commit_if_latest_after_pending_reopen, T, 0)

    assert call.blocked()
    tracker.reset()

    assert call.join() is True
    assert call.elapsed < 1.0


# -- bounded memory --------------------------------------------------------------------------------------


def _known(tracker: SpeculativeTurnTracker, turn_id: str) -> bool:
    return _newest(tracker, turn_id) is not None


def test_least_recently_raised_turn_is_forgotten_with_its_commit() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=2)
    tracker.observe("t1", 0)
    tracker.commit("t1", 0)
    tracker.observe("t2", 0)
    tracker.observe("t3", 0)

    assert not _known(tracker, "t1")
    assert not tracker.is_committed("t1")
    assert _known(tracker, "t2")
    assert _known(tracker, "t3")


def test_raising_a_revision_keeps_a_turn_remembered() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=2)
    tracker.observe("t1", 0)
    tracker.observe("t2", 0)
    tracker.observe("t1", 1)
    tracker.observe("t3", 0)

    assert _newest(tracker, "t1") == 1
    assert not _known(tracker, "t2")


def test_observing_the_same_revision_again_does_not_count_as_raising() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=2)
    tracker.observe("t1", 0)
    tracker.observe("t2", 0)
    tracker.observe("t1", 0)
    tracker.observe("t3", 0)

    assert not _known(tracker, "t1")
    assert _known(tracker, "t2")


def test_confirming_a_reopen_counts_as_raising() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=2)
    tracker.observe("t1", 0)
    tracker.observe("t2", 0)
    tracker.confirm_reopen_candidate("t1", 0, tracker.begin_reopen_candidate("t1", 0))
    tracker.observe("t3", 0)

    assert _newest(tracker, "t1") == 1
    assert not _known(tracker, "t2")


def test_a_turn_with_a_pending_candidate_is_never_forgotten() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=1)
    tracker.observe("t1", 0)
    candidate = tracker.begin_reopen_candidate("t1", 0)
    tracker.observe("t2", 0)
    tracker.observe("t3", 0)

    assert tracker.has_pending_reopen("t1", 0)
    assert not _known(tracker, "t2")
    assert _known(tracker, "t3")
    assert tracker.confirm_reopen_candidate("t1", 0, candidate)


def test_a_turn_with_live_grace_is_never_forgotten() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=1)
    tracker.observe("t1", 0)
    tracker.start_reopen_grace("t1", 0, 10.0)
    tracker.observe("t2", 0)
    tracker.observe("t3", 0)

    assert tracker.has_pending_reopen_or_grace("t1", 0)
    assert _known(tracker, "t1")
    assert _known(tracker, "t3")


def test_a_turn_is_forgotten_once_its_grace_ran_out() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=1)
    tracker.observe("t1", 0)
    tracker.start_reopen_grace("t1", 0, 0.1)
    tracker.observe("t2", 0)
    time.sleep(0.12)
    tracker.observe("t3", 0)

    assert not _known(tracker, "t1")
    assert not _known(tracker, "t2")
    assert _known(tracker, "t3")


def test_a_turn_kept_only_for_its_candidate_is_forgotten_once_it_resolves() -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=1)
    tracker.observe("t1", 0)
    candidate = tracker.begin_reopen_candidate("t1", 0)
    tracker.observe("t2", 0)

    tracker.cancel_reopen_candidate("t1", candidate)

    assert not _known(tracker, "t1")
    assert _known(tracker, "t2")


@pytest.mark.parametrize("bound", [0, -1])
def test_no_bound_at_zero_or_below(bound: int) -> None:
    tracker = SpeculativeTurnTracker(max_tracked_turns=bound)
    for i in range(3000):
        tracker.observe(f"t{i}", 1)

    assert all(not tracker.is_latest(f"t{i}", 0) for i in range(3000))


def test_default_bound_is_2048_turns() -> None:
    tracker = SpeculativeTurnTracker()
    for i in range(2049):
        tracker.observe(f"t{i}", 1)

    assert tracker.is_latest("t0", 0)
    assert not tracker.is_latest("t1", 0)
    assert not tracker.is_latest("t2048", 0)


# -- races -----------------------------------------------------------------------------------------------


def test_concurrent_reopens_and_commits_keep_the_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    # Switch threads far more often than the default 5 ms, so the operations really interleave.
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        _run_concurrent_reopens_and_commits(monkeypatch)
    finally:
        sys.setswitchinterval(previous_interval)


def _run_concurrent_reopens_and_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    # Short timeouts so a blocked commit never holds the test up for long.
    monkeypatch.setattr(turns_module, "PENDING_REOPEN_WAIT_TIMEOUT_S", 0.05)
    tracker = SpeculativeTurnTracker(max_tracked_turns=0)
    # A commit of the newest revision ends a turn's reopens, so the workers move through a window of turns.
    turn_ids = [f"turn-{i}" for i in range(40)]
    for turn_id in turn_ids:
        tracker.observe(turn_id, 0)
    lock = threading.Lock()
    committed_via_commit_if: set[tuple[str, int]] = set()
    confirmed_bases: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    seen_newest: dict[str, list[int]] = {turn_id: [] for turn_id in turn_ids}
    stop = threading.Event()

    def record_commit(turn_id: str, revision: int, result: bool | None) -> None:
        if result:
            with lock:
                committed_via_commit_if.add((turn_id, revision))

    start = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        try:
            for step in range(400):
                turn_id = turn_ids[step // 20 + rng.randrange(4)]
                newest = _newest(tracker, turn_id, limit=1000)
                assert newest is not None
                # Often one behind, so stale work races the reopen that superseded it.
                revision = max(0, newest - rng.choice([0, 1]))
                op = rng.random()
                if op < 0.45:
                    revision = newest
                    candidate = tracker.begin_reopen_candidate(turn_id, revision)
                    if candidate is None:
                        continue
                    if rng.random() < 0.6:
                        if tracker.confirm_reopen_candidate(turn_id, revision, candidate):
                            with lock:
                                confirmed_bases.append((turn_id, revision))
                    else:
                        tracker.cancel_reopen_candidate(turn_id, candidate)
                elif op < 0.50:
                    blocking = tracker.commit_if_latest_after_pending_reopen(turn_id, revision)
                    record_commit(turn_id, revision, blocking)
                elif op < 0.55:
                    non_blocking = tracker.try_commit_if_latest_after_reopen_grace(turn_id, revision)
                    record_commit(turn_id, revision, non_blocking)
                elif op < 0.70:
                    tracker.start_reopen_grace(turn_id, revision, 0.002)
                elif op < 0.85:
                    tracker.is_latest_after_reopen_grace(turn_id, revision)
                else:
                    tracker.wait_for_pending_reopen(turn_id, revision, timeout_s=0.005)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def monitor() -> None:
        try:
            while not stop.is_set():
                for turn_id in turn_ids:
                    newest = _newest(tracker, turn_id, limit=1000)
                    assert newest is not None
                    seen_newest[turn_id].append(newest)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    watcher = threading.Thread(target=monitor)
    watcher.start()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=15)
    stop.set()
    watcher.join(timeout=5)

    assert errors == []
    assert not any(thread.is_alive() for thread in workers)
    assert len(confirmed_bases) > len(turn_ids)  # the race did exercise reopens
    # A base is confirmed at most once, and never once a commit_if form made it final (nor the reverse).
    assert len(confirmed_bases) == len(set(confirmed_bases))
    assert committed_via_commit_if.isdisjoint(confirmed_bases)
    for turn_id in turn_ids:
        assert seen_newest[turn_id] == sorted(seen_newest[turn_id])
        assert len(_pending_bases(tracker, turn_id, limit=1000)) <= 1
        assert _newest(tracker, turn_id, limit=1000) == sum(1 for t, _ in confirmed_bases if t == turn_id)


# -- properties ------------------------------------------------------------------------------------------

TURNS = st.sampled_from(["x", "y", "z"])
REVISIONS = st.integers(min_value=0, max_value=6)
PROBE = 16


class TrackerInvariants(RuleBasedStateMachine):
    """Random non-blocking operations on a small tracker; the contract's invariants hold throughout."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = SpeculativeTurnTracker(max_tracked_turns=2)
        self.newest: dict[str, int | None] = {"x": None, "y": None, "z": None}
        self.candidates: list[tuple[str, int, int]] = []

    @rule(turn_id=TURNS, revision=REVISIONS)
    def observe(self, turn_id: str, revision: int) -> None:
        self.tracker.observe(turn_id, revision)

    @rule(turn_id=TURNS, revision=REVISIONS)
    def begin(self, turn_id: str, revision: int) -> None:
        candidate = self.tracker.begin_reopen_candidate(turn_id, revision)
        assert candidate in (None, revision + 1)
        if candidate is not None:
            self.candidates.append((turn_id, revision, candidate))

    @precondition(lambda self: bool(self.candidates))
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        turn_id, base, candidate = data.draw(st.sampled_from(self.candidates))
        was_latest = self.tracker.is_latest(turn_id, base)
        if self.tracker.confirm_reopen_candidate(turn_id, base, candidate):
            assert was_latest
            assert self.tracker.is_latest(turn_id, candidate)

    @rule(turn_id=TURNS, candidate=st.none() | REVISIONS)
    def cancel(self, turn_id: str, candidate: int | None) -> None:
        self.tracker.cancel_reopen_candidate(turn_id, candidate)

    @rule(turn_id=TURNS, revision=REVISIONS)
    def commit(self, turn_id: str, revision: int) -> None:
        self.tracker.commit(turn_id, revision)

    @rule(turn_id=TURNS, revision=REVISIONS, grace_s=st.sampled_from([0.0, 30.0]))
    def grace(self, turn_id: str, revision: int, grace_s: float) -> None:
        self.tracker.start_reopen_grace(turn_id, revision, grace_s)

    @rule(turn_id=TURNS, revision=REVISIONS, form=st.integers(min_value=0, max_value=2))
    def commit_if_latest(self, turn_id: str, revision: int, form: int) -> None:
        newest = _newest(self.tracker, turn_id, PROBE)
        committed_before = [self.tracker.is_committed(turn_id, r) for r in range(PROBE)]
        if form == 0:
            if self.tracker.has_pending_reopen(turn_id, revision):
                return  # the blocking form would wait out the candidate
            result: bool | None = self.tracker.commit_if_latest_after_pending_reopen(turn_id, revision)
        elif form == 1:
            result = self.tracker.try_commit_if_latest_after_pending_reopen(turn_id, revision)
        else:
            result = self.tracker.try_commit_if_latest_after_reopen_grace(turn_id, revision)
        if newest is not None and newest != revision:
            assert result is False
            assert [self.tracker.is_committed(turn_id, r) for r in range(PROBE)] == committed_before
        if newest is None:
            assert result is True
            assert not self.tracker.is_committed(turn_id)
        elif result:
            assert self.tracker.is_committed(turn_id, revision)

    @invariant()
    def newest_revision_never_goes_down_while_remembered(self) -> None:
        for turn_id, before in self.newest.items():
            now = _newest(self.tracker, turn_id, PROBE)
            if before is not None and now is not None:
                assert now >= before
            self.newest[turn_id] = now

    @invariant()
    def at_most_one_candidate_per_turn(self) -> None:
        for turn_id in self.newest:
            assert len(_pending_bases(self.tracker, turn_id, PROBE)) <= 1

    @invariant()
    def only_turns_with_candidate_or_grace_exceed_the_bound(self) -> None:
        kept_for_nothing = [
            turn_id
            for turn_id in self.newest
            if _known(self.tracker, turn_id)
            and not _pending_bases(self.tracker, turn_id, PROBE)
            and not self.tracker.has_pending_reopen_or_grace(turn_id, _newest(self.tracker, turn_id, PROBE))
        ]
        assert len(kept_for_nothing) <= 2


TrackerInvariants.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_tracker_invariants = TrackerInvariants.TestCase
