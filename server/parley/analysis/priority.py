"""When a post-call analysis may use the shared LLM: after every live call's work, never before it.

The analysis runs in the background of the process's calls (engines/urgency.py): its work is due
`NEVER`, so the LLM serves any live call's reply first, and it is held while a live call is making a
reply (`thinking`: its speech is being transcribed, its reply written, its first audio made) or
another engine computes on the cores it would take (Whisper, Piper: engines/compute_load.py). The
llama.cpp engine also holds it while any live call's reply is in flight (llm_llamacpp.py) and reads its
prompt a few tokens a step; an engine that does not schedule steps (an endpoint) gets each question
only once nothing holds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol

from parley.engines.compute_load import COMPUTE
from parley.engines.urgency import HELD, URGENCY, never_due

POLL_S = 0.05  # how often a held analysis looks again (a step of the LLM is ~40 ms here)
BUSY_STATES = frozenset({"thinking"})


class LiveCall(Protocol):
    @property
    def state(self) -> str: ...


def held_by_calls(calls: Callable[[], Iterable[LiveCall]]) -> Callable[[], bool]:
    """The rule that holds an analysis: a live call is making a reply, or another engine computes."""

    def held() -> bool:
        if COMPUTE.busy():
            return True
        try:
            return any(call.state in BUSY_STATES for call in calls())
        except RuntimeError:  # the calls changed while they were read (another thread): look again soon
            return True

    return held


@contextmanager
def in_background(held: Callable[[], bool]) -> Iterator[None]:
    """Engine work asked for inside is of no live call: due `NEVER`, and held while `held()`."""
    urgency = URGENCY.set(never_due)
    holding = HELD.set(held)
    try:
        yield
    finally:
        HELD.reset(holding)
        URGENCY.reset(urgency)


def wait_until_free(held: Callable[[], bool], stopping: threading.Event) -> bool:
    """Wait while `held()`; False when `stopping` is set first."""
    while held():
        if stopping.wait(POLL_S):
            return False
    return not stopping.is_set()
