"""A reply's audio is made when it will soon be heard, not as soon as it can be.

A reply plays in real time; Piper makes it ten times faster (~0.1 core-second per second of audio
here). Made flat out, a reply the caller cuts a second in has had all of it made for nothing (0.75
core-seconds for a two-sentence reply), and a long one takes the cores while another call's question
waits. So the TTS stage synthesises at most `speak_ahead_ms` ahead of what the caller has heard.
The LLM is not paced: llama.cpp decodes every reply's next token in one step, and a reply
held back leaves those steps to decode alone (pacing it too measured no better and cost more CPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from parley.pipeline.messages import Response

POLL_S = 0.05  # how often a paced stage looks again: far below the lead, far above the cost of a look


def wait_for_playout(response: Response, lead_s: float, stale: Callable[[], bool]) -> None:
    """Block while more than `lead_s` of `response`'s audio is still unheard, until the reply is
    `stale()`. A lead of 0 or less never waits."""
    while lead_s > 0:
        over = response.unplayed_s() - lead_s
        if over <= 0 or stale():
            return
        time.sleep(min(over, POLL_S))
