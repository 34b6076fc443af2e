"""Speculative replies: a reply started at the turn's first pause, held until the turn has ended.

At the first silent VAD chunk of a pause (the README's "Turn-taking that feels like a person") the call starts
the whole reply (STT, LLM, TTS) on the turn's audio so far, tagged with the turn's revision and the
current cancel generation. That reply is a *draft* until the end-of-turn decision:

- the turn ends with no speech since the pause: the draft is *adopted*: it is the turn's reply, its
  audio is let through (once the reopen grace allows) and it is committed as any other;
- the caller speaks again before the turn ended: the draft is cancelled through the call's cancel scope,
  so nothing of it is ever played and nothing of it enters the history.

A call has at most one draft (the next pause cannot come before the speech that cancels the last one),
so the work speculation can waste is bounded by one reply per pause. While a draft is held, the
Outbound's gate answers None for its tag, and the LLM stage does not run tools with side effects for it
(`wait`). The user's transcript event of a draft is held back with it, so a caller never sees the
transcript of half a turn.

Thread-safe: the VAD thread starts, adopts and cancels drafts; the stage threads and the transport's
puller ask about them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from parley import metrics
from parley.pipeline.messages import Response, Tag


@dataclass
class _Draft:
    response: Response
    started_at: float = field(default_factory=time.monotonic)
    held_events: list[dict[str, Any]] = field(default_factory=list)


class SpeculativeReplies:
    """The call's draft reply, if any: started before the end of its turn, not yet adopted."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._draft: _Draft | None = None

    def start(self, response: Response) -> Response | None:
        """Make `response` the draft; returns the draft it replaces (the caller cancels that one)."""
        with self._condition:
            previous = self._draft
            self._draft = _Draft(response)
            self._condition.notify_all()
        return previous.response if previous is not None else None

    def holds(self, tag: Tag) -> bool:
        """Whether output tagged `tag` belongs to a draft whose turn has not ended (never blocks)."""
        with self._condition:
            return self._draft is not None and self._draft.response.tag == tag

    def draft(self) -> Response | None:
        with self._condition:
            return self._draft.response if self._draft is not None else None

    def adopt(
        self, turn_id: str, revision: int, speech_end: float
    ) -> tuple[Response, list[dict[str, Any]]] | None:
        """The turn ended: its draft, when it was made for exactly this speech, becomes its reply.

        Returns the draft and the events held back for it, or None when there is no such draft.
        """
        with self._condition:
            draft = self._draft
            if draft is None:
                return None
            tag, response = draft.response.tag, draft.response
            if (tag.turn_id, tag.revision, response.speech_end) != (turn_id, revision, speech_end):
                return None
            self._draft = None
            self._condition.notify_all()
        metrics.SPECULATIVE_REPLIES_TOTAL.labels(outcome="used").inc()
        return response, draft.held_events

    def take(self) -> Response | None:
        """Remove the draft (it is being cancelled); returns it, or None when there was none."""
        with self._condition:
            draft, self._draft = self._draft, None
            self._condition.notify_all()
        if draft is None:
            return None
        metrics.SPECULATIVE_REPLIES_TOTAL.labels(outcome="wasted").inc()
        metrics.SPECULATION_WASTED_SECONDS.observe(time.monotonic() - draft.started_at)
        return draft.response

    def hold_event(self, response: Response, payload: dict[str, Any]) -> bool:
        """Keep `payload` until `response`'s turn ends, if it is the draft; False: send it now."""
        with self._condition:
            if self._draft is None or self._draft.response is not response:
                return False
            self._draft.held_events.append(payload)
            return True

    def wait(self, tag: Tag, timeout_s: float) -> bool:
        """Block up to `timeout_s` while `tag` is held; True once it is not (adopted or cancelled)."""
        with self._condition:
            return self._condition.wait_for(lambda: not self._holds_locked(tag), timeout_s)

    def _holds_locked(self, tag: Tag) -> bool:
        return self._draft is not None and self._draft.response.tag == tag
