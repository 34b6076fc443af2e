"""What the benchmarks share: the service they measure, and the questions they ask."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from parley.bench.service import Service

QUESTIONS = (
    "what is the weather like in paris today",
    "can you recommend a good book to read",
    "how do i make a cup of tea",
    "what time does the bank usually open",
    "tell me something interesting about the moon",
    "how far is it from london to madrid",
    "what should i cook for dinner tonight",
    "how many legs does a spider have",
    "what is the capital city of japan",
    "can you help me plan a short trip",
)


@contextlib.contextmanager
def service_for(args: argparse.Namespace) -> Iterator[tuple[str, Service | None]]:
    """The URL to call: `--url`, or a service started here for the duration of the benchmark."""
    if args.url:
        yield args.url, None
        return
    log_path = Path(args.server_log) if args.server_log else None
    with Service(args.server_arg, log_path=log_path) as service:
        yield service.base_url, service
