"""How long a closed turn can be reopened: until the caller has heard its reply, not a fixed window.

A turn closes after `end_of_turn_ms` of silence, and its reply is held `reopen_grace_ms` more in case
the caller goes on (the tracker's grace). A fixed grace makes a choice it cannot get right on every
machine: long, and every answer waits for it (500 ms of a 0.8 s answer on a 2-core CPU, everything on a
GPU); short, and a caller who pauses longer hears the start of a reply to half a question, which then
becomes a turn of its own.

Here the grace is only the least hold. After it, the turn stays open to a reopen for as long as nothing
of its reply has reached the caller and nothing has been done for it (`reopen_unheard_ms` at most): the
pause may last as long as the reply takes to compute, and the merged question is answered as a whole.
The point of no return is the reply's first audio frame let through the Outbound's gate, or a tool
with side effects started for the turn (`settle`). Both that and beginning a reopen candidate happen
under one lock, so the two can never both win: either the candidate holds the reply back (the gate
answers None while it is pending), or the reply was let through first and the speech is a barge-in.

A revision can also be held (`hold`) until a given moment, longer than its grace: a turn whose transcript
stopped mid-sentence (pipeline/unfinished.py). While held it is open to a reopen, and unsettled, as in its
grace; a hold is released when the speech it was made for goes on (the reply it held was cancelled).

Thread-safe: the transport's puller asks the gate, the LLM stage settles before a side effect, the VAD
thread begins candidates. Lock order: this lock, then the tracker's (the tracker calls nothing back).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from parley.pipeline.turns import SpeculativeTurnTracker

SETTLED_KEPT = 16  # settled revisions remembered: a call has one closed turn at a time
HOLD_POLL_S = 0.05  # how often `settle` looks again while a hold is left


class ReopenWindow:
    """Which closed turns the caller may still reopen, and the atomic point where that ends."""

    def __init__(self, tracker: SpeculativeTurnTracker) -> None:
        self.tracker = tracker
        self._lock = threading.Lock()
        self._settled: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._holds: dict[tuple[str, int], float] = {}  # revision -> time.monotonic() it is held until

    def hold(self, turn_id: str, revision: int, until: float) -> None:
        """Hold `revision` back until `until` (time.monotonic()), or longer if it already was."""
        with self._lock:
            key = (turn_id, revision)
            self._holds[key] = max(until, self._holds.get(key, 0.0))
            now = time.monotonic()
            for stale in [k for k, held in self._holds.items() if held <= now]:
                del self._holds[stale]

    def release(self, turn_id: str, revision: int) -> None:
        """Drop the hold on `revision` (the reply it was made for was cancelled)."""
        with self._lock:
            self._holds.pop((turn_id, revision), None)

    def held_for(self, turn_id: str | None, revision: int | None) -> float:
        """Seconds `revision` is still held (0.0: not held)."""
        with self._lock:
            return self._held_for_locked(turn_id, revision)

    def _held_for_locked(self, turn_id: str | None, revision: int | None) -> float:
        if turn_id is None or revision is None:
            return 0.0
        return max(0.0, self._holds.get((turn_id, revision), 0.0) - time.monotonic())

    def is_open(self, turn_id: str, revision: int, *, unheard: bool) -> bool:
        """Whether speech now could reopen `revision`: its grace is left (or a candidate is pending), or
        it is held or `unheard` (the caller allows that time), and it is unsettled, the newest and not
        committed."""
        with self._lock:
            return self._is_open_locked(turn_id, revision, unheard)

    def begin(self, turn_id: str, revision: int, *, unheard: bool) -> int | None:
        """Propose a reopen of `revision` (the tracker's candidate), or None when it is no longer open."""
        with self._lock:
            if not self._is_open_locked(turn_id, revision, unheard):
                return None
            return self.tracker.begin_reopen_candidate(turn_id, revision)

    def try_settle(self, turn_id: str | None, revision: int | None) -> bool | None:
        """May work for `revision` reach the caller now? None while its grace or hold is left or a
        candidate is pending, False when it was superseded. True settles it: it can no longer be reopened."""
        with self._lock:
            answer = self.tracker.try_is_latest_after_reopen_grace(turn_id, revision)
            if answer and self._held_for_locked(turn_id, revision) > 0:
                return None
            if (
                answer
                and turn_id is not None
                and revision is not None
                and (turn_id, revision) not in self._settled
            ):
                # Asked for every frame of a reply: recorded once, the first time.
                self._settled[(turn_id, revision)] = None
                while len(self._settled) > SETTLED_KEPT:
                    self._settled.popitem(last=False)
            return answer

    def settle(self, turn_id: str | None, revision: int | None) -> bool:
        """Block until `revision` can be settled (before a side effect); False when it was superseded."""
        while True:
            if not self.tracker.is_latest_after_reopen_grace(turn_id, revision):
                return False
            answer = self.try_settle(turn_id, revision)
            if answer is not None:
                return answer
            # Held, or a candidate began between the two: wait it out too.
            held = self.held_for(turn_id, revision)
            if held > 0:
                time.sleep(min(held, HOLD_POLL_S))

    def _is_open_locked(self, turn_id: str, revision: int, unheard: bool) -> bool:
        tracker = self.tracker
        if tracker.has_pending_reopen_or_grace(turn_id, revision):
            return True
        return (
            (unheard or self._held_for_locked(turn_id, revision) > 0)
            and (turn_id, revision) not in self._settled
            and tracker.is_latest(turn_id, revision)
            and not tracker.is_committed(turn_id, revision)
        )
