"""An LLM double for post-call analyses: it answers a live call as ScriptedLlm does, and each question of
an analysis (analysis/prompts.py) with the answer a test gave it; it can be held at the start of an
analysis's question until the test lets it go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from parley.analysis import prompts
from parley.engines.llm import Message
from parley.engines.toolcalls import ToolCall
from tests.doubles import ScriptedLlm

SUMMARY = "The caller asked about order 445566; the agent said it ships on Monday."
EXTRACTION = '{"order_id": "445566", "resolved": true}'
VERDICT = '{"reason": "The agent gave the order\'s status.", "success": true}'


def question(messages: list[Message]) -> str | None:
    """Which analysis question `messages` ask (summary, extraction, verdict), or None for a live call's."""
    if not messages or not str(messages[0].get("content", "")).startswith(prompts.INSTRUCTIONS):
        return None
    asked = str(messages[-1].get("content", ""))
    for name, task in (
        ("summary", prompts.SUMMARY_TASK),
        ("extraction", prompts.EXTRACTION_TASK.split("{schema}")[0]),
        ("verdict", prompts.VERDICT_TASK.split("{criterion}")[0]),
    ):
        if task in asked:
            return name
    raise AssertionError(f"an analysis question this double does not know: {asked[-200:]!r}")


class AnalystLlm(ScriptedLlm):
    """`answers`: per question, the words it writes (or the error it raises); `gate`: while clear, an
    analysis's question waits (stopping when told to); `asked` is set whenever one starts."""

    def __init__(
        self, answers: dict[str, str | Exception] | None = None, gate: threading.Event | None = None
    ) -> None:
        super().__init__(reply="Your order ships on Monday.", token_s=0.005)
        self.answers: dict[str, str | Exception] = {
            "summary": SUMMARY,
            "extraction": EXTRACTION,
            "verdict": VERDICT,
            **(answers or {}),
        }
        self.gate = gate
        self.asked = threading.Event()
        self.questions: list[tuple[str, list[Message]]] = []

    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: list[dict[str, Any]] | None = None,
        *,
        calls: bool = True,
    ) -> Iterator[str | ToolCall]:
        name = question(messages)
        if name is None:
            yield from super().stream(messages, should_stop, tools, calls=calls)
            return
        self.questions.append((name, messages))
        self.asked.set()
        while self.gate is not None and not self.gate.is_set():
            if should_stop():
                return
            time.sleep(0.01)
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        for start in range(0, len(answer), 8):
            yield answer[start : start + 8]
