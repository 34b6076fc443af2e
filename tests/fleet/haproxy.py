"""Debian's HAProxy in front of parley instances, for the fleet tests: `deploy/haproxy/haproxy.cfg` as
deployed, but for its addresses (it binds a loopback port; its two servers are the instances).

    with HAProxy(tmp_path, [8091, 8092]) as proxy:
        caller = Caller(proxy.url)
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.daemon import Daemon
from tests.peers import free_port

DEPLOYED = Path(__file__).parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
SERVERS = ("10.0.0.5:8080", "10.0.0.6:8080")  # the deployed file's two instances
BIND = "bind 0.0.0.0:8080"


class HAProxy(Daemon):
    def __init__(self, folder: Path, instance_ports: list[int]) -> None:
        assert len(instance_ports) == len(SERVERS)
        self.port = free_port(udp=False, tcp=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = folder / "haproxy.cfg"
        self.log = folder / "haproxy.log"
        text = DEPLOYED.read_text()
        assert BIND in text and all(server in text for server in SERVERS), "the deployed config changed"
        text = text.replace(BIND, f"bind 127.0.0.1:{self.port}")
        for server, port in zip(SERVERS, instance_ports, strict=True):
            text = text.replace(server, f"127.0.0.1:{port}")
        self.config.write_text(text)

    def start(self, timeout_s: float = 15.0) -> HAProxy:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                ["haproxy", "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"haproxy did not listen:\n{self.log.read_text()}")
