"""What the programs a benchmark or test starts beside parley (Kamailio, HAProxy, Prometheus) share:
found where Debian installs them, stopped with SIGTERM (then SIGKILL), and used as context managers that
start them."""

from __future__ import annotations

import shutil
import subprocess
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

STOP_WAIT_S = 10.0
# Where Debian puts daemons and their tools: outside the PATH of a user who is not root.
SYSTEM_BINS = "/usr/sbin:/usr/local/sbin:/sbin"


def system_program(name: str) -> str | None:
    """The program `name` from the PATH, else from where Debian puts daemons; None if it is not installed."""
    return shutil.which(name) or shutil.which(name, path=SYSTEM_BINS)


class Daemon(ABC):
    process: subprocess.Popen[bytes] | None = None

    @abstractmethod
    def start(self) -> Self:
        """Start the process; return once it serves."""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
