"""What a call tells the world: its events, its state and flushed audio, to its transport and watchers.

The call's parts (its replies, its turn decisions) report through this, not through the call itself:
each gets what it says to, not the whole call. The state's transitions are all checked here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

# What the caller's page and /api/calls show of a call. A transport sets the first ones (dialing,
# ringing) while it sets the call up; the turns and replies set the rest; "ended" is for good.
CallState = Literal[
    "starting", "dialing", "ringing", "listening", "user_speaking", "thinking", "agent_speaking", "ended"
]
SETUP_STATES: tuple[CallState, ...] = ("starting", "dialing", "ringing")


def may_move(current: CallState, new: CallState) -> bool:
    """Whether a call in `current` may go to `new`: nothing leaves "ended", and a call that has started
    talking never goes back to setting up (a late 180 Ringing changes nothing)."""
    if current == new or current == "ended":
        return False
    return new not in SETUP_STATES or current in SETUP_STATES


class CallListener(Protocol):
    """What a call tells its transport; called from any thread, must not block."""

    def deliver_event(self, payload: dict[str, Any]) -> None: ...

    def audio_flushed(self) -> None: ...


Watcher = Callable[[dict[str, Any]], None]


class CallSignals:
    """One per call: its state, and who hears its events (its transport, and watchers such as an
    operator's event stream). Thread-safe enough for its use: each field is replaced whole."""

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.state: CallState = "starting"
        self._listener: CallListener | None = None
        self._watchers: list[Watcher] = []

    @property
    def listener(self) -> CallListener | None:
        """The transport that hears the events (None before it is attached and after the call is released)."""
        return self._listener

    def attach(self, listener: CallListener) -> None:
        self._listener = listener

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Also hear the events; returns how to stop."""
        self._watchers = [*self._watchers, watcher]

        def unwatch() -> None:
            self._watchers = [w for w in self._watchers if w is not watcher]

        return unwatch

    def emit(self, payload: dict[str, Any]) -> None:
        listener = self._listener
        for deliver in (listener.deliver_event if listener else None, *self._watchers):
            if deliver is None:
                continue
            try:
                deliver(payload)
            except Exception:
                log.exception("event_delivery_failed", extra={"call_id": self.call_id})

    def set_state(self, state: CallState) -> None:
        if may_move(self.state, state):
            self.state = state
            self.emit({"type": "state", "state": state})

    def audio_flushed(self) -> None:
        """The audio queued for the caller was dropped: a carrier clears what it buffered."""
        listener = self._listener
        if listener is not None:
            try:
                listener.audio_flushed()
            except Exception:
                log.exception("flush_notice_failed", extra={"call_id": self.call_id})

    def clear(self) -> None:
        """Forget the transport and watchers (the call ended and was released)."""
        self._listener = None
        self._watchers = []
