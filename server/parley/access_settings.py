"""The access settings: who may use the service (tokens, TURN credentials, trusted names, origins and
proxies) and how fast one source may set calls up. A group of `Settings` (config.py), which inherits it."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt


@dataclass(frozen=True)
class AccessSettings:
    """Who may call and use the API, and the set-up rate per source."""

    token: str = field(
        default="",
        metadata=_opt(
            "bearer token required on /offer, /whip, /api and /metrics (empty: none, on loopback only)"
        ),
    )
    insecure_open: bool = field(
        default=False,
        metadata=_opt(
            "serve on a non-loopback address with no token and SIP with no credentials (a lab only: "
            "anyone who reaches it may call, dial out, drain and read transcripts)"
        ),
    )
    call_token_secret: str = field(
        default="",
        metadata=_opt(
            "signs short-lived call tokens (`parley token`) that a page may present instead of --token "
            "('' = none); from PARLEY_CALL_TOKEN_SECRET or --call-token-secret-file",
            "access",
        ),
    )
    call_token_ttl_s: float = field(
        default=300.0, metadata=_opt("how long a call token from `parley token` is valid", "access")
    )
    turn_urls: tuple[str, ...] = field(
        default=(),
        metadata=_opt("TURN URLs the page gets time-limited credentials for (GET /api/ice)", "access"),
    )
    turn_secret: str = field(
        default="",
        metadata=_opt(
            "coturn's static-auth-secret (use-auth-secret), to mint TURN credentials for the page", "access"
        ),
    )
    turn_ttl_s: float = field(
        default=3600.0, metadata=_opt("TURN credentials handed to the page are valid this long", "access")
    )
    trusted_proxies: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "addresses or CIDR networks of proxies whose X-Forwarded-For names the caller (and whose "
            "X-Forwarded-Proto/-Host name the public URL); anyone else's X-Forwarded-* is ignored",
            "access",
        ),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "Host header values served besides localhost, loopback, the bound address and --public-url's "
            "host ('*': any); bound to every address (0.0.0.0, ::) with none given, any Host is served",
            "access",
        ),
    )
    allowed_origins: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "browser origins (https://shop.example.com) besides the service's own that may post offers "
            "and use the API ('*': any)",
            "access",
        ),
    )
    metrics_token: str = field(
        default="",
        metadata=_opt(
            "bearer token a scraper presents on /metrics instead of --token ('' = --token guards it)",
            "access",
        ),
    )
    setup_rate: float = field(
        default=1.0,
        metadata=_opt(
            "call set-ups per second per source address (offers, SIP INVITEs, carrier streams; 0: no limit)",
            "limits",
        ),
    )
    # At or under --max-calls: one source's burst alone must not be able to take every line.
    setup_burst: int = field(
        default=8, metadata=_opt("call set-ups a source may make at once before --setup-rate", "limits")
    )
    max_calls_per_source: int = field(
        default=4,
        metadata=_opt(
            "calls one source address (IPv6: its /64) may hold at once (0: no cap); --rate-limit-exempt "
            "networks, --sip-allow trunks and carriers whose webhooks are signed are spared",
            "limits",
        ),
    )
    rate_limit_exempt: tuple[str, ...] = field(
        # Loopback is this host: its own proxy, PBX or tools (a proxy in front should be named in
        # --trusted-proxies, so that the callers behind it are counted one by one).
        default=("127.0.0.0/8", "::1"),
        metadata=_opt(
            "addresses or CIDR networks the set-up rate limit spares (a carrier; --sip-allow trunks are "
            "spared too)",
            "limits",
        ),
    )
