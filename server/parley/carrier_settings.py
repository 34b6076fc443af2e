"""The carrier settings: the public URL carriers reach, their webhook credentials, their media streams.
A group of `Settings` (config.py), which inherits it; transports/carrier_webhooks.py reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt


@dataclass(frozen=True)
class CarrierSettings:
    """Carrier media streams (Twilio, Telnyx): their webhooks and streams."""

    public_url: str = field(
        default="",
        metadata=_opt(
            "https:// base URL carriers reach this service at, e.g. behind a TLS proxy: signatures are "
            "checked against it and stream URLs built from it ('' = from the request)",
            "carriers",
        ),
    )
    twilio_auth_token: str = field(
        default="",
        metadata=_opt(
            "Twilio auth token: /twilio/voice needs a valid X-Twilio-Signature ('' = unchecked)", "carriers"
        ),
    )
    telnyx_public_key: str = field(
        default="",
        metadata=_opt(
            "Telnyx public key (base64): /telnyx/voice needs a valid Ed25519 signature ('' = unchecked)",
            "carriers",
        ),
    )
    stream_secret: str = field(
        default="",
        metadata=_opt(
            "secret for the per-call stream tokens the webhooks mint; the same on every instance of a fleet "
            "('' = a random one per process when a carrier credential is set, else streams need no token)",
            "carriers",
        ),
    )
    stream_start_timeout_s: float = field(
        default=10.0,
        metadata=_opt("a media stream that sends no start message within this is closed", "carriers"),
    )
