"""Settings: one typed object, made in one place (flags > environment > config file > defaults).

Every field is a `parley serve` flag (`--field-name`) and an environment variable (`PARLEY_FIELD_NAME`);
settings_sources.py reads them. No other module reads the environment (but record_settings.py, for
$XDG_DATA_HOME: the data folder's default).
"""

from __future__ import annotations

from dataclasses import dataclass

from parley.access_settings import AccessSettings
from parley.agent_settings import DEFAULT_GREETING, DEFAULT_SYSTEM_PROMPT, AgentSettings
from parley.call_settings import CallSettings
from parley.carrier_settings import CarrierSettings
from parley.engine_settings import EngineSettings, default_cache_dir
from parley.record_settings import DATABASE_SCHEMES, RecordSettings, default_data_dir
from parley.recording_settings import RecordingSettings
from parley.service_settings import ServiceSettings
from parley.sip_settings import SipSettings
from parley.turn_settings import TurnSettings
from parley.webrtc_settings import WebRtcSettings

__all__ = [
    "DATABASE_SCHEMES",
    "DEFAULT_GREETING",
    "DEFAULT_SYSTEM_PROMPT",
    "ENV_ALIASES",
    "ENV_PREFIX",
    "Settings",
    "SettingsError",
    "default_cache_dir",
    "default_data_dir",
    "rtp_port_range",
    "sip_address",
]

ENV_PREFIX = "PARLEY_"
ENV_ALIASES = {"cache_dir": "PARLEY_CACHE"}  # the cache folder's variable: PARLEY_CACHE


# A dataclass takes its bases' fields from the last base to the first: SIP first, the call's limits last.
# This order keeps the flags of each `parley serve --help` section in the order they had when Settings was
# one class (settings_sources.py orders the sections themselves).
@dataclass(frozen=True)
class Settings(
    CallSettings,
    WebRtcSettings,
    AccessSettings,
    RecordingSettings,
    RecordSettings,
    AgentSettings,
    EngineSettings,
    CarrierSettings,
    ServiceSettings,
    TurnSettings,
    SipSettings,
):
    """Every setting: each part's group of settings (in a module named for the part), all together. A part
    takes its own group; what composes the parts (app.py, runtime.py, cli.py) takes this."""


class SettingsError(ValueError):
    pass


def sip_address(value: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingsError(f"sip must be HOST:PORT or 'off', not {value!r}")
    return host.strip("[]"), int(port)


def rtp_port_range(value: str) -> tuple[int, int]:
    """`LOW-HIGH` -> (low, high), an even low and room for at least one RTP/RTCP pair."""
    low, sep, high = value.partition("-")
    if not sep or not low.isdigit() or not high.isdigit():
        raise SettingsError(f"rtp_ports must be LOW-HIGH, not {value!r}")
    lo, hi = int(low), int(high)
    if not 1024 <= lo < hi < 65536:
        raise SettingsError(f"rtp_ports {value!r} must lie within 1024-65535, low below high")
    return lo + lo % 2, hi
