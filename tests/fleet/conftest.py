"""What the fleet tests share: instances of `parley serve` with the real models, started together, on one
records database (tests/postgres.py's `cluster`, a throw-away PostgreSQL for each test module): the
ones `parley bench rolling` starts (parley/bench/fleet.py), behind Kamailio or HAProxy."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from parley.bench.fleet import HAProxy, Kamailio, instances
from parley.bench.service import Service

__all__ = ["behind_haproxy", "behind_kamailio", "instances"]

Proxy = TypeVar("Proxy", Kamailio, HAProxy)


@contextlib.contextmanager
def _behind(
    proxy: Callable[[list[Service]], contextlib.AbstractContextManager[Proxy]],
    folder: Path,
    database_url: str,
    args: Sequence[Sequence[str]],
    env: dict[str, str] | None,
) -> Iterator[tuple[list[Service], Proxy]]:
    with instances(folder, database_url, args, env) as services, proxy(services) as front:
        yield services, front
    # Stopped once their calls had ended: each instance exits cleanly.
    assert [s.process.returncode for s in services if s.process] == [0] * len(services)


def behind_kamailio(
    folder: Path,
    database_url: str,
    args: Sequence[Sequence[str]] = ((), ()),
    env: dict[str, str] | None = None,
) -> contextlib.AbstractContextManager[tuple[list[Service], Kamailio]]:
    """Instances (one per entry of `args`, its extra flags) behind Kamailio's dispatcher."""
    return _behind(lambda s: Kamailio(folder, [i.sip_port for i in s]), folder, database_url, args, env)


def behind_haproxy(
    folder: Path,
    database_url: str,
    args: Sequence[Sequence[str]] = ((), ()),
    env: dict[str, str] | None = None,
) -> contextlib.AbstractContextManager[tuple[list[Service], HAProxy]]:
    """Instances (one per entry of `args`, its extra flags) behind HAProxy."""
    return _behind(lambda s: HAProxy(folder, [i.port for i in s]), folder, database_url, args, env)
