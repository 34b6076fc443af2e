"""The records database: SQLite (a file, the default) or PostgreSQL (a fleet shares one), behind one
small interface. Statements are written once with `?` placeholders in SQL both dialects accept
(upserts with ON CONFLICT, row values, `||`); PostgreSQL gets `%s` instead.

A `Database` is one connection, used by one thread at a time (the caller holds its own lock or owns
it); transactions are explicit.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

Params = Sequence[Any]
T = TypeVar("T")
C = TypeVar("C")


class DatabaseError(Exception):
    """The database could not be reached or refused a statement."""


class Database(Protocol):
    kind: str  # "sqlite" | "postgresql"

    def transaction(self) -> contextlib.AbstractContextManager[None]: ...

    def execute(self, sql: str, params: Params = ()) -> None: ...

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]: ...

    def lock_for_migration(self) -> None: ...

    def close(self) -> None: ...


WAL_SWITCH_WAIT_S = 10.0
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


class Reconnecting(Generic[C]):
    """A connection (or what wraps one) made on first use, used under a lock, and made again once when an
    operation fails with DatabaseError: the database restarted, or the network dropped the connection."""

    def __init__(self, connect: Callable[[], C], close: Callable[[C], None]) -> None:
        self._connect = connect
        self._close = close
        self._held: C | None = None
        self._lock = threading.Lock()

    def run(self, operation: Callable[[C], T]) -> T:
        """`operation` on the connection; DatabaseError when it fails on a fresh connection too."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._held is None:
                        self._held = self._connect()
                    return operation(self._held)
                except DatabaseError:
                    self._drop()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(Exception):  # a connection already broken may fail to close too
                self._close(held)


class SqliteDatabase:
    """One SQLite connection. WAL lets the API read while the writer writes; with synchronous=NORMAL a
    committed event survives the process crashing (only a power loss can take the last ones).

    The file holds what callers said: it is created readable by its owner only (0600; SQLite gives its
    -wal and -shm files the database's mode), in a folder of the owner's own (0700) when this creates it,
    and a file left readable by others (by an older parley) is made private at open."""

    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            _private_folder(path.parent)
            _private_file(path)
            self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10)
            self._wal()
            self._conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as exc:
            raise DatabaseError(f"cannot open the records database {path}: {exc}") from exc

    def _wal(self) -> None:
        """Switch to WAL. Switching needs the database to itself and SQLite does not wait for that (the
        busy timeout does not apply): when several instances open a new file at once, retry briefly."""
        deadline = time.monotonic() + WAL_SWITCH_WAIT_S
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            self._conn.execute("BEGIN IMMEDIATE")  # take the write lock now: two migrators wait in turn
        except sqlite3.Error as exc:
            raise DatabaseError(str(exc)) from exc
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def execute(self, sql: str, params: Params = ()) -> None:
        try:
            self._conn.execute(sql, tuple(params))
        except sqlite3.Error as exc:
            raise DatabaseError(str(exc)) from exc

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._conn.execute(sql, tuple(params)).fetchall())
        except sqlite3.Error as exc:
            raise DatabaseError(str(exc)) from exc

    def lock_for_migration(self) -> None:
        """BEGIN IMMEDIATE already holds the database's write lock."""

    def close(self) -> None:
        self._conn.close()


def _private_folder(folder: Path) -> None:
    if not folder.exists():
        # Several instances may make a new data folder at once (a fleet on one machine).
        folder.mkdir(parents=True, mode=PRIVATE_FOLDER, exist_ok=True)
        os.chmod(folder, PRIVATE_FOLDER)  # mkdir's mode passes through the umask


def _private_file(path: Path) -> None:
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE))
    for file in (path, *(path.with_name(path.name + suffix) for suffix in SQLITE_SIDE_FILES)):
        with contextlib.suppress(FileNotFoundError):
            mode = stat.S_IMODE(file.stat().st_mode)
            if mode & 0o077:
                os.chmod(file, mode & 0o700)


MIGRATION_LOCK = 7_041_995  # pg_advisory_xact_lock key: instances of a fleet migrate one at a time


class PostgresDatabase:
    kind = "postgresql"

    def __init__(self, url: str, connect_timeout_s: float = 10.0) -> None:
        import psycopg

        self._psycopg = psycopg
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=int(connect_timeout_s))
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect to the records database: {exc}") from exc

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self._conn.transaction():
                yield
        except self._psycopg.Error as exc:
            raise DatabaseError(str(exc)) from exc

    def execute(self, sql: str, params: Params = ()) -> None:
        try:
            self._conn.execute(_postgres(sql), tuple(params))
        except self._psycopg.Error as exc:
            raise DatabaseError(str(exc)) from exc

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._conn.execute(_postgres(sql), tuple(params)).fetchall())
        except self._psycopg.Error as exc:
            raise DatabaseError(str(exc)) from exc

    def lock_for_migration(self) -> None:
        self.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))

    def close(self) -> None:
        self._conn.close()


def _postgres(sql: str) -> str:
    return sql.replace("?", "%s")


POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def connect(database: str, data_dir: Path) -> Database:
    """`database` as the setting gives it: '' (SQLite in `data_dir`) or a postgresql:// URL."""
    if database.startswith(POSTGRES_SCHEMES):
        return PostgresDatabase(database)
    return SqliteDatabase(data_dir / "calls.sqlite3")
