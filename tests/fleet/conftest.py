"""What the fleet tests share: instances of `parley serve` with the real models, started together, on one
records database (tests/postgres.py's `cluster`, a throw-away PostgreSQL for each test module): the
ones `parley bench rolling` starts (parley/bench/fleet.py)."""

from __future__ import annotations

from parley.bench.fleet import instances

__all__ = ["instances"]
