"""What the fleet tests share: instances of `parley serve` with the real models, started together, whose
records (calls, events, spent call tokens, heartbeats) are in one PostgreSQL database, as a fleet's are
(tests/postgres.py's `cluster`, a throw-away one for each test module)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from parley.bench.service import Service


@contextlib.contextmanager
def instances(
    folder: Path,
    database_url: str,
    args: Sequence[Sequence[str]] = ((), ()),
    env: dict[str, str] | None = None,
) -> Iterator[list[Service]]:
    """One instance per entry of `args` (its extra flags), all on one records database; stopped on exit
    (one already killed by its test just reports so)."""
    services = [
        Service(["--database", database_url, *extra], env=env, log_path=folder / f"parley-{n}.log")
        for n, extra in enumerate(args)
    ]
    try:
        with ThreadPoolExecutor(len(services)) as pool:
            list(pool.map(lambda s: s.start(), services))
        yield services
    finally:
        for service in services:
            service.stop()
