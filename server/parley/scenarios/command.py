"""`parley test SCENARIOS...`: run scenario files as real calls and say which failed.

Without `--url` it starts the service itself (`parley serve` on free loopback ports, the default real
models) with the agent files given, each tool pointed at the scenarios' mocks; with `--url` it calls a
running service (whose own tools then run, so scenarios that mock tools are refused). Exits 0 when
every scenario passed, 1 when one failed, 2 when a scenario file or the command line is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from parley.agent.agentfile import parse_agent_arg
from parley.bench.service import Service, add_service_arguments
from parley.scenarios.chat import chat_for
from parley.scenarios.junit import write_junit
from parley.scenarios.progress import Progress
from parley.scenarios.report_html import write_report
from parley.scenarios.results import ScenarioResult
from parley.scenarios.runner import ScenarioRun, Target
from parley.scenarios.scenario import Scenario, ScenarioError
from parley.scenarios.scenario_file import discover, load
from parley.scenarios.tool_mocks import ToolMocks, agent_with_mocks

SERVICE_START_S = 600.0  # a first start prepares the models into the cache


def add_test_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "test",
        help="test an agent with scripted callers over the real phone path",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenarios", nargs="+", help="scenario files (TOML), or folders of them")
    parser.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="[NAME=]FILE",
        help="an agent file for the service started here (repeatable; the first is the default agent)",
    )
    parser.add_argument("--url", default="", help="a running service to call (default: start one here)")
    parser.add_argument("--sip-uri", default="", help="with --url: the service's SIP URI (sip:host:port)")
    parser.add_argument("--token", default="", help="with --url: the service's token (default PARLEY_TOKEN)")
    parser.add_argument(
        "--transport",
        choices=("webrtc", "sip", "carrier"),
        default="sip",
        help="how callers call when a scenario names no transport (default sip)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="the seed of every scenario (default: each its own)"
    )
    parser.add_argument("--junit", default="", metavar="OUT.xml", help="write a JUnit XML report here")
    parser.add_argument("--report", default="", metavar="OUT.html", help="write an HTML report here")
    parser.add_argument(
        "--caller-llm-url",
        default="",
        help="an OpenAI-compatible endpoint that plays [llm_caller] (default: the local model)",
    )
    parser.add_argument(
        "--judge-url",
        default="",
        help="an OpenAI-compatible endpoint that judges [expect.judge] (default: the local model)",
    )
    add_service_arguments(parser)
    parser.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        scenarios = [load(path) for path in discover(args.scenarios)]
        if not scenarios:
            raise ScenarioError(f"no scenario files in {' '.join(args.scenarios)}")
        if args.url and any(s.tools for s in scenarios):
            mocked = next(s for s in scenarios if s.tools)
            raise ScenarioError(
                f"{mocked.path}: mocks tools, which needs the service parley test starts; drop --url "
                "and give the agent file with --agent"
            )
        agents = [_agent(value) for value in args.agent]
    except ScenarioError as exc:
        print(f"parley test: {exc}", file=sys.stderr)
        return 2
    if args.seed is not None:
        scenarios = [dataclasses.replace(s, seed=args.seed) for s in scenarios]
    results = asyncio.run(_run(args, scenarios, agents))
    if args.junit:
        write_junit(results, Path(args.junit))
    if args.report:
        write_report(results, Path(args.report))
    return 0 if all(r.passed for r in results) else 1


def _agent(value: str) -> tuple[str, Path]:
    name, path = parse_agent_arg(value)
    file = Path(path)
    if not file.is_file():
        raise ScenarioError(f"--agent {value}: no such file")
    return name or file.stem, file


async def _run(
    args: argparse.Namespace, scenarios: list[Scenario], agents: list[tuple[str, Path]]
) -> list[ScenarioResult]:
    progress = Progress(len(scenarios))
    results: list[ScenarioResult] = []
    key = os.environ.get("OPENAI_API_KEY", "")  # for a hosted endpoint; never on the command line
    caller_chat = chat_for(args.caller_llm_url, api_key=key) if any(s.llm_caller for s in scenarios) else None
    judge_chat = chat_for(args.judge_url, api_key=key) if any(s.expect.judge for s in scenarios) else None
    async with contextlib.AsyncExitStack() as stack:
        if args.url:
            token = args.token or os.environ.get("PARLEY_TOKEN", "")
            target = Target(args.url, args.sip_uri, token, None, args.transport)
        else:
            mocks = await ToolMocks().start()
            stack.push_async_callback(mocks.close)
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="parley-test-")))
            served: list[str] = []
            for name, file in agents:
                copy = folder / f"{name}.toml"
                copy.write_text(agent_with_mocks(file, mocks.url), encoding="utf-8")
                served += ["--agent", f"{name}={copy}"]
            log_path = Path(args.server_log) if args.server_log else None
            service = Service([*served, *args.server_arg], log_path=log_path)
            print("parley test: starting the service (the models load first)", file=sys.stderr)
            await asyncio.to_thread(service.start, SERVICE_START_S)
            stack.callback(service.stop)
            default_agent = agents[0][0] if agents else ""
            target = Target(service.base_url, service.sip_uri, "", mocks, args.transport, default_agent)
        for scenario in scenarios:
            progress.started(scenario.name)
            run = ScenarioRun(
                scenario, target, caller_chat=caller_chat, judge_chat=judge_chat, on_turn=progress.turn
            )
            result = await run.run()
            progress.finished(result)
            results.append(result)
    print(progress.summary(), file=sys.stderr)
    return results
