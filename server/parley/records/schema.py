"""The records schema, as numbered migrations applied in order and remembered in `schema_version`.

A migration is never edited once released: a change is a new migration with the next number. Every
instance migrates at start, one at a time (SQLite's write lock, PostgreSQL's advisory lock), so a fleet
sharing one database upgrades it once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from parley.log import event
from parley.records.database import Database

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "calls, their turns and their events",
        (
            """CREATE TABLE calls (
                call_id TEXT PRIMARY KEY,
                transport TEXT NOT NULL,
                caller TEXT NOT NULL DEFAULT '',
                called TEXT NOT NULL DEFAULT '',
                context TEXT NOT NULL DEFAULT '{}',
                instance TEXT NOT NULL DEFAULT '',
                started_at DOUBLE PRECISION NOT NULL,
                ended_at DOUBLE PRECISION,
                outcome TEXT,
                turns INTEGER NOT NULL DEFAULT 0,
                barge_ins INTEGER NOT NULL DEFAULT 0,
                last_event_at DOUBLE PRECISION NOT NULL
            )""",
            "CREATE INDEX calls_by_start ON calls (started_at, call_id)",
            "CREATE INDEX calls_by_end ON calls (ended_at)",
            """CREATE TABLE turns (
                call_id TEXT NOT NULL,
                turn_id TEXT NOT NULL,
                position BIGINT NOT NULL,
                revision INTEGER NOT NULL DEFAULT 0,
                keypad INTEGER NOT NULL DEFAULT 0,
                user_text TEXT,
                agent_text TEXT,
                agent_state TEXT NOT NULL DEFAULT 'pending',
                started_at DOUBLE PRECISION NOT NULL,
                response_s DOUBLE PRECISION,
                stt_s DOUBLE PRECISION,
                llm_first_token_s DOUBLE PRECISION,
                tts_first_audio_s DOUBLE PRECISION,
                PRIMARY KEY (call_id, turn_id)
            )""",
            """CREATE TABLE call_events (
                call_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                type TEXT NOT NULL,
                data TEXT NOT NULL,
                PRIMARY KEY (call_id, seq)
            )""",
        ),
    ),
    Migration(
        2,
        "call tokens spent by any instance (records/used_tokens.py)",
        (
            """CREATE TABLE used_call_tokens (
                token_id TEXT PRIMARY KEY,
                expires_at DOUBLE PRECISION NOT NULL
            )""",
            "CREATE INDEX used_call_tokens_by_expiry ON used_call_tokens (expires_at)",
        ),
    ),
    Migration(
        3,
        "what is known of a call after its turns: answering-machine verdict, recording, analysis",
        (
            "ALTER TABLE calls ADD COLUMN amd TEXT",  # JSON: the verdict on an outbound call's answer
            "ALTER TABLE calls ADD COLUMN recording TEXT",  # where its recording is kept
            "ALTER TABLE calls ADD COLUMN analysis TEXT",  # JSON: the post-call analysis
        ),
    ),
    Migration(
        4,
        "the instances of a fleet and when each was last heard from (a silent one's calls are crashed)",
        (
            """CREATE TABLE instances (
                instance TEXT PRIMARY KEY,
                seen_at DOUBLE PRECISION NOT NULL
            )""",
        ),
    ),
)


def current_version(db: Database) -> int:
    with db.transaction():
        db.lock_for_migration()  # two instances creating the table at once would collide in PostgreSQL
        db.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            "version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
        )
    rows = db.rows("SELECT MAX(version) FROM schema_version")
    return int(rows[0][0] or 0) if rows else 0


def migrate(db: Database, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Apply the migrations this database lacks, each in its own transaction; returns the version."""
    version = current_version(db)
    for migration in migrations:
        if migration.version <= version:
            continue
        with db.transaction():
            db.lock_for_migration()
            # Another instance may have applied it while this one waited for the lock.
            done = db.rows("SELECT 1 FROM schema_version WHERE version = ?", (migration.version,))
            if not done:
                for statement in migration.statements:
                    db.execute(statement)
                db.execute(
                    "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.description, time.time()),
                )
                event(log, "records_migrated", version=migration.version, database=db.kind)
        version = migration.version
    return version
