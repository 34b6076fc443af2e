"""Running an agent's tools: a team's webhook or a Python function, behind one interface.

Tools run on their own worker threads, never on a call's LLM thread: a barge-in stops the spoken reply
at once while a tool call already made finishes and its result is kept. Arguments are validated against
the tool's JSON Schema first. A webhook gets the call's variables and, beside them, each one's source
(`variable_sources`: service, token or caller; agent/variables.py); a Python function gets them too when
it declares the keyword-only parameters `variables` and `variable_sources`. Whatever goes wrong (invalid
arguments, a timeout, a non-2xx, a crash) becomes an error result the model reads; it never ends the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from parley.agent.agentfile import ToolSpec
from parley.agent.signing import HEADER, sign
from parley.agent.variables import sources_of
from parley.engines.toolcalls import ToolCall
from parley.log import event

log = logging.getLogger(__name__)

MAX_RESULT_BYTES = 16_384  # what the model reads of a result; a larger answer is cut
TOOL_WORKERS = 16


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    content: str  # JSON text, what the model reads
    ok: bool
    seconds: float

    def as_record(self) -> dict[str, Any]:
        return {
            "tool_call_id": self.call.id,
            "name": self.call.name,
            "arguments": self.call.arguments,
            "result": self.content,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
        }


def error_result(call: ToolCall, message: str, started: float) -> ToolResult:
    return ToolResult(call, json.dumps({"error": message}), False, time.monotonic() - started)


def parse_arguments(spec: ToolSpec, call: ToolCall) -> dict[str, Any]:
    """The call's arguments, checked against the tool's schema; ValueError says what is wrong."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        raise ValueError("the arguments are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise ValueError("the arguments must be a JSON object")
    try:
        jsonschema.validate(arguments, dict(spec.parameters), cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ValueError(f"invalid arguments{' at ' + where if where else ''}: {exc.message}") from None
    return arguments


class ToolRunner:
    """One per process: a pool of workers that run tool calls for every call."""

    def __init__(self, secret: str = "", workers: int = TOOL_WORKERS) -> None:
        self.secret = secret
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool")

    def submit(
        self,
        spec: ToolSpec,
        call: ToolCall,
        *,
        call_id: str,
        variables: Mapping[str, str],
        on_result: Callable[[ToolResult], None] | None = None,
    ) -> concurrent.futures.Future[ToolResult]:
        """Run the call on a worker; `on_result` runs there too, before the future resolves."""

        def work() -> ToolResult:
            result = self.run(spec, call, call_id=call_id, variables=variables)
            if on_result is not None:
                try:
                    on_result(result)
                except Exception:
                    log.exception("tool_result_handling_failed", extra={"call_id": call_id})
            return result

        return self._pool.submit(work)

    def run(
        self, spec: ToolSpec, call: ToolCall, *, call_id: str, variables: Mapping[str, str]
    ) -> ToolResult:
        started = time.monotonic()
        try:
            arguments = parse_arguments(spec, call)
        except ValueError as exc:
            return error_result(call, str(exc), started)
        try:
            if spec.url:
                result = self._webhook(spec, call, arguments, call_id, variables)
            else:
                result = self._python(spec, arguments, variables)
        except TimeoutError:
            return error_result(call, f"the tool did not answer within {spec.timeout_ms} ms", started)
        except ToolFailed as exc:
            return error_result(call, str(exc), started)
        except Exception as exc:  # a team's function may raise anything: the model hears it, the call goes on
            log.warning("tool_failed", extra={"call_id": call_id, "tool": spec.name, "error": repr(exc)})
            return error_result(call, f"the tool failed: {type(exc).__name__}", started)
        content = result if isinstance(result, str) else json.dumps(result, default=str)
        if len(content.encode()) > MAX_RESULT_BYTES:
            content = content.encode()[:MAX_RESULT_BYTES].decode(errors="ignore")
        event(log, "tool_ran", call_id=call_id, tool=spec.name, seconds=round(time.monotonic() - started, 3))
        return ToolResult(call, content, True, time.monotonic() - started)

    def _webhook(
        self,
        spec: ToolSpec,
        call: ToolCall,
        arguments: dict[str, Any],
        call_id: str,
        variables: Mapping[str, str],
    ) -> Any:
        body = json.dumps(
            {
                "call_id": call_id,
                "tool_call_id": call.id,
                "name": spec.name,
                "arguments": arguments,
                "variables": dict(variables),
                "variable_sources": sources_of(variables),
            }
        ).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "parley"}
        if self.secret:
            headers[HEADER] = sign(body, self.secret)
        request = urllib.request.Request(spec.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=spec.timeout_ms / 1000) as response:
                payload = response.read(MAX_RESULT_BYTES * 4)
        except urllib.error.HTTPError as exc:
            raise ToolFailed(f"the tool answered HTTP {exc.code}") from None
        except (TimeoutError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                raise TimeoutError from None
            raise ToolFailed(f"the tool could not be reached: {reason}") from None
        try:
            return json.loads(payload)
        except ValueError:
            raise ToolFailed("the tool's answer is not JSON") from None

    def _python(self, spec: ToolSpec, arguments: dict[str, Any], variables: Mapping[str, str]) -> Any:
        function = spec.function
        if function is None:
            raise ToolFailed("the tool's function is missing")
        wanted = _call_parameters(function)
        # The model's arguments never stand in for what the service passes.
        arguments = {name: value for name, value in arguments.items() if name not in wanted}
        if "variables" in wanted:
            arguments["variables"] = dict(variables)
        if "variable_sources" in wanted:
            arguments["variable_sources"] = sources_of(variables)
        if inspect.iscoroutinefunction(function):
            return asyncio.run(asyncio.wait_for(function(**arguments), spec.timeout_ms / 1000))
        # A plain function cannot be stopped: it runs on in its worker, and the model hears of the timeout.
        inner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-fn")
        try:
            return inner.submit(function, **arguments).result(timeout=spec.timeout_ms / 1000)
        except concurrent.futures.TimeoutError:
            raise TimeoutError from None
        finally:
            inner.shutdown(wait=False)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _call_parameters(function: Callable[..., Any]) -> set[str]:
    """Which of the call's own values (`variables`, `variable_sources`) a function asks for, by
    declaring them keyword-only."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {
        p.name
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in ("variables", "variable_sources")
    }


class ToolFailed(Exception):
    """A tool that did not give a usable answer; the message is what the model reads."""
