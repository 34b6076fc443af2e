"""The SIP settings: where the user agent listens (UDP, TCP, TLS), who may call in and how they prove it,
where the agent may dial out and with which credentials, RTP, and the bounds on what SIP peers may hold.

A group of their own within `Settings` (config.py), which inherits them; transports/sip/ reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt


@dataclass(frozen=True)
class SipSettings:
    """SIP and RTP: the phone trunks' side of the service."""

    sip: str = field(
        default="127.0.0.1:5060",
        metadata=_opt("HOST:PORT the SIP user agent listens on (UDP and TCP), or 'off'", "sip"),
    )
    sip_public_address: str = field(
        default="",
        metadata=_opt("address put in Contact, Via and SDP for peers behind NAT ('' = bound address)", "sip"),
    )
    sip_allow: tuple[str, ...] = field(
        default=(), metadata=_opt("source addresses or CIDR networks allowed to send SIP (empty: any)", "sip")
    )
    sip_auth_user: str = field(
        default="",
        metadata=_opt(
            "digest user callers must authenticate as (inbound only: dial-out answers its trunk's "
            "challenges with --sip-outbound-user)",
            "sip",
        ),
    )
    sip_auth_password: str = field(default="", metadata=_opt("digest password for --sip-auth-user", "sip"))
    sip_realm: str = field(default="parley", metadata=_opt("digest realm of our challenges", "sip"))
    sip_caller_id: str = field(default="parley", metadata=_opt("user part of From on outbound calls", "sip"))
    dial_trunks: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "trunks dial-out may use: hosts or host:port, as destinations name them, never resolved to match "
            "(empty: dial-out is off)",
            "sip",
        ),
    )
    dial_prefixes: tuple[str, ...] = field(
        default=(), metadata=_opt("number prefixes dial-out may call, e.g. +1,+44 (empty: any number)", "sip")
    )
    dial_max_per_hour: int = field(
        default=60, metadata=_opt("dial-outs allowed in any hour; beyond it 429 (0: no limit)", "sip")
    )
    sip_outbound_user: str = field(
        default="",
        metadata=_opt(
            "digest user dial-out answers a --dial-trunks trunk's 401/407 with "
            "('' = challenges go unanswered)",
            "sip",
        ),
    )
    sip_outbound_password: str = field(
        default="", metadata=_opt("digest password for --sip-outbound-user", "sip")
    )
    sip_outbound_realm: str = field(
        default="",
        metadata=_opt(
            "realm of --sip-outbound-user: a challenge in another is not answered ('' = any)", "sip"
        ),
    )
    sip_outbound_trunk: str = field(
        default="",
        metadata=_opt(
            "the --dial-trunks entry --sip-outbound-user belongs to: other trunks' challenges go unanswered "
            "('' = any of them)",
            "sip",
        ),
    )
    sip_ring_ms: int = field(
        default=0, metadata=_opt("an incoming SIP call rings this long before the agent answers", "sip")
    )
    sip_ring_timeout_s: float = field(
        default=30.0, metadata=_opt("an outbound call not answered within this fails (no_answer)", "sip")
    )
    rtp_ports: str = field(
        default="20000-29999", metadata=_opt("UDP port range for RTP (even ports; RTCP +1)", "sip")
    )
    rtp_timeout_s: float = field(
        default=30.0, metadata=_opt("a SIP call with no RTP for this long is ended (0: never)", "sip")
    )
    sip_tls: str = field(
        default="",
        metadata=_opt("HOST:PORT the SIP user agent takes TLS on (5061 is usual; '' = no TLS)", "sip"),
    )
    sip_tls_cert_file: str = field(
        default="",
        metadata=_opt("PEM certificate chain presented on --sip-tls (and to trunks we dial)", "sip"),
    )
    sip_tls_key_file: str = field(default="", metadata=_opt("PEM private key of --sip-tls-cert-file", "sip"))
    sip_tls_ca_file: str = field(
        default="",
        metadata=_opt(
            "PEM CAs that sign the certificates of peers dialled over TLS ('' = the system's)", "sip"
        ),
    )
    sip_require_encryption: bool = field(
        default=False,
        metadata=_opt(
            "refuse a new SIP call that does not come over TLS (needs --sip-tls) or offers no SRTP", "sip"
        ),
    )
    # limits on what SIP peers may hold and send
    sip_trunk_setup_rate: float = field(
        default=20.0,
        metadata=_opt(
            "SIP call set-ups per second from all --sip-allow trunks together (they are spared --setup-rate; "
            "a UDP source can be forged; 0: no limit)",
            "limits",
        ),
    )
    sip_trunk_setup_burst: int = field(
        default=40, metadata=_opt("SIP call set-ups the trunks may make at once before the rate", "limits")
    )
    sip_request_rate: float = field(
        default=10.0,
        metadata=_opt(
            "SIP requests per second per source outside any call, other than INVITE (OPTIONS, REGISTER...); "
            "past it they are dropped unanswered (--sip-allow trunks spared; 0: no limit)",
            "limits",
        ),
    )
    sip_request_burst: int = field(
        default=50, metadata=_opt("SIP requests outside any call a source may send at once", "limits")
    )
    sip_max_transactions: int = field(
        default=2048,
        metadata=_opt("SIP server transactions held at once; beyond it 503 + Retry-After", "limits"),
    )
    sip_max_transactions_per_source: int = field(
        default=128,
        metadata=_opt(
            "SIP server transactions one source may hold at once (--sip-allow trunks spared; 0: no cap)",
            "limits",
        ),
    )
    sip_max_connections: int = field(
        default=1024, metadata=_opt("SIP TCP and TLS connections peers may hold open at once", "limits")
    )
    sip_max_connections_per_source: int = field(
        default=32, metadata=_opt("SIP TCP and TLS connections one source may hold open at once", "limits")
    )
    sip_connection_idle_s: float = field(
        default=300.0,
        metadata=_opt(
            "a SIP TCP or TLS connection with no message for this long is closed (keep-alives do not count)",
            "limits",
        ),
    )
