"""Who may use the SIP listener, and how much: the allow-list, the request rate per source, and the
set-up limit that allow-listed trunks share.

A trunk on `--sip-allow` brings every caller from one address, so it is spared the limits per source;
but a UDP source address is easily forged, so the trunks together still meet one limit on call set-ups
(`--sip-trunk-setup-rate`): a flood in the trunk's name cannot set up calls faster than that.
Requests outside any dialog other than INVITE (OPTIONS, REGISTER, MESSAGE, stray BYEs...) are counted
per source: past the rate they are dropped unanswered, as a flood is (an answer would double it, and
reflect it at whoever the forged source address belongs to).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable

from parley.ratelimit import SourceLimiter, TokenBucket, networks
from parley.transports.sip.message import ip_literal


class SipAdmission:
    def __init__(
        self,
        allow: Iterable[str],
        *,
        request_rate: float,
        request_burst: int,
        trunk_setup_rate: float,
        trunk_setup_burst: int,
    ) -> None:
        self.allowed_networks = networks(allow)
        self._requests = SourceLimiter(request_rate, request_burst)
        self._trunk_setups = (
            TokenBucket(trunk_setup_rate, trunk_setup_burst, time.monotonic())
            if trunk_setup_rate > 0
            else None
        )

    @property
    def trunks_only(self) -> bool:
        """True when an allow-list names the only sources taken (trunks, each carrying many callers)."""
        return bool(self.allowed_networks)

    def allowed(self, host: str) -> bool:
        if not self.allowed_networks:
            return True
        address = ip_literal(host)
        if address is None:
            return False
        ip = ipaddress.ip_address(address)
        return any(ip in network for network in self.allowed_networks)

    def request_admitted(self, host: str) -> bool:
        """Count a request outside any dialog from `host`: False past its rate (drop it unanswered).
        Allow-listed trunks are spared."""
        if self.trunks_only and self.allowed(host):
            return True
        return self._requests.check(host, time.monotonic()) <= 0

    def trunk_setup_wait(self) -> float:
        """Count a call set-up from an allow-listed trunk: 0.0 when allowed, else the seconds to wait
        (the trunks share one bucket)."""
        if self._trunk_setups is None:
            return 0.0
        return self._trunk_setups.take(time.monotonic())
