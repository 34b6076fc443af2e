"""The allocator limit `parley serve` sets before its threads start (memory.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from parley.memory import bound_malloc_arenas


def test_the_arena_limit_is_taken_on_glibc_and_an_explicit_environment_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = "from parley.memory import bound_malloc_arenas; print(bound_malloc_arenas())"
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "True"  # this machine's libc is glibc
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert bound_malloc_arenas() is False
