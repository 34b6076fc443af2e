"""How a setting describes itself: its help, its group in `parley serve --help`, and its choices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The sections of `parley serve --help`, in the order they are shown whatever order the groups' fields
# come in (a group's name not here gets a section after them).
SECTIONS = (
    "sip",
    "limits",
    "turns",
    "service",
    "webrtc",
    "carriers",
    "engines",
    "agent",
    "operations",
    "access",
)


def opt(help: str, group: str = "service", choices: Sequence[str] | None = None) -> dict[str, Any]:
    """The metadata of a Settings field (settings_sources.py makes flags and variables of it)."""
    return {"help": help, "group": group, "choices": choices}
