"""Debian's Kamailio in front of parley instances, for the fleet tests: the one `parley bench rolling`
starts (parley/bench/fleet.py), `deploy/kamailio/kamailio.cfg` as deployed but for its addresses (it
listens on a loopback port, and its dispatcher list names the instances' SIP ports).

    with Kamailio(tmp_path, [5071, 5072]) as proxy:
        caller = SipCaller(url, f"sip:parley@127.0.0.1:{proxy.port}")
"""

from __future__ import annotations

from parley.bench.fleet import Kamailio

__all__ = ["Kamailio"]
