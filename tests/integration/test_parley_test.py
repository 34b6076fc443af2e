"""`parley test` end to end: it starts the service with a team's agent file, calls it over real SIP with
a Piper-voiced caller, answers the agent's tool from the scenario's mock, and reports: a scenario that
holds passes, one whose expectation is broken on purpose fails naming the turn and what was heard, and
JUnit XML and an HTML report with the call's timeline are written.

The speech models are the real ones; the LLM is the scripted endpoint of the agent tests
(tests/openai_endpoint.py), so what the agent says is known and the test is about `parley test`.
The example suite against the default models is in test_parley_test_examples.py; both run in make test-all.
"""

from __future__ import annotations

import asyncio
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import pytest

from parley.cli import main
from tests.openai_endpoint import ScriptedEndpoint

ORDERS = Path(__file__).parents[2] / "examples" / "agents" / "orders.toml"

ORDER_STATUS = """
name = "order status"
agent = "orders"
seed = 11

[line]
noise = "street"
snr_db = 20

[[turns]]
say = "What is the status of order one two three four?"
expect.says = ["Monday"]
expect.hears = ["order"]

[tools.lookup_order]
result = { status = "shipped", eta = "Monday" }

[expect]
max_talk_over_ms = 300

[[expect.tools]]
name = "lookup_order"
arguments = { number = "1234" }
times = 1
"""

BROKEN = """
name = "broken on purpose"
agent = "orders"

[[turns]]
say = "What is the status of order one two three four?"
expect.says = ["Tuesday"]

[tools.lookup_order]
result = { status = "shipped", eta = "Monday" }
"""


class Svgs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.svgs = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.svgs += tag == "svg"


# ~28 s, the default suite's longest: make test-all runs it, beside the examples over every transport
# (test_parley_test_examples.py); the scenario files, checks and reports have unit tests of their own.
@pytest.mark.slow
async def test_parley_test_runs_scenarios_over_sip_and_reports_what_failed_where(tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "a_order_status.toml").write_text(ORDER_STATUS)
    (scenarios / "b_broken.toml").write_text(BROKEN)
    junit, report = tmp_path / "junit.xml", tmp_path / "report.html"
    with ScriptedEndpoint() as endpoint:
        code = await asyncio.to_thread(
            main,
            [
                "test",
                str(scenarios),
                "--agent",
                str(ORDERS),
                "--transport",
                "sip",
                f"--server-arg=--llm-url={endpoint.url}",
                "--server-log",
                str(tmp_path / "parley.log"),
                "--junit",
                str(junit),
                "--report",
                str(report),
            ],
        )
    assert code == 1  # one scenario failed
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    passed, broken = cases["order status"], cases["broken on purpose"]
    assert passed.find("failure") is None and passed.find("error") is None, ElementTree.tostring(passed)
    assert passed.get("classname") == "sip"
    out = passed.findtext("system-out") or ""
    # The path under test ran: the agent heard the caller, the mock webhook got the tool call, the
    # reply carried its result, and the seed is reported.
    assert "lookup_order" in out and "1234" in out and "Monday" in out and "seed 11" in out.lower(), out
    failure = broken.find("failure")
    assert failure is not None
    message = failure.get("message") or ""
    assert message.startswith("turn 1: the reply did not say 'Tuesday': heard"), message
    assert "Monday" in message
    page = Svgs()
    page.feed(report.read_text())
    assert page.svgs == 2  # a timeline per call
