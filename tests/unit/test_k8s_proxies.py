"""The proxies in front of the parley instances, run for real: deploy/haproxy's and deploy/kamailio's
configs (and the Kubernetes copies) pass `haproxy -c` and `kamailio -c`, and on Kubernetes, against a
stand-in for the cluster (its DNS, and pods answering HTTP or SIP), HAProxy spreads new calls over the
ready pods and sends a call's requests to its pod, and Kamailio dispatches calls only to the pods that
answer its probes."""

from __future__ import annotations

import abc
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from parley.registry import CallRegistry
from tests.unit.test_deploy import DEPLOY
from tests.unit.test_deploy_k8s import HEADLESS, K8S, tool

SIP_REPLY_HEADERS = ("via", "from", "to", "call-id", "cseq")  # what a SIP answer copies from its request
CRLF = "\r\n"


@pytest.mark.parametrize(
    "listed",
    [DEPLOY / "kamailio" / "dispatcher.list", K8S / "base" / "dispatcher.list"],
    ids=["hosts", "k8s"],
)
def test_the_kamailio_dispatcher_config_passes_kamailio_s_check(listed: Path) -> None:
    result = subprocess.run(
        [
            tool("kamailio"),
            "-c",
            "-f",
            str(DEPLOY / "kamailio" / "kamailio.cfg"),
            "-A",
            f'DISPATCHER_LIST="{listed}"',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ds_select_dst" in (DEPLOY / "kamailio" / "kamailio.cfg").read_text()


def test_the_haproxy_config_passes_haproxy_s_check_and_routes_each_instance_s_calls_to_it() -> None:
    config = DEPLOY / "haproxy" / "haproxy.cfg"
    result = subprocess.run(
        [tool("haproxy"), "-c", "-f", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = config.read_text()
    servers = {line.split()[1] for line in text.splitlines() if line.strip().startswith("server ")}
    routed = {line.split()[1] for line in text.splitlines() if line.strip().startswith("use-server ")}
    assert servers == routed == {"p1", "p2"}  # every instance's calls have their route


def test_the_kubernetes_haproxy_config_passes_haproxy_s_check() -> None:
    environment = {**os.environ, "NAMESPACE": "default", "CLUSTER_DOMAIN": "cluster.local"}
    result = subprocess.run(
        [tool("haproxy"), "-c", "-f", str(K8S / "base" / "haproxy.cfg")],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]


class UdpResponder(abc.ABC):
    """A UDP server on a thread of its own, bound to `address`:`port` (0: a free port, then in `port`):
    each datagram is answered with what `answer` makes of it, or not at all when that is None. Subclasses
    set what `answer` reads before calling this __init__, as the thread starts in it."""

    def __init__(self, address: str, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))
        self.sock.settimeout(0.2)  # how long close() may wait for the thread to notice
        self.port: int = self.sock.getsockname()[1]
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @abc.abstractmethod
    def answer(self, data: bytes, /) -> bytes | None:
        """The reply to one datagram, or None for none."""

    def _serve(self) -> None:
        while self.running:
            try:
                data, peer = self.sock.recvfrom(65535)  # the largest UDP datagram
            except TimeoutError:
                continue
            reply = self.answer(data)
            if reply is not None:
                self.sock.sendto(reply, peer)

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


class KubeDns(UdpResponder):
    """The cluster's DNS as a pod sees it, on a UDP port of its own: each name of `records` answers its
    addresses (A records), every other name does not exist. The names asked are kept in `asked`."""

    def __init__(self, records: dict[str, list[str]], address: str = "127.0.0.1", port: int = 0) -> None:
        self.records = records
        self.asked: list[str] = []
        super().__init__(address, port)

    def answer(self, query: bytes) -> bytes:
        labels, end = [], 12  # the question's name follows the 12-byte header, as length-prefixed labels
        while query[end]:
            labels.append(query[end + 1 : end + 1 + query[end]].decode().lower())
            end += 1 + query[end]
        kind = int.from_bytes(query[end + 1 : end + 3], "big")
        name = ".".join(labels)
        self.asked.append(name)
        addresses = self.records.get(name)
        answers = addresses if addresses and kind == 1 else []  # A records only
        flags = 0x8180 | (0 if addresses is not None else 3)  # a reply, recursion available; 3: no such name
        header = query[:2] + struct.pack("!HHHHH", flags, 1, len(answers), 0, 0)
        records = b"".join(struct.pack("!HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(a) for a in answers)
        return header + query[12 : end + 5] + records


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionResetError):  # HAProxy ends its checks so
            super().handle_error(request, client_address)


class HttpPod:
    """A parley pod as HAProxy meets it: /readyz answers 200 while `ready`, 503 after; every other request
    is answered with the pod's name."""

    def __init__(self, name: str, address: str, port: int) -> None:
        self.name = name
        self.ready = True
        pod = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as parley's server

            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = 503 if self.path == "/readyz" and not pod.ready else 200
                body = pod.name.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _QuietServer((address, port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def pod_name(pod: str) -> str:
    return f"{pod}.{HEADLESS}.test.svc.cluster.local"


def kube_haproxy_config(dns_port: int, port: int, health_port: int, pod_port: int) -> str:
    """deploy/k8s/base/haproxy.cfg as shipped but for its addresses: its resolver asks `dns_port`, it
    binds loopback ports, and the pods listen on `pod_port`."""
    text = (K8S / "base" / "haproxy.cfg").read_text()
    for shipped, here in (
        ("parse-resolv-conf", f"nameserver kube 127.0.0.1:{dns_port}"),
        ("bind :8080", f"bind 127.0.0.1:{port}"),
        ("bind :8404", f"bind 127.0.0.1:{health_port}"),
        (".svc.${CLUSTER_DOMAIN}:8080", f".svc.${{CLUSTER_DOMAIN}}:{pod_port}"),
        ("set-dst-port int(8080)", f"set-dst-port int({pod_port})"),
    ):
        assert text.count(shipped) == 1, f"haproxy.cfg no longer has {shipped!r} once: render it anew"
        text = text.replace(shipped, here)
    return text


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_haproxy_on_kubernetes_spreads_new_calls_over_ready_pods_and_sends_a_call_s_requests_to_its_pod(
    tmp_path: Path,
) -> None:
    haproxy = tool("haproxy")
    # Call ids as the pods make them: c-<pod name>-<12 hex digits>.
    call = {n: CallRegistry(1, f"parley-{n}").new_call_id() for n in (0, 1, 2, 7)}
    pods = [HttpPod("parley-0", "127.0.0.2", 0)]
    pods += [HttpPod(f"parley-{n}", f"127.0.0.{n + 2}", pods[0].port) for n in (1, 2)]
    dns = KubeDns({pod_name(pod.name): [f"127.0.0.{n + 2}"] for n, pod in enumerate(pods[:2])})
    dns.records[f"{HEADLESS}.test.svc.cluster.local"] = ["127.0.0.2", "127.0.0.3"]  # parley-2 not yet
    port = free_tcp_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(kube_haproxy_config(dns.port, port, free_tcp_port(), pods[0].port))
    log = tmp_path / "haproxy.log"
    environment = {**os.environ, "NAMESPACE": "test", "CLUSTER_DOMAIN": "cluster.local"}
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [haproxy, "-db", "-f", str(config)], stdout=output, stderr=subprocess.STDOUT, env=environment
        )

    def ask(method: str, path: str, connection: http.client.HTTPConnection | None = None) -> str:
        """The pod that answered."""
        own = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            own.request(method, path, body=b"{}" if method == "POST" else None)
            response = own.getresponse()
            body = response.read().decode()
            assert response.status == 200, (method, path, response.status, body)
            return body
        finally:
            if connection is None:
                own.close()

    def answering(wanted: set[str], within_s: float = 15.0) -> None:
        """New calls reach exactly the `wanted` pods (the health checks and DNS have caught up)."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                if {ask("POST", "/offer") for _ in range(6)} == wanted:
                    return
            except (OSError, AssertionError):
                pass
            assert time.monotonic() < deadline, f"new calls never reached just {wanted}:\n{log.read_text()}"
            time.sleep(0.3)

    try:
        answering({"parley-0", "parley-1"})
        # New calls: round robin over the ready pods.
        assert sorted(ask("POST", "/offer") for _ in range(6)) == ["parley-0"] * 3 + ["parley-1"] * 3
        # A call's requests reach the pod its id names, one after another on one client connection.
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        for holder, method, path in (
            ("parley-1", "GET", f"/api/calls/{call[1]}"),
            ("parley-1", "POST", f"/whip/{call[1]}"),
            ("parley-0", "GET", f"/api/calls/{call[0]}/events"),
            ("parley-0", "DELETE", f"/whip/{call[0]}"),
            ("parley-1", "DELETE", f"/api/calls/{call[1]}"),
        ):
            assert ask(method, path, kept) == holder, (method, path)
        kept.close()
        # parley-0 drains: no new call reaches it, but its calls' requests still do.
        pods[0].ready = False
        answering({"parley-1"})
        assert ask("GET", f"/api/calls/{call[0]}/events") == "parley-0"
        # A call of a pod that is gone: a ready pod answers from the call records.
        assert ask("GET", f"/api/calls/{call[7]}") == "parley-1"
        # The autoscaler adds parley-2: it appears in the Service's answer and takes new calls.
        dns.records[pod_name("parley-2")] = ["127.0.0.4"]
        dns.records[f"{HEADLESS}.test.svc.cluster.local"].append("127.0.0.4")
        answering({"parley-1", "parley-2"})
        assert ask("GET", f"/whip/{call[2]}") == "parley-2"
        # Only names under the headless Service are ever looked up, whatever a request's path says.
        ask("GET", "/api/calls/c-example.com-" + call[0].rsplit("-", 1)[1])
        assert all(name.endswith(f"{HEADLESS}.test.svc.cluster.local") for name in dns.asked), set(dns.asked)
    finally:
        process.terminate()
        process.wait(10)
        dns.close()
        for pod in pods:
            pod.close()


class SipPod(UdpResponder):
    """A parley pod as Kamailio meets it over UDP: OPTIONS answered `options` (200, or 503 while it drains
    or is full), an INVITE 486 Busy (a final answer Kamailio passes on without trying another pod). The
    INVITEs it got are counted."""

    def __init__(self, address: str, options: str = "200 OK") -> None:
        self.options = options
        self.invites = 0
        super().__init__(address, 5060)

    def answer(self, data: bytes) -> bytes | None:
        text = data.decode(errors="replace")
        method = text.split(" ", 1)[0]
        if method in ("SIP/2.0", "ACK"):
            return None
        self.invites += method == "INVITE"
        status = self.options if method == "OPTIONS" else "486 Busy Here"
        kept = [h for h in text.split("\r\n") if h.split(":", 1)[0].lower() in SIP_REPLY_HEADERS]
        return f"SIP/2.0 {status}\r\n{CRLF.join(kept)}\r\nContent-Length: 0\r\n\r\n".encode()


def invite(port: int) -> str:
    """One INVITE to Kamailio on `port`; the status line of its final answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(10)
        here = sock.getsockname()[1]
        tag = uuid.uuid4().hex[:12]
        request = (
            f"INVITE sip:agent@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{here};branch=z9hG4bK{tag};rport\r\n"
            "Max-Forwards: 70\r\n"
            f"From: <sip:caller@127.0.0.1:{here}>;tag={tag}\r\n"
            f"To: <sip:agent@127.0.0.1:{port}>\r\n"
            f"Call-ID: {tag}@127.0.0.1\r\n"
            "CSeq: 1 INVITE\r\n"
            f"Contact: <sip:caller@127.0.0.1:{here}>\r\n"
            "Content-Length: 0\r\n\r\n"
        )
        sock.sendto(request.encode(), ("127.0.0.1", port))
        while True:
            reply = sock.recv(65535)
            if not reply.startswith(b"SIP/2.0 1"):  # past the provisional answers
                return reply.split(b"\r\n", 1)[0].decode()


def dispatch_through_kube_dns(folder: str) -> dict[str, Any]:
    """Kamailio with deploy/k8s/base's config and dispatcher list, as in a pod: its DNS names the pods
    through /etc/resolv.conf's search domains (a KubeDns on port 53). parley-0 answers its probes 200,
    parley-1 503 until it has room again; no other pod runs. What the callers got, as JSON-able figures.
    Runs in private mount and network namespaces (`unshare -m -n`): it takes over /etc/resolv.conf and
    loopback ports there."""
    work = Path(folder)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    resolv = work / "resolv.conf"
    resolv.write_text(  # as in a pod of the namespace `test`
        "search test.svc.cluster.local svc.cluster.local cluster.local\n"
        "nameserver 127.0.0.1\noptions ndots:5\n"
    )
    subprocess.run(["mount", "--bind", str(resolv), "/etc/resolv.conf"], check=True)
    dns = KubeDns({pod_name("parley-0"): ["127.0.0.2"], pod_name("parley-1"): ["127.0.0.3"]}, port=53)
    pods = [SipPod("127.0.0.2"), SipPod("127.0.0.3", "503 Service Unavailable")]
    text, count = re.subn(
        r"^listen=(udp|tcp):0\.0\.0\.0:5060$",
        lambda m: f"listen={m.group(1)}:127.0.0.1:5060",
        (K8S / "base" / "kamailio.cfg").read_text(),
        flags=re.MULTILINE,
    )
    assert count == 2, "kamailio.cfg no longer listens on udp and tcp 0.0.0.0:5060"
    config = work / "kamailio.cfg"
    config.write_text(text)
    (work / "run").mkdir()
    listed = f'DISPATCHER_LIST="{K8S / "base" / "dispatcher.list"}"'
    # -DD: in the foreground; -E: log to stderr; -Y, -w: its runtime files here; -m, -M: little memory
    command = ["kamailio", "-DD", "-E", "-f", str(config), "-A", listed, "-Y", str(work / "run")]
    with open(work / "kamailio.log", "wb") as log:
        kamailio = subprocess.Popen(
            [*command, "-w", str(work), "-m", "64", "-M", "8"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        started = time.monotonic()
        first = "SIP/2.0 503"  # Kamailio's own answer while no pod has answered a probe
        while first.startswith("SIP/2.0 503") and time.monotonic() - started < 60:
            time.sleep(0.5)
            first = invite(5060)
        found_s = time.monotonic() - started
        answers = [invite(5060) for _ in range(6)]
        counted = [pod.invites for pod in pods]
        pods[1].options = "200 OK"
        back = time.monotonic()
        while pods[1].invites == 0 and time.monotonic() - back < 60:
            invite(5060)
            time.sleep(0.5)
        return {
            "found_s": found_s,
            "first": first,
            "answers": answers,
            "invites": counted,
            "back_s": time.monotonic() - back,
            "reached_again": pods[1].invites,
            "asked": sorted(set(dns.asked)),
        }
    finally:
        kamailio.terminate()
        kamailio.wait(10)
        dns.close()
        for pod in pods:
            pod.close()


@pytest.mark.slow
def test_kamailio_on_kubernetes_dispatches_to_the_pods_that_answer_its_probes(tmp_path: Path) -> None:
    tool("kamailio")
    unshare = tool("unshare")
    if subprocess.run([unshare, "-m", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount and network namespaces here (they take root)")
    run = "import json, sys; from tests.unit.test_k8s_proxies import dispatch_through_kube_dns as run; "
    run += "print(json.dumps(run(sys.argv[1])))"
    result = subprocess.run(
        [unshare, "-m", "-n", sys.executable, "-c", run, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=DEPLOY.parent,
    )
    log = (tmp_path / "kamailio.log").read_text()[-3000:] if (tmp_path / "kamailio.log").exists() else ""
    assert result.returncode == 0, result.stderr[-3000:] + log
    outcome = json.loads(result.stdout.splitlines()[-1])
    print(
        f"\nKamailio on Kubernetes: parley-0 taken in {outcome['found_s']:.1f} s after start; "
        f"parley-1 back {outcome['back_s']:.1f} s after its probes said 200 again"
    )
    # parley-0 was found by its short name through the search domains; absent pods were not.
    assert pod_name("parley-0") in outcome["asked"] and pod_name("parley-5") in outcome["asked"]
    # Every call reached parley-0, none the pod whose probes said 503.
    assert outcome["first"] == "SIP/2.0 486 Busy Here"
    assert outcome["answers"] == ["SIP/2.0 486 Busy Here"] * 6 and outcome["invites"] == [7, 0]
    # With room again, parley-1 is back in the set within a few probe intervals.
    assert outcome["reached_again"] >= 1 and outcome["back_s"] < 40
