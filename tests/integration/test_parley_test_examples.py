"""The example scenarios (examples/scenarios/: the README's order desk, a caller who pauses in the order
number, one who cuts in, one on a noisy line, one who asks for a person, one who goes quiet) pass over
SIP and over WebRTC: `parley test examples/scenarios/ --agent examples/agents/orders.toml`, with the
real speech models on the real phone path.

Twice: with the default models (`--llm-model auto`, which runs Qwen2.5-Coder-1.5B for an agent with
tools), as a user runs it; and with the scripted endpoint of the agent tests (tests/openai_endpoint.py)
as the LLM, which checks `parley test`, the line and the agent's wiring whatever a model does. A second
test runs a scenario over a carrier's media stream, one that presses keys, and one played on by the local
model as an LLM caller and judged by it. Slow (a service start and several calls each): `make test-all`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from xml.etree import ElementTree

import pytest

from parley.cli import main
from tests.openai_endpoint import ScriptedEndpoint

ROOT = Path(__file__).parents[2]


def run_examples(transport: str, junit: Path, *server_args: str) -> list[str]:
    """`parley test` of the examples over `transport`: what failed (none when it passed)."""
    code = main(
        [
            "test",
            str(ROOT / "examples" / "scenarios"),
            "--agent",
            str(ROOT / "examples" / "agents" / "orders.toml"),
            "--transport",
            transport,
            *(f"--server-arg={arg}" for arg in server_args),
            "--junit",
            str(junit),
        ]
    )
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    failed = [
        f"{case.get('name')}: {problem.get('message')}"
        for case in suite.iter("testcase")
        for problem in (*case.iterfind("failure"), *case.iterfind("error"))
    ]
    assert suite.get("tests") == str(len(list((ROOT / "examples" / "scenarios").glob("*.toml"))))
    return failed if code == 0 or failed else [f"parley test exited {code}"]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["sip", "webrtc"])
async def test_the_example_scenarios_pass_with_the_default_models(transport: str, tmp_path: Path) -> None:
    assert await asyncio.to_thread(run_examples, transport, tmp_path / "junit.xml") == []


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["sip", "webrtc"])
async def test_the_example_scenarios_pass_over_the_real_phone_path(transport: str, tmp_path: Path) -> None:
    with ScriptedEndpoint() as endpoint:
        failed = await asyncio.to_thread(
            run_examples, transport, tmp_path / "junit.xml", f"--llm-url={endpoint.url}"
        )
    assert failed == []


CARRIER_KEYS_AND_A_JUDGE = {
    "a_carrier.toml": """
name = "a carrier's caller"
agent = "orders"
transport = "carrier"
[line]
loss = 0.02
jitter_ms = 20
[[turns]]
say = "What is the status of order one two three four?"
expect.says = ["Monday"]
[tools.lookup_order]
result = { status = "shipped", eta = "Monday" }
[[expect.tools]]
name = "lookup_order"
arguments = { number = "1234" }
""",
    "b_keys.toml": """
name = "keys pressed"
agent = "orders"
[[turns]]
say = "I'd like to check an order. I'll type the number."
[[turns]]
press = "4712#"
expect.hears = ["4712"]
""",
    "c_judged.toml": """
name = "an LLM caller, judged"
agent = "orders"
[[turns]]
say = "What is the status of order one two three four?"
[tools.lookup_order]
result = { status = "shipped", eta = "Monday" }
[llm_caller]
persona = "Dana, a customer in a hurry"
goal = "find out whether order 1234 can be left with a neighbour, then say goodbye"
max_turns = 1
[expect.judge]
rubric = "The agent told the caller when the order arrives."
""",
}


@pytest.mark.slow
async def test_a_carrier_stream_keys_pressed_and_an_llm_caller_judged(tmp_path: Path) -> None:
    # The caller and the judge are the packaged local model (no --caller-llm-url, --judge-url).
    for name, text in CARRIER_KEYS_AND_A_JUDGE.items():
        (tmp_path / name).write_text(text)
    junit = tmp_path / "junit.xml"
    with ScriptedEndpoint() as endpoint:
        code = await asyncio.to_thread(
            main,
            [
                "test",
                *sorted(str(p) for p in tmp_path.glob("*.toml")),
                "--agent",
                str(ROOT / "examples" / "agents" / "orders.toml"),
                "--transport",
                "sip",
                f"--server-arg=--llm-url={endpoint.url}",
                "--junit",
                str(junit),
            ],
        )
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    problems = {n: [p.get("message") for p in c if p.tag in ("failure", "error")] for n, c in cases.items()}
    assert code == 0 and not any(problems.values()), problems
    assert cases["a carrier's caller"].get("classname") == "carrier"
    assert "[DTMF 4712#]" in (cases["keys pressed"].findtext("system-out") or "")
    judged = cases["an LLM caller, judged"].findtext("system-out") or ""
    assert "(LLM caller)" in judged and "judge: passed" in judged, judged
