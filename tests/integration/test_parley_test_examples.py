"""The example scenarios (examples/scenarios/: the README's order desk, a caller who pauses in the order
number, one who cuts in, one on a noisy line, one who asks for a person, one who goes quiet) pass over
SIP and over WebRTC: `parley test examples/scenarios/ --agent examples/agents/orders.toml`, with the
real speech models on the real phone path.

The LLM here is the scripted endpoint of the agent tests (tests/openai_endpoint.py), so that the suite
checks `parley test`, the line and the agent's wiring every time; how the packaged models do on the
same scenarios is measured by the same command and reported in the README (they fail some: that is
what the tool is for). Slow (a service start and six calls per transport): `make test-all`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from xml.etree import ElementTree

import pytest

from parley.cli import main
from tests.openai_endpoint import ScriptedEndpoint

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["sip", "webrtc"])
async def test_the_example_scenarios_pass_over_the_real_phone_path(transport: str, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    with ScriptedEndpoint() as endpoint:
        code = await asyncio.to_thread(
            main,
            [
                "test",
                str(ROOT / "examples" / "scenarios"),
                "--agent",
                str(ROOT / "examples" / "agents" / "orders.toml"),
                "--transport",
                transport,
                f"--server-arg=--llm-url={endpoint.url}",
                "--junit",
                str(junit),
            ],
        )
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    failed = [
        f"{case.get('name')}: {problem.get('message')}"
        for case in suite.iter("testcase")
        for problem in (*case.iterfind("failure"), *case.iterfind("error"))
    ]
    assert code == 0 and not failed, failed
    assert suite.get("tests") == str(len(list((ROOT / "examples" / "scenarios").glob("*.toml"))))
