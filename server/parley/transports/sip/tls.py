"""TLS for SIP (RFC 3261 26.2, RFC 5630): the contexts the listener and outbound connections use.

The server side presents our certificate; callers are not asked for one (a trunk that wants mutual TLS
gets ours when we connect out). The client side verifies the peer's certificate and name against the
system's CAs, or against `--sip-tls-ca-file` for a trunk with a private CA: a `sips:` call to a peer
we cannot authenticate would carry the caller's voice to whoever answers.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from parley.config import SettingsError


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The listener's context: our certificate chain and key (PEM), TLS 1.2 at least."""
    if not cert_file or not key_file:
        raise SettingsError("--sip-tls needs --sip-tls-cert-file and --sip-tls-key-file (PEM files)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert_file, key_file)
    return context


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """Outbound connections: the peer's certificate checked against `ca_file` (else the system's CAs)
    and its name; ours offered when we have one (a trunk may ask for it)."""
    if ca_file and not Path(ca_file).is_file():
        raise SettingsError(f"--sip-tls-ca-file {ca_file!r} is not a file")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file and key_file:
        _load_chain(context, cert_file, key_file)
    return context


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    for name, path in (("--sip-tls-cert-file", cert_file), ("--sip-tls-key-file", key_file)):
        if not Path(path).is_file():
            raise SettingsError(f"{name} {path!r} is not a file")
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise SettingsError(f"cannot load the SIP TLS certificate and key: {exc}") from None
