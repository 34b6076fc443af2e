"""Where settings come from: `parley serve` flags, the environment (`PARLEY_*`), a TOML or JSON file,
and secrets from the environment or a file only. `load_settings` merges them (flags > environment >
file > defaults) into one checked `Settings` (config.py); no other module reads the environment.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from parley.config import (
    DATABASE_SCHEMES,
    ENV_ALIASES,
    ENV_PREFIX,
    Settings,
    SettingsError,
    rtp_port_range,
    sip_address,
)
from parley.engine_settings import DENOISERS
from parley.settings_option import SECTIONS
from parley.sip_settings import SipSettings

# Secrets come from the environment (PARLEY_<NAME>) or a file (--<name>-file, PARLEY_<NAME>_FILE, or
# `<name>_file` in the config file), never from the command line: every user of the machine can read a
# process's arguments (ps, /proc/<pid>/cmdline).
SECRET_SETTINGS = frozenset(
    {
        "token",
        "metrics_token",
        "call_token_secret",
        "turn_secret",
        "webhook_secret",
        "stream_secret",
        "twilio_auth_token",
        "sip_auth_password",
        "sip_outbound_password",
        "llm_api_key",
    }
)


class _SecretOnCommandLine(argparse.Action):
    """A secret given as a flag's value: refused without echoing it."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None
    ) -> None:
        env = ENV_PREFIX + self.dest.removesuffix("_on_command_line").upper()
        parser.error(
            f"{option} takes no value on the command line, where every user of the machine can read it: "
            f"set {env}, or name a file with {option}-file"
        )


def _secret_from_file(name: str, path: Any) -> str:
    try:
        return Path(str(path)).expanduser().read_text().strip()
    except OSError as exc:
        raise SettingsError(f"{name}: cannot read the file {str(path)!r}: {exc.strerror}") from exc


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _convert(name: str, kind: Any, raw: Any) -> Any:
    """Turn a raw value (string from a flag or the environment, or a TOML value) into the field's type."""
    try:
        if kind in ("tuple[str, ...]",):
            # A comma list, or (a repeated flag, a TOML array) several values, each maybe a comma list.
            values = [raw] if isinstance(raw, str) else [str(part) for part in raw]
            return tuple(part.strip() for value in values for part in value.split(",") if part.strip())
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "str":
            return str(raw)
        if kind == "bool":
            return _boolean(raw)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{name}: {raw!r} is not a valid {kind}") from exc
    raise SettingsError(f"{name}: unsupported setting type {kind}")


