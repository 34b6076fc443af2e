"""Where the agent may dial out, and who may see the credentials it dials with.

Dial-out costs money per call, so one request that may dial anything is toll fraud waiting to happen
(a premium or international number, through our trunk, on our account). Every dial-out must name one of
the trunks the operator listed (none listed: dial-out is off), a number under one of the listed prefixes
(none listed: any number), and fit the hourly budget. Each refusal is counted by its reason.

The outbound digest credentials answer a challenge only for a call sent to a listed trunk (the one they
are pinned to, when one is named): a peer that is not our trunk could otherwise relay its own
challenge (or our trunk's) and use our answer to place calls on our account.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from parley import metrics
from parley.config import SettingsError
from parley.log import event
from parley.transports.sip.digest import ClientCredentials
from parley.transports.sip.uri import SipError, SipUri, parse_hostport, show

__all__ = ["DialPolicy", "DialRefused", "DialSettings", "Trunk", "Withheld", "dial_policy"]

log = logging.getLogger(__name__)

HOUR_S = 3600.0
REASONS = ("host", "prefix", "rate")
# RFC 3966 5.1.1: visual separators a number may be written with; they dial nothing.
_VISUAL_SEPARATORS = re.compile(r"[-.()]")
_NUMBER = re.compile(r"\+?[0-9]+")

Reason = Literal["host", "prefix", "rate"]


class DialRefused(Exception):
    """The destination policy refuses a dial-out. `reason` is the metric's label; `retry_after_s` is set
    when waiting helps (the hourly budget is spent)."""

    def __init__(self, reason: Reason, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.retry_after_s = retry_after_s


class Withheld(Exception):
    """The credentials are not given to answer this destination's challenge; the message says why."""


class DialSettings(Protocol):
    """The settings the policy is made from."""

    @property
    def dial_trunks(self) -> tuple[str, ...]: ...
    @property
    def dial_prefixes(self) -> tuple[str, ...]: ...
    @property
    def dial_max_per_hour(self) -> int: ...
    @property
    def sip_outbound_user(self) -> str: ...
    @property
    def sip_outbound_password(self) -> str: ...
    @property
    def sip_outbound_realm(self) -> str: ...
    @property
    def sip_outbound_trunk(self) -> str: ...


def _host_key(host: str) -> str:
    """A host as it is compared: no IPv6 brackets, no trailing dot, names in lower case, addresses in
    their one canonical spelling (::1, not 0:0::1)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare.rstrip(".").lower()


@dataclass(frozen=True)
class Trunk:
    """A --dial-trunks entry: a host (a name or an address, compared as written, never resolved) and,
    when given, the one port it may be dialled at."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> Trunk:
        text = entry.strip()
        if text.count(":") > 1 and not text.startswith("["):
            text = f"[{text}]"  # a bare IPv6 address: no port
        try:
            host, port = parse_hostport(text)
        except SipError as exc:
            raise SettingsError(f"dial_trunks: {entry!r} is not a host or host:port ({exc})") from None
        return cls(_host_key(host), port)

    def carries(self, uri: SipUri) -> bool:
        if _host_key(uri.host) != self.host:
            return False
        return self.port is None or (uri.port or _default_port(uri)) == self.port

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def _default_port(uri: SipUri) -> int:
    secure = uri.scheme == "sips" or uri.params.get("transport", "").lower() == "tls"
    return 5061 if secure else 5060  # RFC 3261 19.1.2


def _number(uri: SipUri) -> str | None:
    """The number a destination dials: its user part without visual separators; None when that is not
    a plain number (letters, escapes, parameters: what a trunk might read differently from us)."""
    number = _VISUAL_SEPARATORS.sub("", uri.user or "")
    return number if _NUMBER.fullmatch(number) else None


