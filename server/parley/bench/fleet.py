"""A fleet on this machine, as deployed: instances of `parley serve` on one records database, Debian's
Kamailio in front of their SIP (deploy/kamailio/kamailio.cfg) and HAProxy in front of their HTTP
(deploy/haproxy/haproxy.cfg), each config as shipped but for its addresses (loopback ports here).

    with instances(folder, database, args) as services, Kamailio(folder, sip_ports) as kamailio, ...

The configs are read from the source checkout's deploy/ folder, beside the package (`parley bench` is a
developer's tool); Kamailio and HAProxy are Debian's (scripts/install-system-packages.sh installs them).
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from parley.bench.daemon import Daemon, system_program
from parley.bench.service import Service, free_port

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
KAMAILIO_CFG = Path("kamailio") / "kamailio.cfg"
HAPROXY_CFG = Path("haproxy") / "haproxy.cfg"

KAMAILIO_LISTEN = re.compile(r"^listen=(udp|tcp):0\.0\.0\.0:5060$", re.MULTILINE)
HAPROXY_BIND = "bind 0.0.0.0:8080"
# The deployed file names two instances, p1 and p2 (a `server` line in each backend, a `use-server` line
# in `calls`); p1's lines are the pattern of every instance's here.
HAPROXY_INSTANCES = {"p1": "10.0.0.5:8080", "p2": "10.0.0.6:8080"}
HAPROXY_INSTANCE_LINE = re.compile(r"^(\s*)(server|use-server) (p\d+) (.*)$")


class FleetError(RuntimeError):
    """The fleet cannot be started here: a program or a deployed config is missing, or a config changed
    in a way its rendering no longer matches."""


def instance_tag(index: int) -> str:
    """The `--instance-tag` of the fleet's instance `index` (0-based): the name HAProxy's config routes its
    calls' requests by (p1, p2, ...)."""
    return f"p{index + 1}"


def binary(name: str) -> str:
    found = system_program(name)
    if found is None:
        raise FleetError(f"{name} not found: scripts/install-system-packages.sh installs Debian's {name}")
    return found


def deployed(config: Path, root: Path = DEPLOY) -> str:
    """A shipped config's text, from the source checkout's deploy/ folder."""
    path = root / config
    if not path.is_file():
        raise FleetError(
            f"{path} not found: the fleet runs from a source checkout, whose deploy/ folder holds the "
            "Kamailio and HAProxy configs it starts them with"
        )
    return path.read_text()


def check_prerequisites(root: Path = DEPLOY) -> None:
    """Everything the fleet needs besides parley is here: said before any model loads."""
    for config in (KAMAILIO_CFG, HAPROXY_CFG):
        deployed(config, root)
    for name in ("kamailio", "haproxy"):
        binary(name)


def kamailio_config(text: str, port: int) -> str:
    """deploy/kamailio/kamailio.cfg listening on a loopback port instead of 0.0.0.0:5060."""
    rendered, count = KAMAILIO_LISTEN.subn(lambda m: f"listen={m.group(1)}:127.0.0.1:{port}", text)
    if count != 2:
        raise FleetError(f"{KAMAILIO_CFG} no longer listens on udp and tcp 0.0.0.0:5060")
    return rendered


def dispatcher_list(sip_ports: Sequence[int]) -> str:
    """Kamailio's destination set 1: the instances' SIP ports."""
    return "".join(f"1 sip:127.0.0.1:{port} 0 0\n" for port in sip_ports)


