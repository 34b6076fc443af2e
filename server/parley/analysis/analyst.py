"""One call's analysis: the questions its agent file's `[analysis]` asks, put to the LLM, and the answers
checked.

The summary is the model's words. The extraction and the verdict are JSON, asked of an engine that can
hold its reply to a JSON Schema (`JsonReplies`: llama.cpp by the schema's grammar, an endpoint by
`response_format`), else read out of its words; either way the JSON is checked against its schema
(jsonschema) before it is kept. A part that fails keeps its reason in `errors`, and the others stand.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
import jsonschema.exceptions

from parley.agent.analysis_spec import AnalysisSpec
from parley.analysis import prompts
from parley.engines.llm import JsonReplies, LlmEngine, Message
from parley.log import event

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 300
Outcome = Literal["ok", "invalid", "failed"]  # every part answered / one answered wrong / the LLM failed
OUTCOMES: tuple[Outcome, ...] = ("ok", "invalid", "failed")


class AnalysisStopped(Exception):
    """The service is closing: the analysis is left unfinished."""


class _Invalid(ValueError):
    """The model's answer is not what was asked for (not JSON, or not of the schema)."""


@dataclass(frozen=True)
class Analysis:
    """What is kept of a call's analysis (`value`: its stored shape), and how it went."""

    value: dict[str, Any]
    outcome: Outcome


class Analyst:
    """Asks `llm` about calls, one question at a time. `turn` waits until the LLM may be asked (live
    calls first) and says False when the service is closing; `stopping` says whether it is."""

    def __init__(self, llm: LlmEngine, turn: Callable[[], bool], stopping: Callable[[], bool]) -> None:
        self.llm = llm
        self._turn = turn
        self._stopping = stopping

    def analyse(self, spec: AnalysisSpec, turns: Sequence[Mapping[str, Any]]) -> Analysis:
        """The analysis of the call whose conversation as heard is `turns`. Raises AnalysisStopped."""
        started = time.monotonic()
        text = prompts.transcript(turns)
        value: dict[str, Any] = {}
        errors: dict[str, str] = {}
        outcome: Outcome = "ok"

        def part(name: str, ask: Callable[[], Any]) -> None:
            nonlocal outcome
            try:
                value[name] = ask()
                return
            except _Invalid as exc:
                errors[name] = _short(str(exc))
                outcome = "failed" if outcome == "failed" else "invalid"
            except AnalysisStopped:
                raise
            except Exception as exc:  # the engine's failure costs this part, never the service
                if self._stopping():
                    raise AnalysisStopped from exc
                errors[name] = _short(f"the LLM failed: {exc}")
                outcome = "failed"
            value[name] = None
            event(log, "analysis_part_failed", logging.WARNING, part=name, reason=errors[name])

        if spec.summary:
            part("summary", lambda: self._summary(spec, text))
        if spec.schema is not None:
            schema = dict(spec.schema)
            task = prompts.extraction_task(schema)
            part("extraction", lambda: self._json(prompts.messages(spec.prompt, text, task), schema))
        if spec.success:
            part("verdict", lambda: self._verdict(spec, text))
        value["errors"] = errors
        value["status"] = "ok" if not errors else "error"
        value["seconds"] = round(time.monotonic() - started, 3)
        value["analyzed_at"] = time.time()
        return Analysis(value, outcome)

    def _summary(self, spec: AnalysisSpec, text: str) -> str:
        said = self._words(prompts.messages(spec.prompt, text, prompts.SUMMARY_TASK)).strip()
        if not said:
            raise _Invalid("the model said nothing")
        return said

    def _verdict(self, spec: AnalysisSpec, text: str) -> dict[str, Any]:
        task = prompts.verdict_task(spec.success)
        answer = self._json(prompts.messages(spec.prompt, text, task), prompts.VERDICT_SCHEMA)
        return {"success": answer["success"], "reason": answer["reason"].strip()}

    def _json(self, messages: list[Message], schema: dict[str, Any]) -> Any:
        """The model's answer as JSON of `schema`; _Invalid when it is not."""
        if isinstance(self.llm, JsonReplies):
            self._wait_for_turn()
            written = self.llm.json_reply(messages, schema, self._stopping)
        else:
            written = self._words(messages)
        if self._stopping():
            raise AnalysisStopped
        # The reasons kept say where the answer went wrong, never what it said (it retells the call).
        try:
            answer = json.loads(_json_text(written))
        except json.JSONDecodeError as exc:
            event(log, "analysis_answer_unread", logging.DEBUG, text=written)
            raise _Invalid(f"not JSON: {exc.msg} at character {exc.pos} of {len(written)}") from None
        problem = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(answer)
        )
        if problem is not None:
            event(log, "analysis_answer_unread", logging.DEBUG, text=written)
            where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem.absolute_path)
            wanted = json.dumps(problem.validator_value, ensure_ascii=False)[:100]
            raise _Invalid(f"not of the schema: {where} fails {problem.validator} {wanted}")
        return answer

    def _words(self, messages: list[Message]) -> str:
        self._wait_for_turn()
        said = "".join(d for d in self.llm.stream(messages, self._stopping) if isinstance(d, str))
        if self._stopping():
            raise AnalysisStopped
        return said

    def _wait_for_turn(self) -> None:
        if not self._turn():
            raise AnalysisStopped


def _json_text(written: str) -> str:
    """The JSON object in a model's words: what the outermost braces hold (a fence or a preamble
    around them left out), else the words as they are."""
    text = written.strip()
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else text


def _short(reason: str) -> str:
    return reason if len(reason) <= MAX_ERROR_CHARS else reason[: MAX_ERROR_CHARS - 3] + "..."