class DialPolicy:
    """Admits or refuses each dial-out (`admit`), and says which credentials answer a challenge."""

    def __init__(
        self,
        trunks: Sequence[str],
        prefixes: Sequence[str] = (),
        max_per_hour: int = 0,
        *,
        credentials: ClientCredentials | None = None,
        credentials_trunk: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trunks = tuple(Trunk.parse(entry) for entry in trunks)
        for prefix in prefixes:
            if not _NUMBER.fullmatch(_VISUAL_SEPARATORS.sub("", prefix)):
                raise SettingsError(f"dial_prefixes: {prefix!r} is not a number prefix such as +1 or +44")
        self.prefixes = tuple(_VISUAL_SEPARATORS.sub("", prefix) for prefix in prefixes)
        if max_per_hour < 0:
            raise SettingsError("dial_max_per_hour must be 0 (no limit) or more")
        self.max_per_hour = max_per_hour
        self.credentials = credentials
        self.credentials_trunk = Trunk.parse(credentials_trunk) if credentials_trunk else None
        if self.credentials_trunk is not None and self.credentials_trunk not in self.trunks:
            raise SettingsError(
                f"sip_outbound_trunk {credentials_trunk!r} must be one of dial_trunks (as written there)"
            )
        self._clock = clock
        self._dialled: collections.deque[float] = collections.deque()  # when each admitted dial-out began

    def admit(self, uri: SipUri) -> None:
        """Counts a dial-out to `uri` against the hourly budget, or raises DialRefused."""
        try:
            self._check(uri)
        except DialRefused as exc:
            metrics.DIAL_REFUSED_TOTAL.labels(reason=exc.reason).inc()
            event(log, "sip_dial_refused", logging.WARNING, reason=exc.reason, host=show(uri.host))
            raise
        self._dialled.append(self._clock())

    def _check(self, uri: SipUri) -> None:
        if not self.trunks:
            raise DialRefused("host", "dial-out is off: name the trunks it may use with --dial-trunks")
        if not any(trunk.carries(uri) for trunk in self.trunks):
            raise DialRefused(
                "host", f"{show(uri.host)} is not one of the trunks dial-out may use (--dial-trunks)"
            )
        if self.prefixes:
            number = _number(uri)
            if number is None:
                raise DialRefused(
                    "prefix", "the destination's user part must be a number when --dial-prefixes is set"
                )
            if not number.startswith(self.prefixes):
                raise DialRefused("prefix", "the number is under none of the prefixes in --dial-prefixes")
        if self.max_per_hour:
            now = self._clock()
            while self._dialled and now - self._dialled[0] >= HOUR_S:
                self._dialled.popleft()
            if len(self._dialled) >= self.max_per_hour:
                wait_s = max(1, math.ceil(self._dialled[0] + HOUR_S - now))
                raise DialRefused(
                    "rate",
                    f"{self.max_per_hour} dial-outs in the last hour, the limit (--dial-max-per-hour); "
                    f"try again in {wait_s} s",
                    wait_s,
                )

    def credentials_for(self, uri: SipUri) -> ClientCredentials:
        """The credentials that may answer a challenge to a call sent to `uri`; Withheld says why not."""
        if self.credentials is None:
            raise Withheld("no outbound credentials (--sip-outbound-user)")
        pinned = (self.credentials_trunk,) if self.credentials_trunk is not None else self.trunks
        if not any(trunk.carries(uri) for trunk in pinned):
            raise Withheld(
                f"{show(uri.host)} is not the trunk the outbound credentials belong to "
                "(--sip-outbound-trunk, --dial-trunks)"
            )
        return self.credentials


def dial_policy(settings: DialSettings) -> DialPolicy:
    credentials = None
    if settings.sip_outbound_user:
        if not settings.sip_outbound_password:
            raise SettingsError(
                "sip_outbound_user needs a password (PARLEY_SIP_OUTBOUND_PASSWORD or "
                "--sip-outbound-password-file)"
            )
        credentials = ClientCredentials(
            settings.sip_outbound_user, settings.sip_outbound_password, settings.sip_outbound_realm
        )
    return DialPolicy(
        settings.dial_trunks,
        settings.dial_prefixes,
        settings.dial_max_per_hour,
        credentials=credentials,
        credentials_trunk=settings.sip_outbound_trunk,
    )
