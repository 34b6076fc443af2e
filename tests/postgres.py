"""A throw-away PostgreSQL cluster for tests: Debian's `postgresql` (initdb, pg_ctl) on a free loopback
port in a temporary folder, stopped and deleted afterwards.

PostgreSQL refuses to run as root, so as root the cluster runs as `nobody` (through `runuser`), in a
folder of its own under /tmp (pytest's temporary folders are private to root). Trust authentication on
127.0.0.1 only; fsync off (a test cluster needs no durability).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.bench.service import free_port

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
USER = "parley"


def _binary(name: str) -> str:
    for folder in BIN_DIRS:
        if (folder / name).is_file():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install Debian's postgresql (make install does)")
    return found


def available() -> bool:
    try:
        _binary("initdb")
        _binary("pg_ctl")
    except FileNotFoundError:
        return False
    return True


class PostgresCluster:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="parley-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "nobody")
        self.started = False

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=60)

    def start(self) -> PostgresCluster:
        self._run(
            _binary("initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.root / "postgres.log")
        self._run(
            _binary("pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "-t", "30", "start"
        )
        self.started = True
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            if self.started:
                self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            self.started = False
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    """A throw-away PostgreSQL cluster for a test module (import it, with `database`, where needed)."""
    server = PostgresCluster()
    try:
        server.start()
    except Exception:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    """(the --database setting, the --data-dir) of an empty records database, in each kind."""
    if request.param == "sqlite":
        return "", tmp_path
    server: PostgresCluster = request.getfixturevalue("cluster")
    return server.new_database(), tmp_path
