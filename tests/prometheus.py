"""A real Prometheus for tests (Debian's `prometheus`): scrapes given targets every second, evaluates
deploy/prometheus/rules.yml every second, answers PromQL over its HTTP API; its storage is a temporary
folder, and it is stopped (and reaped) afterwards."""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from parley.bench.daemon import system_program
from parley.bench.service import free_port
from tests.daemon import Daemon

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "parley.json"


def binary(name: str) -> str:
    found = system_program(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install Debian's prometheus (make install does)")
    return found


class Prometheus(Daemon):
    def __init__(self, folder: Path, targets: list[str], interval_s: int = 1) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "parley", "static_configs": [{"targets": targets}]}],
        }
        self.config = folder / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # YAML is a superset of JSON
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Prometheus:
        self._log = open(self.folder / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError("prometheus did not become ready")

    def log(self) -> str:
        path = self.folder / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        assert data["resultType"] == "matrix"
        return list(data["result"])

    def stop(self) -> None:
        super().stop()
        if self._log is not None:
            self._log.close()


def finite_points(result: list[dict[str, Any]]) -> int:
    return sum(1 for series in result for _, value in series["values"] if math.isfinite(float(value)))
