"""Shared fixtures: the real service in a child process, and Whisper to check what callers heard; a
throw-away PostgreSQL cluster and a records database of each kind come from tests/postgres.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.bench.service import Service
from parley.config import Settings
from parley.engines.stt import SttEngine

pytest_plugins = ["tests.postgres"]  # its `cluster` and `database` fixtures


@pytest.fixture(scope="session", autouse=True)
def data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Call records of every service the tests start (in or out of process) go to a temporary folder,
    not ~/.local/share/parley."""
    folder = tmp_path_factory.mktemp("xdg-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_DATA_HOME", str(folder))
        yield folder


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`parley serve` with the default, real models, on a free loopback port."""
    log_path: Path = tmp_path_factory.mktemp("service") / "parley.log"
    service = Service(("--dial-trunks", "127.0.0.1"), log_path=log_path)  # the softphones it dials
    try:
        service.start()
    except Exception:
        print(log_path.read_text()[-5000:])
        raise
    yield service
    code = service.stop()
    assert code == 0, f"parley serve exited with {code}:\n{log_path.read_text()[-3000:]}"


@pytest.fixture(scope="session")
def whisper() -> Iterator[SttEngine]:
    """The packaged Whisper, to transcribe what a caller heard."""
    from parley.engines.stt import load_stt

    stt = load_stt(Settings(stt_workers=1))
    yield stt
    close = getattr(stt, "close", None)
    if callable(close):
        close()
