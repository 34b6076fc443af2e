"""`parley serve` in a child process on a free loopback port, for benchmarks and tests."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any


def free_port() -> int:
    """A loopback port free for both TCP and UDP (SIP listens on both)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port: int = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """How a command that starts the service itself (a benchmark, `parley test`) is told to start it."""
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `parley serve` flag for the started service (repeatable: --server-arg=--device=cpu)",
    )
    parser.add_argument("--server-log", default="", help="write the started service's log here")


class Service:
    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        ports: tuple[int, int] | None = None,
    ):
        """`ports`: (HTTP, SIP) to serve on, as an instance replacing one that stopped does (default: free
        ones)."""
        self.port, self.sip_port = ports or (free_port(), free_port())
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.sip_uri = f"sip:parley@127.0.0.1:{self.sip_port}"
        self.args = [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ice-addresses",
            "127.0.0.1",
            "--sip",
            f"127.0.0.1:{self.sip_port}",
            *args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 300.0) -> Service:
        self._log = open(self.log_path, "wb") if self.log_path else None  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "parley", "serve", *self.args],
            env=self.env,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"parley serve exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError("parley serve did not become ready")

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=10) as r:
            return json.loads(r.read())

    def metrics_text(self) -> str:
        return metrics_text(self.base_url)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a clean shutdown: calls ended, threads joined), then SIGKILL if it hangs."""
        code = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.process.wait()
        elif self.process is not None:
            code = self.process.returncode
        if self._log is not None:
            self._log.close()
        return code

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metrics_text(base_url: str) -> str:
    """A service's /metrics, as Prometheus text."""
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=10) as r:
        return str(r.read().decode())


def speculation_counts(text: str) -> str:
    """`parley_speculative_replies_total` as "used / wasted": replies started at the caller's pause that
    the turn ended at, and those the caller went on past."""
    used, wasted = (
        metric_value(text, "parley_speculative_replies_total", {"outcome": o}) for o in ("used", "wasted")
    )
    return f"{used:.0f} / {wasted:.0f}"


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of a metric's samples in Prometheus text that carry the given labels."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        if labels and not all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            continue
        total += float(value)
    return total
