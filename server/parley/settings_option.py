"""How a setting describes itself: its help, its group in `parley serve --help`, and its choices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def opt(help: str, group: str = "service", choices: Sequence[str] | None = None) -> dict[str, Any]:
    """The metadata of a Settings field (settings_sources.py makes flags and variables of it)."""
    return {"help": help, "group": group, "choices": choices}
