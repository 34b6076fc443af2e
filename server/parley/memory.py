"""The process's memory allocator: a bounded number of glibc malloc arenas.

glibc gives threads their own malloc arenas (up to 8 per core), and an arena keeps what it once held.
The service starts threads all the time (each call's stages, each engine call's deadline worker) and
the engines allocate from whichever thread asks, so resident memory grew with every round of calls:
measured with three callers asking at once, six rounds, 1.60 -> 2.16 GB; with two arenas it stayed at
1.26-1.30 GB, with the same reply times. Set before the service starts its threads; an explicit
MALLOC_ARENA_MAX in the environment wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter number for the arena limit (glibc malloc.h)


def bound_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Limit glibc's malloc arenas; True when the limit is in force (False: not glibc, or set already)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))
