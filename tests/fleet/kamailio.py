"""Debian's Kamailio in front of parley instances, for the fleet tests: `deploy/kamailio/kamailio.cfg` as
deployed, but for its addresses (it listens on a loopback port, and its dispatcher list names the
instances' SIP ports).

    with Kamailio(tmp_path, [5071, 5072]) as proxy:
        caller = SipCaller(url, f"sip:parley@127.0.0.1:{proxy.port}")
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
import uuid
from pathlib import Path

from tests.daemon import Daemon
from tests.peers import free_port

DEPLOYED = Path(__file__).parents[2] / "deploy" / "kamailio" / "kamailio.cfg"
LISTEN = re.compile(r"^listen=(udp|tcp):0\.0\.0\.0:5060$", re.MULTILINE)


class Kamailio(Daemon):
    def __init__(self, folder: Path, instance_ports: list[int]) -> None:
        self.folder = folder
        self.port = free_port(udp=True, tcp=True)
        self.config = folder / "kamailio.cfg"
        self.dispatcher = folder / "dispatcher.list"
        self.log = folder / "kamailio.log"
        text, count = LISTEN.subn(
            lambda m: f"listen={m.group(1)}:127.0.0.1:{self.port}", DEPLOYED.read_text()
        )
        assert count == 2, "deploy/kamailio/kamailio.cfg no longer listens on udp and tcp 0.0.0.0:5060"
        self.config.write_text(text)
        self.dispatcher.write_text("".join(f"1 sip:127.0.0.1:{port} 0 0\n" for port in instance_ports))

    def start(self, timeout_s: float = 20.0) -> Kamailio:
        runtime = self.folder / "run"
        runtime.mkdir(exist_ok=True)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    "kamailio",
                    "-DD",  # in the foreground
                    "-E",  # log to stderr
                    "-f",
                    str(self.config),
                    "-A",
                    f'DISPATCHER_LIST="{self.dispatcher}"',
                    "-Y",
                    str(runtime),
                    "-w",
                    str(self.folder),
                    "-m",
                    "64",
                    "-M",
                    "8",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"kamailio exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            if self.answers_options():
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"kamailio did not answer OPTIONS:\n{self.log.read_text()[-3000:]}")

    def answers_options(self) -> bool:
        """Kamailio answers an OPTIONS to itself 200 (its config's own health check)."""
        branch = "z9hG4bK" + uuid.uuid4().hex[:16]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(0.5)
            here = sock.getsockname()[1]
            request = (
                f"OPTIONS sip:127.0.0.1:{self.port} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:{here};branch={branch};rport\r\n"
                "Max-Forwards: 70\r\n"
                f"From: <sip:probe@127.0.0.1:{here}>;tag={uuid.uuid4().hex[:8]}\r\n"
                f"To: <sip:127.0.0.1:{self.port}>\r\n"
                f"Call-ID: {uuid.uuid4().hex}@127.0.0.1\r\n"
                "CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
            )
            sock.sendto(request.encode(), ("127.0.0.1", self.port))
            try:
                data = sock.recv(65535)
            except OSError:
                return False
        return data.startswith(b"SIP/2.0 200")
