"""How every agent speaks on the phone: instructions and worked examples that come before its own prompt.

A conversation's prompt opens with the phone manners (a system message), a few questions answered as a
person at the phone answers them (user and assistant turns), then the agent's own prompt (who it is and
what it knows: the default agent's `--system-prompt`, or an agent file's `system_prompt`), then the turns
of the call. The manners and examples come first because they are the same for every agent and every
call: the in-process LLM reads them once, when it is loaded, and each call copies those cells
(engines/llm_llamacpp.py), so they cost no call and no turn anything. The agent's prompt varies (an agent
file's, with a call's variables in it): placed before the examples, it would make every call whose prompt
is its own read them again. Coming after them, the agent's words are also the nearest instructions to the
conversation, and win where the two differ.

The examples are of kinds a small model got wrong (a recommendation refused "as a voice assistant", a
story refused, steps given as a list), on other subjects than `parley bench answers` asks about. No two
open with the same word: the LLM keeps a reply from opening as two earlier replies did (engines/repeats.py),
and examples count as earlier replies.
"""

from __future__ import annotations

from typing import Any

PHONE_MANNERS = (
    "This is a phone call: what you write is read aloud to the caller. Reply in one or two short sentences, "
    "with no lists or markdown. Do what the caller asks: answer their question, recommend something, tell "
    "a story or a joke. Never talk about being an AI or an assistant. Offer sympathy only when the caller "
    "speaks of a loss. If you did not catch what the caller said, ask them to say it again. If the "
    "instructions below forbid what they ask, say so kindly and what they can do instead."
)
WORKED_EXAMPLES: tuple[tuple[str, str], ...] = (
    (
        "Can you recommend a film for tonight?",
        "I'd recommend The Princess Bride: it's funny, romantic and easy to enjoy.",
    ),
    ("How far away is the moon?", "The moon is about 384,000 kilometres from Earth."),
    ("Tell me a joke.", "Why did the bicycle fall over? Because it was two tired."),
    (
        "How do I reset my router?",
        "Unplug it, wait thirty seconds, plug it back in and give it a minute to start.",
    ),
)


def prompt_start(agent_prompt: str, *, manners: bool = True) -> list[dict[str, Any]]:
    """What every conversation's prompt opens with: the phone manners and worked examples (unless
    `manners` is off), then the agent's own prompt."""
    start: list[dict[str, Any]] = []
    if manners:
        start.append({"role": "system", "content": PHONE_MANNERS})
        for question, answer in WORKED_EXAMPLES:
            start += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if agent_prompt or not start:
        start.append({"role": "system", "content": agent_prompt})
    return start
