"""Debian's HAProxy in front of parley instances, for the fleet tests: the one `parley bench rolling`
starts (parley/bench/fleet.py), `deploy/haproxy/haproxy.cfg` as deployed but for its addresses (it binds
a loopback port; its servers are the instances, tagged p1, p2, ... in their order).

    with HAProxy(tmp_path, [8091, 8092]) as proxy:
        caller = Caller(proxy.url)
"""

from __future__ import annotations

from parley.bench.fleet import HAProxy

__all__ = ["HAProxy"]
