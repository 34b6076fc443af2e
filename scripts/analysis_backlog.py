"""`parley serve` with a standing backlog of post-call analyses: what `parley bench response` measures
their cost to a live call against.

    .venv/bin/python scripts/analysis_backlog.py --keep-waiting 20 -- \
        --agent scripts/analysis-agent.toml --port 8090 --sip 127.0.0.1:5070
    parley bench response --url http://127.0.0.1:8090 --transport sip \
        --sip-uri sip:parley@127.0.0.1:5070 --trials 10

The flags after `--` are `parley serve`'s; the first agent must have an `[analysis]`. Once the models are
in, the service's analysis queue is kept at `--keep-waiting` ended calls (0: none, the baseline), each a
five-turn call of the bench's questions with a line of its own at its start (so that no analysis reads
its prompt from another's cells), handed to the analyses as the registry hands an ended call. Real
calls cannot keep such a backlog: the default model analyses a short call in one or two seconds when
nothing holds it, as fast as calls end. Its analyses are kept under ids no call has (`backlog-N`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from parley.agent.agentfile import Agent
from parley.app import create_app
from parley.bench import settings_from_flags
from parley.bench.common import QUESTIONS
from parley.config import Settings
from parley.http_api import RUNTIME
from parley.log import setup_logging
from parley.memory import bound_malloc_arenas

ANSWERS = (
    "It is sunny and mild in Paris today.",
    "I would recommend To Kill a Mockingbird by Harper Lee.",
    "Boil water, steep the tea for three minutes, then add milk if you like.",
    "Most banks open at nine in the morning.",
    "The moon moves about four centimetres away from the Earth every year.",
    "It is about one thousand seven hundred kilometres from London to Madrid.",
    "How about a simple pasta with tomatoes and basil?",
    "A spider has eight legs.",
    "The capital city of Japan is Tokyo.",
    "Sure, how about a weekend in the mountains?",
)
TURNS_PER_CALL = 5
TOP_UP_S = 0.2


@dataclass
class EndedCall:
    """What the analyses read of an ended call (analysis/analyses.py, `EndedCall`)."""

    call_id: str
    agent: Agent
    settings: Settings
    turns: list[dict[str, Any]]

    @property
    def conversation(self) -> EndedCall:
        return self

    def snapshot(self) -> list[dict[str, Any]]:
        return self.turns


def transcript(number: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [{"turn_id": "greeting", "user": "", "agent": "Hello, how can I help?"}]
    for turn in range(TURNS_PER_CALL):
        asked = (number + turn) % len(QUESTIONS)
        user = QUESTIONS[asked] + "?"
        if turn == 0:
            user = f"Hello, this is caller number {number}. {user}"
        turns.append({"turn_id": f"t{turn}", "user": user, "agent": ANSWERS[asked], "tools": []})
    return turns


def keep_backlog(app: web.Application, waiting: int) -> Any:
    async def top_up(app: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            runtime = app[RUNTIME]
            analyses, number = runtime.analyses, 0
            if analyses is None:
                raise SystemExit("the first agent has no [analysis]")
            while True:
                await asyncio.sleep(TOP_UP_S)
                if runtime.engines is None or runtime.registry.closing:
                    continue  # loading, or stopping: the analyses take no more
                for _ in range(waiting - analyses.waiting()):
                    agent = runtime.agent(None)
                    analyses.call_ended(
                        EndedCall(f"backlog-{number}", agent, runtime.settings, transcript(number))
                    )
                    number += 1

        task = asyncio.ensure_future(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return top_up


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    own, serve_flags = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep-waiting", type=int, default=20, help="analyses kept waiting (0: none)")
    args = parser.parse_args(own)
    bound_malloc_arenas()
    settings = settings_from_flags(serve_flags)
    setup_logging(settings.log_level, settings.log_format, settings.log_transcripts, settings.log_numbers)
    app = create_app(settings)
    if args.keep_waiting > 0:
        app.cleanup_ctx.append(keep_backlog(app, args.keep_waiting))
    web.run_app(app, host=settings.host, port=settings.port, print=None, shutdown_timeout=10.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