def _boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting. Defaults stay None so that the environment and the file can fill them."""
    parser.add_argument(
        "--config", help="TOML or JSON settings file (keys as in the flags, with underscores)"
    )
    groups = {name: parser.add_argument_group(name) for name in SECTIONS}  # argparse shows none empty
    for f in fields(Settings):
        group_name = f.metadata.get("group", "service")
        group = groups.get(group_name) or parser.add_argument_group(group_name)
        groups[group_name] = group
        default = f.default
        shown = ",".join(default) if isinstance(default, tuple) else default
        env = ENV_PREFIX + f.name.upper()
        if f.name in SECRET_SETTINGS:
            group.add_argument(
                _flag(f.name), dest=f"{f.name}_on_command_line", nargs="?", action=_SecretOnCommandLine,
                help=argparse.SUPPRESS,
            )  # fmt: skip
            group.add_argument(
                _flag(f.name) + "-file", dest=f"{f.name}_file", default=None, metavar="FILE",
                help=f"file holding the {f.metadata.get('help', '')} [env {env} or {env}_FILE]",
            )  # fmt: skip
            continue
        if str(f.type) == "bool":  # `--flag` alone means on; `--flag off` turns a default on off
            shown = "on" if default else "off"
            group.add_argument(
                _flag(f.name), dest=f.name, default=None, nargs="?", const="on", metavar="on|off",
                help=f"{f.metadata.get('help', '')} [env {env}; default {shown!r}]",
            )  # fmt: skip
            continue
        group.add_argument(
            _flag(f.name),
            dest=f.name,
            default=None,
            action="append" if str(f.type) == "tuple[str, ...]" else "store",  # lists: repeatable
            choices=f.metadata.get("choices"),
            help=f"{f.metadata.get('help', '')} [env {env}; default {shown!r}]",
        )


def _read_file(path: str) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"config file {path} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a table of settings")
    return {key.replace("-", "_"): value for key, value in data.items()}


def load_settings(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build the settings: flags win over the environment, which wins over the config file."""
    environ = os.environ if environ is None else environ
    given: dict[str, Any] = {}
    config_path = getattr(args, "config", None) or environ.get(ENV_PREFIX + "CONFIG")
    known = {f.name: f for f in fields(Settings)}
    if config_path:
        for key, value in _read_file(config_path).items():
            secret = key.removesuffix("_file")
            if secret in SECRET_SETTINGS and key != secret:
                given[secret] = _secret_from_file(secret, value)
                continue
            if key not in known:
                raise SettingsError(f"config file {config_path}: unknown setting {key!r}")
            given[key] = value
    for name in known:
        for variable in (ENV_ALIASES.get(name), ENV_PREFIX + name.upper()):
            if variable and environ.get(variable) is not None:
                given[name] = environ[variable]
        secret_file = environ.get(ENV_PREFIX + name.upper() + "_FILE")
        if name in SECRET_SETTINGS and secret_file:
            given[name] = _secret_from_file(name, secret_file)
    if args is not None:
        for name in known:
            value = getattr(args, name, None)
            if name in SECRET_SETTINGS and getattr(args, f"{name}_file", None):
                value = _secret_from_file(name, getattr(args, f"{name}_file"))
            if value is not None:
                given[name] = value
    converted = {name: _convert(name, str(known[name].type), value) for name, value in given.items()}
    settings = Settings(**converted)
    validate(settings)
    return settings


LLM_RUNTIMES = ("auto", "ctranslate2", "llamacpp", "transformers")
# A DNS label (RFC 1123): a Kubernetes pod's name serves as the tag unchanged (PARLEY_INSTANCE_TAG from
# the pod's metadata.name), and a proxy finds the pod at <tag>.<headless service>. A call id reads
# c-<tag>-<12 hex digits>: the tag is what lies between "c-" and the last hyphen.
INSTANCE_TAG = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def validate(settings: Settings) -> None:
    if not 0 < settings.port < 65536:
        raise SettingsError(f"port {settings.port} is out of range")
    if settings.device not in ("auto", "cpu", "cuda"):
        raise SettingsError(f"device must be auto, cpu or cuda, not {settings.device!r}")
    if settings.llm_runtime not in LLM_RUNTIMES:
        raise SettingsError(
            f"llm_runtime must be one of {', '.join(LLM_RUNTIMES)}, not {settings.llm_runtime!r}"
        )
    if settings.denoise not in DENOISERS:
        raise SettingsError(f"denoise must be one of {', '.join(DENOISERS)}, not {settings.denoise!r}")
    if settings.sip != "off":
        sip_address(settings.sip)
        validate_sip_security(settings)
    rtp_port_range(settings.rtp_ports)
    if settings.max_calls < 1:
        raise SettingsError("max_calls must be at least 1")
    if settings.instance_tag and not INSTANCE_TAG.fullmatch(settings.instance_tag):
        raise SettingsError(
            "instance_tag must be 1-63 lowercase letters, digits and inner hyphens (a DNS label, such "
            f"as a pod's name), not {settings.instance_tag!r}"
        )
    if settings.llm_threads < 0:
        raise SettingsError("llm_threads must be 0 (every core, one while Whisper or Piper computes) or more")
    if (
        settings.database
        and settings.database != "off"
        and not settings.database.startswith(DATABASE_SCHEMES)
    ):
        raise SettingsError(f"database must be '', 'off' or a postgresql:// URL, not {settings.database!r}")
    if settings.retention_days < 0:
        raise SettingsError("retention_days must be 0 (keep forever) or more")
    if (recording_problem := settings.recording_problem()) is not None:
        raise SettingsError(recording_problem)
    if not 0.0 < settings.vad_threshold < 1.0:
        raise SettingsError("vad_threshold must be between 0 and 1")
    for name in ("min_speech_ms", "end_of_turn_ms", "blip_silence_ms", "backchannel_max_ms"):
        if getattr(settings, name) <= 0:
            raise SettingsError(f"{name} must be positive")
    for name in ("reopen_grace_ms", "reopen_unheard_ms", "unfinished_hold_ms"):
        if getattr(settings, name) < 0:
            raise SettingsError(f"{name} must be 0 (none) or more")
    validate_access_and_limits(settings)


