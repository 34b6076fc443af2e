"""Turn revisions, reopen candidates and reopen grace: which speculative work may still reach the caller.

A turn that was closed may be reopened when the user turns out to have only paused. Each confirmed reopen
makes the turn's next revision; work tagged with an older revision is stale.

`turn_id is None or revision is None` means "not speculative" throughout: such work is always latest, has
nothing pending and changes nothing (`SpeculativeTurnTracker._speculative` is the one place that reads it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

PENDING_REOPEN_WAIT_TIMEOUT_S = 2.0
"""How long a reopen candidate may stay pending before it is dropped."""


@dataclass(frozen=True)
class _Pending:
    base: int
    candidate: int
    started_at: float


@dataclass(frozen=True)
class _Grace:
    revision: int
    until: float


@dataclass
class _TurnState:
    newest: int
    committed: int | None = None
    pending: _Pending | None = None
    grace: _Grace | None = None


class SpeculativeTurnTracker:
    """Thread-safe record of each turn's newest revision, its commit, a pending reopen and a grace window.

    One per call. Blocking methods must not run on the asyncio event loop; it uses the `try_` forms, which
    answer None where the blocking form would wait.
    """

    def __init__(self, max_tracked_turns: int = 2048) -> None:
        self._max_tracked_turns = max_tracked_turns
        self._condition = threading.Condition()
        # Ordered from least to most recently raised: the eviction order.
        self._turns: OrderedDict[str, _TurnState] = OrderedDict()

    def observe(self, turn_id: str | None, revision: int | None) -> None:
        """Record `revision`; only ever raises the turn's newest revision."""
        self._speculative(turn_id, revision, None, self._observe_locked)

    def is_latest(self, turn_id: str | None, revision: int | None) -> bool:
        """Whether `revision` is the newest recorded one (or the turn is unknown). Never blocks."""
        return self._speculative(turn_id, revision, True, self._is_latest_locked)

    def has_pending_reopen(self, turn_id: str | None, revision: int | None) -> bool:
        """Whether a reopen candidate whose base is `revision` is pending."""
        return self._speculative(turn_id, revision, False, self._has_pending_on_locked)

    def has_pending_reopen_or_grace(self, turn_id: str | None, revision: int | None) -> bool:
        """Whether a candidate on `revision` is pending or grace time is left for it."""
        return self._speculative(turn_id, revision, False, self._is_gated_locked)

    def begin_reopen_candidate(self, turn_id: str | None, revision: int | None) -> int | None:
        """Propose `revision + 1`; None when the turn is final at `revision` or `revision` is superseded."""
        return self._speculative(turn_id, revision, None, self._begin_reopen_locked)

    def confirm_reopen_candidate(
        self, turn_id: str | None, base_revision: int | None, candidate_revision: int | None
    ) -> bool:
        """Promote the pending candidate to newest revision; False when it does not match or is moot."""
        if candidate_revision is None:
            return False
        return self._speculative(
            turn_id, base_revision, False, self._confirm_reopen_locked, candidate_revision
        )

    def cancel_reopen_candidate(self, turn_id: str | None, candidate_revision: int | None = None) -> None:
        """Drop the pending candidate (only the one given, when `candidate_revision` is not None)."""
        if turn_id is None:
            return
        with self._condition:
            state = self._turns.get(turn_id)
            if state is None or state.pending is None:
                return
            if candidate_revision is not None and state.pending.candidate != candidate_revision:
                return
            self._drop_pending_locked(state)

    def wait_for_pending_reopen(
        self, turn_id: str | None, revision: int | None, timeout_s: float = PENDING_REOPEN_WAIT_TIMEOUT_S
    ) -> None:
        """Block until a candidate on `revision` resolves; drop it after `timeout_s`."""
        self._speculative(
            turn_id, revision, None, self._wait_out_pending_locked, timeout_s, stop_when_superseded=False
        )

    def is_latest_after_pending_reopen(self, turn_id: str | None, revision: int | None) -> bool:
        """Wait out a pending candidate on `revision`, then answer `is_latest`."""
        return self._speculative(turn_id, revision, True, self._wait_locked, grace=False, commit=False)

    def try_is_latest_after_pending_reopen(self, turn_id: str | None, revision: int | None) -> bool | None:
        """`is_latest`, or None while a candidate on `revision` is pending."""
        return self._speculative(turn_id, revision, True, self._try_locked, grace=False, commit=False)

    def start_reopen_grace(self, turn_id: str | None, revision: int | None, grace_s: float) -> None:
        """Open (or extend) a window of `grace_s` seconds during which emitting for `revision` waits."""
        if grace_s > 0:
            self._speculative(turn_id, revision, None, self._start_grace_locked, grace_s)

    def is_latest_after_reopen_grace(self, turn_id: str | None, revision: int | None) -> bool:
        """Wait out a pending candidate and the grace; False as soon as `revision` is superseded."""
        return self._speculative(turn_id, revision, True, self._wait_locked, grace=True, commit=False)

    def try_is_latest_after_reopen_grace(self, turn_id: str | None, revision: int | None) -> bool | None:
        """`is_latest`, or None while a candidate is pending or grace is left."""
        return self._speculative(turn_id, revision, True, self._try_locked, grace=True, commit=False)

    def is_latest_after_stability_window(
        self, turn_id: str | None, revision: int | None, settle_s: float
    ) -> bool:
        """Hold for `settle_s` (and any candidate then pending); False as soon as `revision` is superseded."""
        if settle_s <= 0:
            return self.is_latest_after_pending_reopen(turn_id, revision)
        return self._speculative(turn_id, revision, True, self._stability_window_locked, settle_s)

    def commit(self, turn_id: str | None, revision: int | None) -> None:
        """Record `revision` as final when it is the tracked turn's newest, unless a candidate on it is
        pending (then nothing is recorded). An untracked turn (never observed, reset or pruned) or an
        older revision records nothing, so a recycled turn id never reads as committed."""
        self._speculative(turn_id, revision, None, self._commit_newest_locked)

    def commit_if_latest_after_pending_reopen(self, turn_id: str | None, revision: int | None) -> bool:
        """Wait out a pending candidate, then commit `revision` if it is latest; answer whether it was."""
        return self._speculative(turn_id, revision, True, self._wait_locked, grace=False, commit=True)

    def try_commit_if_latest_after_pending_reopen(
        self, turn_id: str | None, revision: int | None
    ) -> bool | None:
        """As `commit_if_latest_after_pending_reopen`, but None instead of waiting."""
        return self._speculative(turn_id, revision, True, self._try_locked, grace=False, commit=True)

    def commit_if_latest_after_reopen_grace(self, turn_id: str | None, revision: int | None) -> bool:
        """Wait out a pending candidate and the grace, then commit `revision` if it is latest."""
        return self._speculative(turn_id, revision, True, self._wait_locked, grace=True, commit=True)

    def try_commit_if_latest_after_reopen_grace(
        self, turn_id: str | None, revision: int | None
    ) -> bool | None:
        """As `commit_if_latest_after_reopen_grace`, but None instead of waiting."""
        return self._speculative(turn_id, revision, True, self._try_locked, grace=True, commit=True)

    def is_committed(self, turn_id: str | None, revision: int | None = None) -> bool:
        """Whether the turn has any commit (`revision` None) or one at or above `revision`."""
        if turn_id is None:
            return False
        with self._condition:
            state = self._turns.get(turn_id)
            if state is None or state.committed is None:
                return False
            return revision is None or state.committed >= revision

    def reset(self) -> None:
        """Forget everything."""
        with self._condition:
            self._turns.clear()
            self._condition.notify_all()

    # -- internals (the `_locked` ones need the condition held) -----------------------------------------

    def _speculative(
        self,
        turn_id: str | None,
        revision: int | None,
        not_speculative: T,
        locked: Callable[Concatenate[str, int, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """The one place that reads `turn_id is None or revision is None` as "not speculative": answer
        `not_speculative` then, else run `locked(turn_id, revision, ...)` with the condition held."""
        if turn_id is None or revision is None:
            return not_speculative
        with self._condition:
            return locked(turn_id, revision, *args, **kwargs)

    def _observe_locked(self, turn_id: str, revision: int) -> None:
        state = self._turns.get(turn_id)
        if state is None:
            self._add_turn_locked(turn_id, revision)
        elif revision > state.newest:
            self._raise_locked(turn_id, state, revision)

    def _begin_reopen_locked(self, turn_id: str, revision: int) -> int | None:
        state = self._turns.get(turn_id)
        if state is not None and state.committed is not None and state.committed >= revision:
            return None
        if not self._is_latest_locked(turn_id, revision):
            return None
        if state is None:
            # An unknown turn counts as latest; record it so the candidate has a base to confirm against.
            state = self._add_turn_locked(turn_id, revision)
        pending = self._live_pending_locked(turn_id, state)
        if pending is not None:
            return pending.candidate if pending.base == revision else None
        state.pending = _Pending(base=revision, candidate=revision + 1, started_at=time.monotonic())
        self._condition.notify_all()
        return revision + 1

    def _confirm_reopen_locked(self, turn_id: str, base_revision: int, candidate_revision: int) -> bool:
        state = self._turns.get(turn_id)
        if state is None:
            return False
        pending = self._live_pending_locked(turn_id, state)
        if pending is None or pending.base != base_revision or pending.candidate != candidate_revision:
            return False
        committed = state.committed is not None and state.committed >= base_revision
        if committed or state.newest != base_revision:
            self._drop_pending_locked(state)
            return False
        state.pending = None
        self._raise_locked(turn_id, state, candidate_revision)
        return True

    def _start_grace_locked(self, turn_id: str, revision: int, grace_s: float) -> None:
        state = self._turns.get(turn_id)
        if state is None:
            state = self._add_turn_locked(turn_id, revision)
        elif state.newest != revision or (state.committed is not None and state.committed >= revision):
            return
        until = time.monotonic() + grace_s
        if state.grace is not None and state.grace.revision == revision and state.grace.until >= until:
            return
        state.grace = _Grace(revision=revision, until=until)
        self._condition.notify_all()

    def _stability_window_locked(self, turn_id: str, revision: int, settle_s: float) -> bool:
        deadline = time.monotonic() + settle_s
        while self._is_latest_locked(turn_id, revision):
            # A candidate is waited out even past the deadline, but ending one does not end the window.
            self._wait_out_pending_locked(turn_id, revision, PENDING_REOPEN_WAIT_TIMEOUT_S)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._condition.wait(remaining)
        return self._is_latest_locked(turn_id, revision)

    def _commit_newest_locked(self, turn_id: str, revision: int) -> None:
        state = self._turns.get(turn_id)
        if state is None or state.newest != revision:
            return
        if self._has_pending_on_locked(turn_id, revision):
            logger.debug("commit of turn %s revision %d deferred: reopen pending", turn_id, revision)
            return
        self._commit_locked(state, revision)

    def _is_latest_locked(self, turn_id: str, revision: int) -> bool:
        state = self._turns.get(turn_id)
        return state is None or state.newest == revision

    def _add_turn_locked(self, turn_id: str, revision: int) -> _TurnState:
        state = _TurnState(newest=revision)
        self._turns[turn_id] = state
        self._condition.notify_all()
        self._evict_locked()
        return state

    def _raise_locked(self, turn_id: str, state: _TurnState, revision: int) -> None:
        state.newest = revision
        # Grace only ever belongs to the newest revision, so a raise ends it.
        state.grace = None
        self._turns.move_to_end(turn_id)
        self._condition.notify_all()
        self._evict_locked()

    def _commit_locked(self, state: _TurnState, revision: int) -> None:
        if state.committed is None or revision > state.committed:
            state.committed = revision
        self._condition.notify_all()

    def _commit_if_latest_locked(self, turn_id: str, revision: int) -> bool:
        state = self._turns.get(turn_id)
        if state is None:
            # Dropping work the tracker never ordered would be worse than letting it through.
            return True
        if state.newest != revision:
            return False
        self._commit_locked(state, revision)
        return True

    def _live_pending_locked(self, turn_id: str, state: _TurnState) -> _Pending | None:
        """The turn's candidate, dropping it first when it outlived the pending timeout."""
        pending = state.pending
        if pending is not None and time.monotonic() - pending.started_at >= PENDING_REOPEN_WAIT_TIMEOUT_S:
            self._time_out_pending_locked(turn_id, state, pending)
            return None
        return pending

    def _pending_on_locked(self, turn_id: str, revision: int) -> _Pending | None:
        state = self._turns.get(turn_id)
        if state is None:
            return None
        pending = self._live_pending_locked(turn_id, state)
        return pending if pending is not None and pending.base == revision else None

    def _has_pending_on_locked(self, turn_id: str, revision: int) -> bool:
        return self._pending_on_locked(turn_id, revision) is not None

    def _grace_left_locked(self, turn_id: str, revision: int) -> float:
        state = self._turns.get(turn_id)
        if state is None or state.grace is None or state.grace.revision != revision:
            return 0.0
        return max(0.0, state.grace.until - time.monotonic())

    def _answer_locked(self, turn_id: str, revision: int, *, commit: bool) -> bool:
        """`is_latest`, or with `commit` the `commit_if_latest` answer (committing when latest)."""
        return (
            self._commit_if_latest_locked(turn_id, revision)
            if commit
            else self._is_latest_locked(turn_id, revision)
        )

    def _wait_locked(self, turn_id: str, revision: int, *, grace: bool, commit: bool) -> bool:
        """The blocking forms: wait out a candidate pending on `revision` (and its grace when `grace`),
        then answer (and commit)."""
        if grace:
            self._wait_out_gate_locked(turn_id, revision)
        else:
            self._wait_out_pending_locked(turn_id, revision, PENDING_REOPEN_WAIT_TIMEOUT_S)
        return self._answer_locked(turn_id, revision, commit=commit)

    def _try_locked(self, turn_id: str, revision: int, *, grace: bool, commit: bool) -> bool | None:
        """The `try_` forms: False once superseded (no candidate can make it latest again), None while
        gated (a candidate pending on `revision`, or its grace when `grace`), else latest (and commit)."""
        if self._superseded_locked(turn_id, revision):
            return False
        gated = (
            self._is_gated_locked(turn_id, revision)
            if grace
            else self._has_pending_on_locked(turn_id, revision)
        )
        if gated:
            return None
        return self._answer_locked(turn_id, revision, commit=commit)

    def _superseded_locked(self, turn_id: str, revision: int) -> bool:
        state = self._turns.get(turn_id)
        return state is not None and state.newest != revision

    def _is_gated_locked(self, turn_id: str, revision: int) -> bool:
        return (
            self._has_pending_on_locked(turn_id, revision) or self._grace_left_locked(turn_id, revision) > 0
        )

    def _drop_pending_locked(self, state: _TurnState) -> None:
        state.pending = None
        self._condition.notify_all()
        # The turn may have been kept past the bound only for its candidate.
        self._evict_locked()

    def _time_out_pending_locked(self, turn_id: str, state: _TurnState, pending: _Pending) -> None:
        logger.warning(
            "reopen candidate %d for turn %s (base %d) timed out; dropping it",
            pending.candidate,
            turn_id,
            pending.base,
        )
        self._drop_pending_locked(state)

    def _wait_out_pending_locked(
        self, turn_id: str, revision: int, timeout_s: float, *, stop_when_superseded: bool = True
    ) -> None:
        """Wait until no candidate on `revision` is pending; drop it once `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            pending = self._pending_on_locked(turn_id, revision)
            if pending is None:
                return
            if stop_when_superseded and not self._is_latest_locked(turn_id, revision):
                return
            now = time.monotonic()
            if now >= deadline:
                self._time_out_pending_locked(turn_id, self._turns[turn_id], pending)
                return
            expires_at = pending.started_at + PENDING_REOPEN_WAIT_TIMEOUT_S
            self._condition.wait(min(deadline, expires_at) - now)

    def _wait_out_gate_locked(self, turn_id: str, revision: int) -> None:
        """Wait out a pending candidate and the grace, returning as soon as `revision` is superseded."""
        while self._is_latest_locked(turn_id, revision):
            if self._has_pending_on_locked(turn_id, revision):
                self._wait_out_pending_locked(turn_id, revision, PENDING_REOPEN_WAIT_TIMEOUT_S)
                continue
            grace_left = self._grace_left_locked(turn_id, revision)
            if grace_left <= 0:
                return
            self._condition.wait(grace_left)

    def _evict_locked(self) -> None:
        """Forget the least recently raised turns beyond the bound, sparing those with candidate or grace."""
        if self._max_tracked_turns <= 0 or len(self._turns) <= self._max_tracked_turns:
            return
        now = time.monotonic()
        evictable = [
            turn_id
            for turn_id, state in self._turns.items()
            if state.pending is None and (state.grace is None or state.grace.until <= now)
        ]
        for turn_id in evictable[: max(0, len(evictable) - self._max_tracked_turns)]:
            del self._turns[turn_id]
