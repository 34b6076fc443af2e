"""Python tools for the agent tests (an agent file names them as `tests.agent_tools:function`)."""

from __future__ import annotations

import time
from typing import Any

CALLS: list[dict[str, Any]] = []


def lookup_order(number: str) -> dict[str, Any]:
    CALLS.append({"tool": "lookup_order", "number": number})
    return {"number": number, "status": "shipped", "eta": "Thursday"}


def slow_lookup(number: str) -> dict[str, Any]:
    time.sleep(1.5)
    CALLS.append({"tool": "slow_lookup", "number": number})
    return {"number": number, "status": "delayed"}


def broken(**arguments: Any) -> None:
    raise RuntimeError("database is down")
