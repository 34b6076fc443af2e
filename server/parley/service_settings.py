"""The service's own settings: where its HTTP server listens, the calls it takes, what it serves and logs.
A group of `Settings` (config.py), which inherits it; cli.py, app.py, runtime.py and drain.py read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt


@dataclass(frozen=True)
class ServiceSettings:
    """The HTTP service and its log."""

    host: str = field(default="127.0.0.1", metadata=_opt("address the HTTP server binds to"))
    port: int = field(default=8080, metadata=_opt("HTTP port"))
    max_calls: int = field(default=16, metadata=_opt("calls accepted at once; beyond it 503 + Retry-After"))
    instance_tag: str = field(
        default="",
        metadata=_opt(
            "this instance's name in its call ids (c-TAG-...), for a proxy in front of a fleet to send a "
            "call's requests to the instance that holds it (a DNS label: 1-63 lowercase letters, digits "
            "and inner hyphens, such as a Kubernetes pod's name; '' = none)"
        ),
    )
    max_body_bytes: int = field(default=65536, metadata=_opt("largest accepted signaling body (bytes)"))
    web_dir: str = field(default="", metadata=_opt("folder served at / (default: the repository's web/)"))
    log_level: str = field(default="info", metadata=_opt("debug, info, warning, error"))
    debug_audio_dir: str = field(
        default="", metadata=_opt("write every user utterance here as a WAV (for debugging; '' = off)")
    )
    # operations
    log_format: str = field(
        default="text", metadata=_opt("log lines as key=value text or JSON", "operations", ("text", "json"))
    )
    log_transcripts: bool = field(
        default=False,
        metadata=_opt(
            "log what callers and the agent said at info level too (else only at debug)", "operations"
        ),
    )
    log_numbers: bool = field(
        default=False,
        metadata=_opt("log phone numbers whole (else masked to their last 3 digits)", "operations"),
    )