def haproxy_config(text: str, port: int, instance_ports: Sequence[int]) -> str:
    """deploy/haproxy/haproxy.cfg bound to a loopback port, its instances those listening on
    `instance_ports` (instance i tagged instance_tag(i)), as many as there are."""
    if HAPROXY_BIND not in text:
        raise FleetError(f"{HAPROXY_CFG} no longer binds {HAPROXY_BIND.removeprefix('bind ')}")
    lines: list[str] = []
    seen: dict[str, int] = {}
    for line in text.replace(HAPROXY_BIND, f"bind 127.0.0.1:{port}").splitlines():
        match = HAPROXY_INSTANCE_LINE.match(line)
        if match is None:
            lines.append(line)
            continue
        indent, keyword, name, rest = match.groups()
        seen[name] = seen.get(name, 0) + 1
        if name != "p1":
            continue
        for index, instance_port in enumerate(instance_ports):
            tag = instance_tag(index)
            own = rest.replace(HAPROXY_INSTANCES["p1"], f"127.0.0.1:{instance_port}")
            lines.append(f"{indent}{keyword} {tag} {own.replace('c-p1-', f'c-{tag}-')}")
    if seen != {name: 3 for name in HAPROXY_INSTANCES} or not all(
        address in text for address in HAPROXY_INSTANCES.values()
    ):
        raise FleetError(f"{HAPROXY_CFG} no longer names instances p1 and p2 as it did")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def instances(
    folder: Path,
    database_url: str,
    args: Sequence[Sequence[str]] = ((), ()),
    env: dict[str, str] | None = None,
) -> Iterator[list[Service]]:
    """One instance per entry of `args` (its extra flags), all on one records database (`database_url`:
    '' is SQLite in the --data-dir the flags name), started together, their logs in `folder`. Stopped
    on exit, including any the caller put in the list in place of one it stopped itself."""
    services = [
        Service(["--database", database_url, *extra], env=env, log_path=folder / f"parley-{n}.log")
        for n, extra in enumerate(args)
    ]
    try:
        with ThreadPoolExecutor(len(services)) as pool:
            list(pool.map(lambda s: s.start(), services))
        yield services
    finally:
        for service in services:
            service.stop()


def options_status(port: int, *, timeout: float = 2.0) -> int | None:
    """The status a SIP endpoint on this host's `port` answers an out-of-dialog OPTIONS with (UDP), as a
    dispatcher's probe gets it; None for no answer within `timeout`."""
    branch = "z9hG4bK" + uuid.uuid4().hex[:16]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(timeout)
        here = sock.getsockname()[1]
        request = (
            f"OPTIONS sip:127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{here};branch={branch};rport\r\n"
            "Max-Forwards: 70\r\n"
            f"From: <sip:probe@127.0.0.1:{here}>;tag={uuid.uuid4().hex[:8]}\r\n"
            f"To: <sip:127.0.0.1:{port}>\r\n"
            f"Call-ID: {uuid.uuid4().hex}@127.0.0.1\r\n"
            "CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
        )
        sock.sendto(request.encode(), ("127.0.0.1", port))
        try:
            status_line = sock.recv(65535).split(b"\r\n", 1)[0]
        except OSError:
            return None
    parts = status_line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


class Kamailio(Daemon):
    """Debian's Kamailio with the deployed config, dispatching to the instances' SIP ports.

    with Kamailio(folder, [5071, 5072]) as proxy:
        caller = SipCaller(url, f"sip:parley@127.0.0.1:{proxy.port}")
    """

    def __init__(self, folder: Path, instance_ports: list[int]) -> None:
        self.folder = folder
        self.port = free_port()
        self.config = folder / "kamailio.cfg"
        self.dispatcher = folder / "dispatcher.list"
        self.log = folder / "kamailio.log"
        self.config.write_text(kamailio_config(deployed(KAMAILIO_CFG), self.port))
        self.dispatcher.write_text(dispatcher_list(instance_ports))

    def start(self, timeout_s: float = 20.0) -> Kamailio:
        runtime = self.folder / "run"
        runtime.mkdir(exist_ok=True)
        command = [
            binary("kamailio"),
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
            # Small shared and private memory pools: a test fleet's calls need little.
            "-m",
            "64",
            "-M",
            "8",
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
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
        return options_status(self.port, timeout=0.5) == 200


class HAProxy(Daemon):
    """Debian's HAProxy with the deployed config, in front of the instances' HTTP ports (instance i
    tagged instance_tag(i)).

    with HAProxy(folder, [8091, 8092]) as proxy:
        caller = Caller(proxy.url)
    """

    def __init__(self, folder: Path, instance_ports: list[int]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = folder / "haproxy.cfg"
        self.log = folder / "haproxy.log"
        self.config.write_text(haproxy_config(deployed(HAPROXY_CFG), self.port, instance_ports))

    def start(self, timeout_s: float = 15.0) -> HAProxy:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [binary("haproxy"), "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
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
