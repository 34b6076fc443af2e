"""A `parley test` run as JUnit XML, the file CI systems (Jenkins, GitLab, GitHub's test reporters) read:
one test case per scenario, its failures as the test's failure text, and the call's transcript as its
output, so a failed call can be read in the CI's own test view.
"""

from __future__ import annotations

import json
import re
import socket
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any

from parley.scenarios.results import ScenarioResult, TurnResult

# Characters XML 1.0 cannot hold at all (not even escaped), and a terminal's escape sequences whole: an
# exception's coloured text or a stray control character would otherwise make the file unreadable.
_NOT_XML = re.compile("\x1b\\[[0-9;]*[A-Za-z]|[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def write_junit(
    results: list[ScenarioResult],
    path: Path,
    *,
    suite: str = "parley test",
    started: datetime | None = None,
) -> None:
    """Write the run's results to `path` (UTF-8, with an XML declaration), its folder made if missing.
    `started` is when the run began (the suite's timestamp); by default, the moment this is written."""
    stamp = (started or datetime.now()).astimezone().isoformat(timespec="seconds")
    failures = sum(1 for r in results if not r.error and not r.passed)
    errors = sum(1 for r in results if r.error)
    total_s = sum(r.duration_s for r in results)
    counts = {
        "tests": str(len(results)),
        "failures": str(failures),
        "errors": str(errors),
        "skipped": "0",
        "time": _seconds(total_s),
    }
    # A <testsuites> root around the one suite: what pytest writes, and what every reader accepts.
    root = ET.Element("testsuites", {"name": _clean(suite), **counts})
    testsuite = ET.SubElement(
        root,
        "testsuite",
        {"name": _clean(suite), **counts, "timestamp": stamp, "hostname": _clean(socket.gethostname())},
    )
    for result in results:
        testsuite.append(_testcase(result))
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def transcript(result: ScenarioResult) -> str:
    """The call turn by turn, as plain text: what the caller did, what the agent heard and replied (cut
    where it was cut), each reply's latency, and the tools it called."""
    lines = [f"scenario: {result.name} ({result.transport or 'no transport'}, seed {result.seed})"]
    if result.call_id:
        lines.append(f"call: {result.call_id}")
    outcome = result.outcome or "none recorded"
    if result.transferred_to:
        outcome += f" to {result.transferred_to}"
    lines.append(f"outcome: {outcome}, {result.duration_s:.1f} s")
    if result.greeting:
        lines.append(f"agent greeted: {result.greeting}")
    for turn in result.turns:
        lines += _turn_lines(turn)
    if result.response_p50_s is not None or result.response_p95_s is not None:
        lines.append(f"response p50 {_latency(result.response_p50_s)}, p95 {_latency(result.response_p95_s)}")
    if result.judge is not None:
        lines.append(f"judge: {'passed' if result.judge.passed else 'failed'}: {result.judge.reason}")
    return "\n".join(lines) + "\n"


def _testcase(result: ScenarioResult) -> ET.Element:
    case = ET.Element(
        "testcase",
        {
            "name": _clean(result.name),
            # CI views group test cases by class: by transport, the same scenarios over SIP and over
            # WebRTC sit side by side.
            "classname": _clean(result.transport or "parley"),
            "file": _clean(result.path),
            "time": _seconds(result.duration_s),
        },
    )
    found = result.all_failures()
    if result.error:
        problem = ET.SubElement(case, "error", {"message": _clean(result.error), "type": "run"})
        problem.text = _clean("\n".join(found))
    elif found:
        problem = ET.SubElement(case, "failure", {"message": _clean(found[0]), "type": "expectation"})
        problem.text = _clean("\n".join(found))
    ET.SubElement(case, "system-out").text = _clean(transcript(result))
    return case


def _turn_lines(turn: TurnResult) -> list[str]:
    who = "LLM caller" if turn.by_llm else "caller"
    lines = [f"turn {turn.index} ({who}): {turn.action}"]
    if turn.said and turn.said not in turn.action:
        lines.append(f"  caller said: {turn.said}")
    if turn.heard:
        lines.append(f"  agent heard: {turn.heard}")
    reply = turn.reply or "(nothing)"
    if turn.interrupted:
        reply += " [interrupted]"
    latency = f" ({_latency(turn.response_s)})" if turn.response_s is not None else ""
    lines.append(f"  agent replied{latency}: {reply}")
    for call in turn.tools:
        lines.append(f"  tool {_tool_call(call)}")
    lines += [f"  FAILED: {failure}" for failure in turn.failures]
    return lines


def _tool_call(call: dict[str, Any]) -> str:
    text = f"{call.get('name', '?')} {_json(call.get('arguments', {}))}"
    if call.get("error"):
        return f"{text} -> error: {call['error']}"
    return f"{text} -> {_json(call.get('result'))}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def _latency(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _clean(text: str) -> str:
    return _NOT_XML.sub("", text)
