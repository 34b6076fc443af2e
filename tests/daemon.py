"""What the peers the tests start as processes (Prometheus, the fleet's proxies) share: the benchmarks'
base (parley/bench/daemon.py), stopped with SIGTERM (then SIGKILL) and used as a context manager."""

from __future__ import annotations

from parley.bench.daemon import Daemon

__all__ = ["Daemon"]