def validate_sip_security(settings: SipSettings) -> None:
    if settings.sip_tls:
        host, _, port = settings.sip_tls.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise SettingsError(f"sip_tls must be HOST:PORT (5061 is usual) or '', not {settings.sip_tls!r}")
        if not settings.sip_tls_cert_file or not settings.sip_tls_key_file:
            raise SettingsError("sip_tls needs sip_tls_cert_file and sip_tls_key_file (PEM files)")
    if settings.sip_require_encryption and not settings.sip_tls:
        raise SettingsError("sip_require_encryption needs sip_tls (HOST:PORT, e.g. 0.0.0.0:5061)")
    for name in ("sip_trunk_setup_rate", "sip_request_rate", "sip_max_transactions_per_source"):
        if getattr(settings, name) < 0:
            raise SettingsError(f"{name} must be 0 (no limit) or more")
    for name in ("sip_trunk_setup_burst", "sip_request_burst", "sip_max_transactions"):
        if getattr(settings, name) < 1:
            raise SettingsError(f"{name} must be at least 1")
    for name in ("sip_max_connections", "sip_max_connections_per_source", "sip_connection_idle_s"):
        if getattr(settings, name) <= 0:
            raise SettingsError(f"{name} must be positive")


def validate_access_and_limits(settings: Settings) -> None:
    for name in ("max_sdp_bytes", "max_m_lines", "max_ice_candidates", "max_dc_message_bytes"):
        if getattr(settings, name) < 1:
            raise SettingsError(f"{name} must be at least 1")
    for name in (
        "setup_rate",
        "media_timeout_s",
        "max_call_s",
        "max_silence_s",
        "idle_prompt_after_s",
        "engine_timeout_s",
    ):
        if getattr(settings, name) < 0:
            raise SettingsError(f"{name} must be 0 or more")
    for name in ("connect_timeout_s", "call_token_ttl_s", "turn_ttl_s", "max_turn_s"):
        if getattr(settings, name) <= 0:
            raise SettingsError(f"{name} must be positive")
    if settings.setup_burst < 1:
        raise SettingsError("setup_burst must be at least 1")
    if settings.max_calls_per_source < 0:
        raise SettingsError("max_calls_per_source must be 0 (no cap) or more")
    for origin in settings.allowed_origins:
        if origin != "*" and (not origin.startswith(("https://", "http://")) or origin.count("/") != 2):
            raise SettingsError(f"allowed_origins takes origins (https://shop.example.com), not {origin!r}")
    if settings.max_dc_messages_per_s <= 0:
        raise SettingsError("max_dc_messages_per_s must be positive")
    for url in settings.turn_urls:
        if not url.startswith(("turn:", "turns:")) or "@" in url:
            raise SettingsError(f"turn_urls takes turn: or turns: URLs without credentials, not {url!r}")
    if settings.turn_urls and not settings.turn_secret:
        raise SettingsError("turn_urls needs turn_secret (PARLEY_TURN_SECRET or --turn-secret-file)")
    for name in ("trusted_proxies", "rate_limit_exempt"):
        for network in getattr(settings, name):
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise SettingsError(f"{name}: {network!r} is not an address or a CIDR network") from exc
