"""When the work asked of an engine is due, so that an engine serving many calls serves the most urgent first.

On this CPU a llama.cpp step costs nearly as much per reply however many replies share it (numbers in
llamacpp_schedule.py, `most_urgent`): stepping every reply in flight together brings six callers' first
words late together. Given when each reply's next words are due, the LLM steps the one due first, and the
callers hear their answers one after another, the first at once.

Who the work is for travels with it: a call's stage sets `URGENCY` to a function that reads its reply's
deadline (`Stage.due`; the LLM stage's is `Response.text_due_at`) while it asks an engine for something;
the deadline workers (engines/deadlines.py) carry it to the thread that does the asking, and the engine
reads it (`due_by`) when the work is handed over. Work with no reply (a warm-up, a benchmark) is due when
it is asked for. Work for no live call (a post-call analysis) is due `NEVER`: an engine does it only
when no live call's work waits, and holds it while that work is in flight (llm_llamacpp.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextvars import ContextVar

# When the work being asked for is due (monotonic seconds); read again as the reply moves on.
URGENCY: ContextVar[Callable[[], float] | None] = ContextVar("parley_urgency", default=None)
# Whether the work being asked for should wait now, for another engine's work the caller needs first (a
# reply whose first piece is being voiced: its next words are of no use before that audio, and a step
# of the LLM then takes the cores Piper is computing on).
HELD: ContextVar[Callable[[], bool] | None] = ContextVar("parley_held", default=None)
# The deadline of work no caller waits for: served after every live call's, whatever their deadlines.
NEVER = math.inf


def due_by() -> Callable[[], float]:
    """The deadline of the work about to be asked for: the reply's, or now for work of no reply."""
    urgency = URGENCY.get()
    if urgency is not None:
        return urgency
    asked = time.monotonic()
    return lambda: asked


def never_due() -> float:
    """`URGENCY` for work of no live call (a post-call analysis)."""
    return NEVER


def in_background(due: Callable[[], float]) -> bool:
    """Whether work of deadline `due` is for no live call (it yields to every call's work)."""
    return due() == NEVER


def held_by() -> Callable[[], bool]:
    """Whether the work about to be asked for should wait now: the reply's own rule, or never."""
    held = HELD.get()
    return held if held is not None else _never


def _never() -> bool:
    return False
