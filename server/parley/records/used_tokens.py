"""Call tokens a fleet has spent, in the records database: each opens one call on whichever instance.

In memory (access.py `MemoryUsedTokens`), a token opens one call per process, so behind a load balancer
it opens one call per instance. With the records in PostgreSQL, every instance claims the token's id in
one table: `INSERT ... ON CONFLICT DO NOTHING` lets exactly one of them have it. Rows go once their token
has expired (and a margin, so that a token checked just before its expiry cannot be claimed twice).

Blocking: the event loop calls it through `asyncio.to_thread` (Access.claim).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from parley.records.database import POSTGRES_SCHEMES, Database, PostgresDatabase, Reconnecting

PURGE_EVERY_S = 60.0
PURGE_MARGIN_S = 60.0

T = TypeVar("T")


class DatabaseUsedTokens:
    """`UsedTokens` (access.py) in the records database's `used_call_tokens` table (schema.py)."""

    def __init__(self, connect: Callable[[], Database]) -> None:
        self._db = Reconnecting(connect, Database.close)
        self._next_purge = 0.0

    def claim(self, token_id: str, expires_at: float) -> bool:
        """True for the first claim of `token_id` anywhere; DatabaseError when the database cannot say."""

        def insert(db: Database) -> bool:
            self._purge_if_due(db)
            rows = db.rows(
                "INSERT INTO used_call_tokens (token_id, expires_at) VALUES (?, ?) "
                "ON CONFLICT (token_id) DO NOTHING RETURNING token_id",
                (token_id, expires_at),
            )
            return bool(rows)

        return self._db.run(insert)

    def unclaim(self, token_id: str) -> None:
        """The call the claim was for did not open: the token may open one again."""

        def delete(db: Database) -> None:
            db.execute("DELETE FROM used_call_tokens WHERE token_id = ?", (token_id,))

        self._db.run(delete)

    def close(self) -> None:
        self._db.close()

    def _purge_if_due(self, db: Database) -> None:
        now = time.time()
        if now >= self._next_purge:
            self._next_purge = now + PURGE_EVERY_S
            db.execute("DELETE FROM used_call_tokens WHERE expires_at < ?", (now - PURGE_MARGIN_S,))


def shared_used_tokens(database: str) -> DatabaseUsedTokens | None:
    """The fleet's store when the records are in PostgreSQL (`--database postgresql://...`), else None:
    a SQLite file belongs to one host, and in memory is as good there."""
    if not database.startswith(POSTGRES_SCHEMES):
        return None
    return DatabaseUsedTokens(partial(PostgresDatabase, database))
