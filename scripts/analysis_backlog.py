"""Queue post-call analyses on a running service: what `parley bench response` measures their cost to a
live call against.

    parley serve --agent scripts/analysis-agent.toml --port 8090 --sip 127.0.0.1:5070 &
    .venv/bin/python scripts/analysis_backlog.py --url http://127.0.0.1:8090 \
        --sip-uri sip:parley@127.0.0.1:5070 --calls 15 --questions 5 --together
    parley bench response --url http://127.0.0.1:8090 --transport sip \
        --sip-uri sip:parley@127.0.0.1:5070 --trials 10

It places `--calls` short SIP calls, `--concurrency` at a time: each waits for the greeting, asks
`--questions` of the bench's questions (espeak-ng), each once the answer to the last has been heard, and
hangs up, so that each call's analysis is queued with a real transcript. With `--together` they are all
placed at once and hang up at the same moment, once every one has been answered: the service analyses a
short call in about a second when nothing holds it, so calls that end one by one are analysed as fast as
they end, and no backlog builds. It returns once they have all ended, saying how many analyses wait
(`parley_analyses_waiting`); run the bench at once, while they drain, and read the metric again after it
to see that the backlog lasted.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
import urllib.request

from parley.bench.common import QUESTIONS
from parley.bench.sip_caller import SipCaller
from parley.bench.speech import espeak, trim


async def one_call(url: str, sip_uri: str, questions: list[str], answered: asyncio.Barrier | None) -> None:
    clips = [trim(espeak(question)) for question in questions]
    async with SipCaller(url, sip_uri) as caller:
        await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
        for clip in clips:
            _, spoken_end = await caller.say(clip)
            await caller.wait_for_event("agent_done", timeout=120, after=spoken_end)
        if answered is not None:
            await answered.wait()  # then every call hangs up at once


def waiting(url: str) -> float:
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=10) as response:
        exposition = response.read().decode()
    found = re.search(r"^parley_analyses_waiting (\S+)$", exposition, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="the service's base URL")
    parser.add_argument("--sip-uri", required=True, help="the service's SIP URI")
    parser.add_argument("--calls", type=int, default=12, help="calls to place (default 12)")
    parser.add_argument("--concurrency", type=int, default=4, help="calls at a time (default 4)")
    parser.add_argument("--questions", type=int, default=1, help="questions each call asks (default 1)")
    parser.add_argument(
        "--together", action="store_true", help="place every call at once, and hang them all up together"
    )
    args = parser.parse_args()
    started = time.monotonic()
    room = asyncio.Semaphore(args.calls if args.together else args.concurrency)
    answered = asyncio.Barrier(args.calls) if args.together else None

    async def placed(i: int) -> None:
        async with room:
            asked = [QUESTIONS[(i + q) % len(QUESTIONS)] for q in range(args.questions)]
            await one_call(args.url, args.sip_uri, asked, answered)

    await asyncio.gather(*(placed(i) for i in range(args.calls)))
    print(
        f"{args.calls} calls ended in {time.monotonic() - started:.1f} s; "
        f"analyses waiting: {waiting(args.url):.0f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
