"""The record settings: where call records are kept, with or without what was said, and how long.
A group of `Settings` (config.py), which inherits it; records/ reads it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from parley.settings_option import opt as _opt

DATABASE_SCHEMES = ("postgresql://", "postgres://")


def default_data_dir() -> Path:
    """Where call records live by default: $XDG_DATA_HOME/parley, else ~/.local/share/parley."""
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base) if base else Path.home() / ".local" / "share") / "parley"


@dataclass(frozen=True)
class RecordSettings:
    """Call records."""

    data_dir: str = field(
        default="", metadata=_opt("folder for call records (default ~/.local/share/parley)", "operations")
    )
    database: str = field(
        default="",
        metadata=_opt(
            "where call records go: '' = SQLite in --data-dir, postgresql://... (a fleet shares one), 'off'",
            "operations",
        ),
    )
    record_transcripts: bool = field(
        default=True,
        metadata=_opt(
            "keep what was said in call records and call.ended/tool.called events ('off': no text, "
            "digits, tool arguments or results, caller-set variables; numbers masked)",
            "operations",
        ),
    )
    retention_days: float = field(
        default=30.0,
        metadata=_opt("call records older than this are deleted (0: kept forever)", "operations"),
    )

    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()
