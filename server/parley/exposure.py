"""What the service may leave open where it can be reached, decided from its settings at start-up.

Bound to loopback, only this host reaches the service, so it may run with no credentials (a laptop, the
tests, a service behind a local proxy). Bound anywhere else, anyone who can route to it would be able to
call the agent, dial out through the trunk, drain the instance and read every transcript: it refuses to
start without the API's bearer token, and without digest credentials or an allow-list on a SIP listener,
unless the operator says `--insecure-open` (a lab).

The Host header a request may carry is decided here too: a loopback service is reached by loopback names
only, so a page on another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) is refused.
"""

from __future__ import annotations

import ipaddress
import logging
from urllib.parse import urlsplit

from parley.config import Settings, SettingsError, sip_address
from parley.log import event

log = logging.getLogger(__name__)

ANY = "*"
WILDCARDS = frozenset({"", "0.0.0.0", "::"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Only this machine can reach an address bound to `host`."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def exposure_problems(settings: Settings) -> list[str]:
    """What would be open to anyone who reaches the service, each with its fix ([] when nothing)."""
    problems = []
    if not is_loopback(settings.host) and not settings.token:
        problems.append(
            f"--host {settings.host or '(every address)'} is reachable from other machines and no bearer "
            "token is set: set PARLEY_TOKEN or PARLEY_TOKEN_FILE (e.g. `openssl rand -hex 32`)"
        )
    if settings.sip != "off":
        sip_host, _ = sip_address(settings.sip)
        if not is_loopback(sip_host) and not settings.sip_auth_user and not settings.sip_allow:
            problems.append(
                f"--sip {settings.sip} is reachable from other machines and anyone could call in: set "
                "--sip-auth-user with PARLEY_SIP_AUTH_PASSWORD (digest) and/or --sip-allow the trunk's "
                "networks, or --sip off"
            )
    return problems


def check_exposure(settings: Settings) -> None:
    """SettingsError naming the fix when the service would start open where it can be reached; with
    --insecure-open, a warning instead."""
    problems = exposure_problems(settings)
    if problems and settings.insecure_open:
        event(log, "insecure_open", logging.WARNING, open_to_anyone="; ".join(problems))
    elif problems:
        raise SettingsError(
            "refusing to start: "
            + "; ".join(problems)
            + " (or pass --insecure-open for a lab where everyone who can reach it is trusted)"
        )


def served_hosts(settings: Settings) -> frozenset[str] | None:
    """The host names a request's Host header may carry (None: any). Bound to every address with none
    named, the service answers whatever name it is reached by: it has a token then (or is a lab), so a
    rebound name reaches nothing a stranger could not reach directly."""
    named = {host.lower() for host in settings.allowed_hosts}
    if ANY in named or (settings.host in WILDCARDS and not named):
        return None
    hosts = set(LOOPBACK_NAMES) | {settings.host.lower().strip("[]")} | named
    if settings.public_url:
        public = urlsplit(settings.public_url).hostname
        if public:
            hosts.add(public.lower())
    return frozenset(hosts)


def host_name(header: str) -> str:
    """The name in a Host header, without its port and IPv6 brackets, lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header
