"""`parley bench NAME`: benchmarks measured at the caller, printed as a table and written as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parley.config import Settings

Bench = Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]


def add_bench_parser(commands: Any) -> None:
    from parley.bench import (
        answering_machines,
        answers,
        backchannels,
        calls,
        capacity,
        interruption,
        noise,
        response,
        rolling,
        tools,
    )
    from parley.bench.service import add_service_arguments

    bench = commands.add_parser("bench", help="run a benchmark (at the caller)", description=__doc__)
    names = bench.add_subparsers(dest="bench", required=True, metavar="NAME")
    for module in (
        response,
        interruption,
        backchannels,
        calls,
        capacity,
        answers,
        tools,
        noise,
        answering_machines,
    ):
        parser = names.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        parser.add_argument("--url", default="", help="a running service; default: start one on a free port")
        parser.add_argument("--json", default="", help="write results here (default bench-NAME.json)")
        add_service_arguments(parser)
        module.add_arguments(parser)
        parser.set_defaults(run=_runner(module.NAME, module.run))
    # A fleet of its own, started here: no --url, and its instances' logs kept with Kamailio's and HAProxy's.
    parser = names.add_parser(rolling.NAME, help=rolling.HELP, description=rolling.__doc__)
    rolling.add_arguments(parser)
    parser.set_defaults(run=_runner(rolling.NAME, rolling.run))


def _runner(name: str, bench: Bench) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        results = asyncio.run(bench(args))
        results["bench"] = name
        out = Path(args.json or f"bench-{name}.json")
        out.write_text(json.dumps(results, indent=2))
        print_table(results.get("summary", {}))
        print(f"\nresults written to {out}", file=sys.stderr)
        return 0 if results.get("ok", True) else 1

    return run


def settings_from_flags(flags: list[str]) -> Settings:
    """The settings `parley serve` would run with these flags (a benchmark that runs engines in process)."""
    from parley.settings_sources import add_arguments, load_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(flags))


def progress(message: str) -> None:
    """One line per trial on stderr, so a long benchmark shows it is alive."""
    print(message, file=sys.stderr, flush=True)


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "min": None, "max": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 4)

    return {
        "n": len(values),
        "p50": round(statistics.median(ordered), 4),
        "p95": pick(0.95),
        "p99": pick(0.99),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
    }


def print_table(summary: dict[str, Any]) -> None:
    width = max((len(k) for k in summary), default=10)
    for key, value in summary.items():
        if isinstance(value, dict):
            cells = "  ".join(f"{k}={v}" for k, v in value.items())
            print(f"{key:<{width}}  {cells}")
        else:
            print(f"{key:<{width}}  {value}")
