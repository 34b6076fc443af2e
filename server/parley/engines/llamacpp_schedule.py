"""Which replies the llama.cpp engine (llm_llamacpp.py) serves, and when: its requests, the order they
get a sequence of the KV cache in, which of them take part in a step, and where work of no live call
may go without costing a live call its kept conversation.

Live calls come first: a reply due first (engines/urgency.py) is stepped first, a reply whose caller
waits sits the step out, and work of no live call (due `NEVER`) gets no sequence while a call's reply
waits for one and no step while any call's reply is in flight.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parley.engines.llamacpp_model import COPY_MIN_TOKENS, Sequence, common_prefix
from parley.engines.tool_grammar import ToolCallGrammar
from parley.engines.urgency import due_by, held_by, in_background

# A reply whose caller has not taken this many of its tokens sits the next step out: a caller who reads
# on keeps far ahead of it (a step is ~40 ms), one who waits pauses its reply within a token or two.
HOLD_AHEAD = 2
SAME_DUE_S = 0.05  # replies due this close together share a step (see most_urgent)
# Work of no live call reads this many prompt tokens a step at most: a live reply, or Whisper, that
# starts meanwhile waits for that step (~10 ms a token on 2 cores), no longer than for a decoding step.
BACKGROUND_PREFILL_TOKENS = 4


@dataclass
class Request:
    """One reply (or a prompt read ahead) asked of the engine, from its asking until it is released."""

    prompt: list[int]
    limit: int  # tokens to say at most (0: only read the prompt)
    steps: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    stopped: bool = False  # its caller is gone or told to stop: dropped at the next step
    said: list[int] = field(default_factory=list)
    asked_at: float = field(default_factory=time.monotonic)
    started_at: float = 0.0
    sequence: Sequence | None = None
    unread: list[int] = field(default_factory=list)  # prompt tokens not yet in the KV cache
    next_token: int | None = None  # sampled, to be fed at the next step
    reused: int = 0  # prompt tokens found already in the KV cache
    waiting: bool = False  # its caller is asking whether to stop, which may wait (for the reply's audio)
    earlier: list[list[int]] = field(default_factory=list)  # the conversation's earlier replies' tokens
    # When its next words are due: the asking reply's deadline (engines/urgency.py), read where it is asked.
    due: Callable[[], float] = field(default_factory=due_by)
    # Whether its caller wants it to wait (engines/urgency.py, `HELD`): while its first piece is voiced.
    held: Callable[[], bool] = field(default_factory=held_by)
    tool_grammar: str | None = None  # what a call to the offered tools may be (engines/tool_grammar.py)
    call: ToolCallGrammar | None = None  # the tool call being written, held to that grammar
    called: bool = False  # it opened a tool call
    words_only: bool = False  # offered tools that it may not call this time
    json_reply: bool = False  # held to `tool_grammar` (a JSON Schema's) from its first token
    background: bool = field(init=False)  # for no live call (engines/urgency.py): yields to every call's

    def __post_init__(self) -> None:
        self.background = in_background(self.due)


def most_urgent(ready: list[Request]) -> list[Request]:
    """The replies a step is for: the one due first (engines/urgency.py), and those due within SAME_DUE_S.

    On this CPU a step costs nearly as much per reply however many share it (two threads, 100 tokens of
    conversation each: one reply's token 15 ms, two 28, three 37, four 40, six 65): a step for all of
    them brings every reply's first words late together, where one at a time brings the first caller's
    at once and the last one's little later. A reply that speaks already is due once the speech of what
    it said is about to run out, so a caller still waiting for their first words goes ahead of it.
    """
    dues = [(r.due(), r) for r in ready]
    first = min(due for due, _ in dues)
    return [r for due, r in dues if due <= first + SAME_DUE_S]


def may_step(request: Request, live: bool) -> bool:
    """Whether `request` takes part in the next step: its prompt is unread, or its caller has taken its
    last tokens and neither waits nor holds it. Work of no live call waits while any call's is in flight
    (`live`) or its own rule holds it (engines/urgency.py), its prompt too."""
    if request.background and (live or request.held()):
        return False
    if request.unread:
        return True
    return not request.waiting and not request.held() and request.steps.qsize() < HOLD_AHEAD


def room_for_background(
    free: list[Sequence],
    prompt: list[int],
    sequences: list[Sequence],
    start: list[int],
    background_seqs: set[int],
) -> list[Sequence]:
    """The free sequences work of no live call may take: one that holds the start of its prompt (an
    analysis's earlier question about the same call), else an empty one or one such work used last,
    else the one used longest ago, unless it alone holds what every conversation begins with (a live
    call's conversation is used at each of its turns, and a new call copies that start)."""
    sharing = [s for s in free if common_prefix(s.tokens, prompt) >= COPY_MIN_TOKENS]
    if sharing:
        return sharing
    spare = [s for s in free if not s.tokens or s.seq_id in background_seqs]
    if spare:
        return [min(spare, key=lambda s: (bool(s.tokens), s.used_at))]
    holders = [s for s in sequences if start and common_prefix(s.tokens, start) == len(start)]
    others = [s for s in free if holders != [s]] or free
    return [min(others, key=lambda s: s.used_at)]


def reading_ahead_of(sequences: list[Sequence], prompt: list[int]) -> bool:
    """Whether a sequence that `prompt` takes up whole is reading ahead (`warm`, the opening of a
    caller's turn): the prompt waits for that step, after which the sequence holds more of it."""
    return any(
        isinstance(s.request, Request)
        and s.request.limit <= 0
        and common_prefix(s.tokens, prompt) == len(s.tokens)
        for s in sequences
    )


def next_to_admit(waiting: list[Request]) -> Request:
    """The waiting request to place next: a live call's, in order; else work of no live call."""
    return next((r for r in waiting if not r.background), waiting[0])
