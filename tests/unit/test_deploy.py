"""What deploy/ ships stays valid: the alert rules pass promtool (syntax and their unit tests), the
committed dashboard is what its generator makes, and Grafana's provisioning points at it. The Kubernetes
overlays render with kubectl and validate against the API's schemas, their pieces refer to each other,
and their HAProxy and Kamailio configs route as they say, against a stand-in for the cluster's DNS."""

from __future__ import annotations

import functools
import http.client
import importlib.util
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from parley.config import Settings
from parley.registry import CallRegistry
from parley.settings_sources import load_settings
from tests.prometheus import DASHBOARD, binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu")
HEADLESS = "parley-pods"  # the StatefulSet's headless Service: every pod's DNS name is under it
SIP_REPLY_HEADERS = ("via", "from", "to", "call-id", "cseq")  # what a SIP answer copies from its request
CRLF = "\r\n"
REQUIRED_PANELS = {
    "Active calls by transport",
    "Call rate and outcomes",
    "Response latency",
    "Interruption latency",
    "Turns and barge-ins",
    "Turn revisions and reopen outcomes",
    "False interruptions and replies",
    "Stage latency (p95)",
    "LLM prompt tokens",
    "Queue depths",
    "Dropped frames",
    "Engine errors",
    "Capacity left",
}
ALERTS = {
    "ParleyInterruptionLatencyHigh",
    "ParleyResponseLatencyHigh",
    "ParleyFramesDropped",
    "ParleyEngineErrors",
    "ParleyAtCapacity",
    "ParleyNoReadyInstance",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=60)


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_the_rules_and_the_scrape_config_pass_promtool_check() -> None:
    rules = promtool("check", "rules", str(PROMETHEUS / "rules.yml"))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = promtool("check", "config", "--syntax-only", str(PROMETHEUS / "prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_alert_fires_and_stays_quiet_in_promtool_unit_tests() -> None:
    result = promtool("test", "rules", str(PROMETHEUS / "tests.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load((PROMETHEUS / "tests.yml").read_text())["tests"]
    checked = [case for test in tests for case in test.get("alert_rule_test", [])]
    for alert in ALERTS:
        cases = [case for case in checked if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in cases), f"{alert} is never tested firing"
        assert any(not case["exp_alerts"] for case in cases), f"{alert} is never tested quiet"
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    assert {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r} == ALERTS


def test_the_committed_dashboard_is_what_its_generator_makes() -> None:
    generator = load(GRAFANA / "dashboard.py")
    assert DASHBOARD.read_text() == generator.render(), "run: python deploy/grafana/dashboard.py"


def test_the_dashboard_has_every_panel_on_a_prometheus_data_source_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert {p["title"] for p in panels} >= REQUIRED_PANELS
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(t["expr"].count("parley_") for t in panel["targets"])
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_provisioning_loads_the_dashboard_with_no_clicks() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "parley.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in mounts


def test_the_dashboard_picture_is_drawn_from_query_results(tmp_path: Path) -> None:
    render = load(GRAFANA / "render.py")
    series = [{"legend": "p95", "points": [[0.0, 0.9], [1.0, 1.1], [2.0, float("nan")]]}]
    out = tmp_path / "board.png"
    render.render({"Response latency": series, "Capacity left": series}, out)
    assert out.read_bytes()[:4] == b"\x89PNG"


def tool(name: str) -> str:
    """A program the checks run, from the PATH or where Debian puts it; the test is skipped without it."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


@functools.cache
def _rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def rendered(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    """What `kubectl apply -k deploy/k8s/overlays/<overlay>` applies, by (kind, name)."""
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in _rendered(overlay)}


def config_map(docs: dict[tuple[str, str], dict[str, Any]], prefix: str) -> dict[str, Any]:
    """The generated ConfigMap whose name (before kustomize's content hash) is `prefix`."""
    (found,) = [
        d for (kind, name), d in docs.items() if kind == "ConfigMap" and name.startswith(f"{prefix}-")
    ]
    return found


def parley_pods(docs: dict[tuple[str, str], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The StatefulSet's pod spec and its parley container."""
    pod = docs[("StatefulSet", "parley")]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "parley"]
    return pod, container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_and_validates_against_the_api_schemas(overlay: str) -> None:
    import kubernetes_validate

    docs = rendered(overlay)
    for (kind, name), doc in docs.items():
        if str(doc["apiVersion"]).startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's resources: checked below
        try:
            kubernetes_validate.validate(doc, "1.33.0", strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{overlay}: {kind} {name}: {exc}") from exc
    kinds = {kind for kind, _ in docs}
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"} <= kinds
    assert {"PodDisruptionBudget", "ServiceMonitor", "PrometheusRule"} <= kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_pod_being_removed_drains_and_outwaits_its_longest_call(overlay: str) -> None:
    pod, container = parley_pods(rendered(overlay))
    assert pod["securityContext"]["runAsNonRoot"]
    drain = container["lifecycle"]["preStop"]["exec"]["command"]
    assert drain[:2] == ["parley", "drain"]
    # Readiness follows the drain: /readyz answers 503 from the moment `parley drain` asks.
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # No call is cut by a pod's removal: the drain outwaits the longest call, the grace the drain.
    max_call_s = Settings().max_call_s
    waits = float(drain[drain.index("--wait-s") + 1])
    assert max_call_s < waits < pod["terminationGracePeriodSeconds"], (max_call_s, waits)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pod_is_tagged_with_its_own_name_under_a_headless_service(overlay: str) -> None:
    docs = rendered(overlay)
    spec = docs[("StatefulSet", "parley")]["spec"]
    _, container = parley_pods(docs)
    env = {e["name"]: e for e in container["env"]}
    assert env["PARLEY_INSTANCE_TAG"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Scaling is not held back by a pod that is full (not ready): pods start together.
    assert spec["podManagementPolicy"] == "Parallel"
    headless = docs[("Service", spec["serviceName"])]["spec"]
    assert spec["serviceName"] == HEADLESS and headless["clusterIP"] == "None"
    # A draining pod (not ready) keeps its name in DNS, for its calls' requests.
    assert headless["publishNotReadyAddresses"] is True
    assert headless["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert {p["name"] for p in headless["ports"]} == {p["name"] for p in container["ports"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_haproxy_and_the_dispatcher_reach_every_pod_the_autoscaler_may_run(overlay: str) -> None:
    docs = rendered(overlay)
    hpa = docs[("HorizontalPodAutoscaler", "parley")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "parley"}
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "parley_calls_active"
    most = hpa["maxReplicas"]
    haproxy = config_map(docs, "parley-haproxy")["data"]["haproxy.cfg"]
    assert haproxy == (K8S / "base" / "haproxy.cfg").read_text()
    (template,) = [
        line.split() for line in haproxy.splitlines() if line.strip().startswith("server-template")
    ]
    assert int(template[2]) >= most and template[3].startswith(f'"{HEADLESS}.${{NAMESPACE}}.svc.')
    assert f"%[var(txn.pod)].{HEADLESS}.${{NAMESPACE}}.svc." in haproxy  # a call's pod, by its name
    dispatcher = config_map(docs, "parley-kamailio")["data"]["dispatcher.list"]
    destinations = [line.split() for line in dispatcher.splitlines() if line and not line.startswith("#")]
    assert [d[1] for d in destinations] == [f"sip:parley-{n}.{HEADLESS}:5060" for n in range(most)]
    for destination in destinations:
        flags = int(destination[2])
        # Inactive until probed 200, probed with OPTIONS, resolved when used (pods come and go).
        assert flags & 1 and flags & 8 and flags & 16, destination
    # HAProxy's pods are the Service `parley`, and each proxy mounts the config it is checked with.
    front = docs[("Service", "parley")]["spec"]
    proxy = docs[("Deployment", "haproxy")]["spec"]["template"]
    assert front["selector"].items() <= proxy["metadata"]["labels"].items()
    env = {e["name"] for e in proxy["spec"]["containers"][0]["env"]}
    assert {"NAMESPACE", "CLUSTER_DOMAIN"} <= env
    mounted = {
        d["metadata"]["name"]: {v["configMap"]["name"] for v in d["spec"]["template"]["spec"]["volumes"]}
        for (kind, _), d in docs.items()
        if kind == "Deployment" and d["metadata"]["name"] in ("haproxy", "kamailio")
    }
    assert mounted == {
        "haproxy": {config_map(docs, "parley-haproxy")["metadata"]["name"]},
        "kamailio": {config_map(docs, "parley-kamailio")["metadata"]["name"]},
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_settings_secrets_and_monitoring_refer_to_what_is_there(overlay: str) -> None:
    docs = rendered(overlay)
    _, container = parley_pods(docs)
    (settings,) = [ref["configMapRef"]["name"] for ref in container["envFrom"]]
    values = docs[("ConfigMap", settings)]["data"]
    # parley takes them as the pod gives them (the secrets' values stand in), its name as its tag.
    given = {e["name"]: e.get("value", "") for e in container["env"]} | values
    secret = {"PARLEY_TOKEN": "t", "PARLEY_SIP_ALLOW": "10.0.0.0/8", "PARLEY_DATABASE": "postgresql://db/p"}
    loaded = load_settings(environ=given | secret | {"PARLEY_INSTANCE_TAG": "parley-0"})
    assert loaded.instance_tag == "parley-0" and loaded.max_calls == int(values["PARLEY_MAX_CALLS"])
    secrets = {
        e["valueFrom"]["secretKeyRef"]["key"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
        and e["valueFrom"]["secretKeyRef"]["name"] == "parley"
        and not e["valueFrom"]["secretKeyRef"].get("optional")
    }
    assert secrets == {"ice-servers", "database-url", "token", "metrics-token", "sip-allow"}
    # Prometheus scrapes each pod once, a draining one too: through the headless Service alone.
    monitor = docs[("ServiceMonitor", "parley")]["spec"]
    selected = [
        name
        for (kind, name), d in docs.items()
        if kind == "Service"
        and monitor["selector"]["matchLabels"].items() <= d["metadata"].get("labels", {}).items()
    ]
    assert selected == [HEADLESS]
    assert monitor["endpoints"][0]["port"] in {
        p["name"] for p in docs[("Service", HEADLESS)]["spec"]["ports"]
    }
    assert monitor["endpoints"][0]["authorization"]["credentials"] == {
        "name": "parley",
        "key": "metrics-token",
    }
    adapter = yaml.safe_load(docs[("ConfigMap", "prometheus-adapter-parley")]["data"]["config.yaml"])
    assert adapter["rules"][0]["name"]["as"] == "parley_calls_active"
    rule = docs[("PrometheusRule", "parley")]["spec"]
    assert rule["groups"] == yaml.safe_load((PROMETHEUS / "rules.yml").read_text())["groups"]


def test_the_gpu_overlay_puts_the_pods_on_gpus_and_the_llm_in_vllm() -> None:
    gpu, cpu = rendered("gpu"), rendered("cpu")
    pod, container = parley_pods(gpu)
    assert container["image"].endswith(":gpu") and parley_pods(cpu)[1]["image"].endswith(":cpu")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert "nvidia.com/gpu" not in str(cpu[("StatefulSet", "parley")])
    settings = config_map(gpu, "parley-settings")["data"]
    assert settings["PARLEY_LLM_URL"] == "http://vllm:8000/v1" and settings["PARLEY_DEVICE"] == "cuda"
    assert {p["port"] for p in gpu[("Service", "vllm")]["spec"]["ports"]} == {8000}
    assert ("Deployment", "vllm") not in cpu
    # The autoscaler adds pods before the ones there are full: each variant's target is below its lines.
    for docs in (cpu, gpu):
        lines = int(config_map(docs, "parley-settings")["data"]["PARLEY_MAX_CALLS"])
        metric = docs[("HorizontalPodAutoscaler", "parley")]["spec"]["metrics"][0]
        assert int(metric["pods"]["target"]["averageValue"]) < lines
    assert lines == 64  # the GPU pods take more calls


@pytest.mark.parametrize(
    ("copy", "deployed"),
    [
        ("kamailio.cfg", DEPLOY / "kamailio" / "kamailio.cfg"),
        ("turnserver.conf", DEPLOY / "coturn" / "turnserver.conf"),
    ],
)
def test_the_kubernetes_copies_of_shared_configs_are_the_deployed_ones(copy: str, deployed: Path) -> None:
    # kustomize reads no file outside deploy/k8s/base: the ConfigMaps are made from copies.
    assert (K8S / "base" / copy).read_text() == deployed.read_text(), f"cp {deployed} {K8S / 'base' / copy}"


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


class KubeDns:
    """The cluster's DNS as a pod sees it, on a UDP port of its own: each name of `records` answers its
    addresses (A records), every other name does not exist. The names asked are kept in `asked`."""

    def __init__(self, records: dict[str, list[str]], address: str = "127.0.0.1", port: int = 0) -> None:
        self.records = records
        self.asked: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.running:
            try:
                query, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            self.sock.sendto(self.answer(query), peer)

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

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


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


class SipPod:
    """A parley pod as Kamailio meets it over UDP: OPTIONS answered `options` (200, or 503 while it drains
    or is full), an INVITE 486 Busy (a final answer Kamailio passes on without trying another pod). The
    INVITEs it got are counted."""

    def __init__(self, address: str, options: str = "200 OK") -> None:
        self.options = options
        self.invites = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 5060))
        self.sock.settimeout(0.2)
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.running:
            try:
                data, peer = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            text = data.decode(errors="replace")
            method = text.split(" ", 1)[0]
            if method in ("SIP/2.0", "ACK"):
                continue
            self.invites += method == "INVITE"
            status = self.options if method == "OPTIONS" else "486 Busy Here"
            kept = [h for h in text.split("\r\n") if h.split(":", 1)[0].lower() in SIP_REPLY_HEADERS]
            self.sock.sendto(
                f"SIP/2.0 {status}\r\n{CRLF.join(kept)}\r\nContent-Length: 0\r\n\r\n".encode(), peer
            )

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


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
    run = "import json, sys; from tests.unit.test_deploy import dispatch_through_kube_dns as run; "
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


def test_the_dockerfile_builds_a_non_root_image_with_models_and_a_healthcheck() -> None:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=str(DEPLOY.parent / "Dockerfile"))
    stages = [i["value"].split() for i in parser.structure if i["instruction"] == "FROM"]
    names = {stage[-1] for stage in stages if len(stage) == 3 and stage[1].upper() == "AS"}
    assert {"base-cpu", "base-gpu", "build", "models", "runtime"} <= names
    args = dict(i["value"].split("=", 1) for i in parser.structure if i["instruction"] == "ARG")
    assert args["VARIANT"] == "cpu" and "cuda:12" in args["GPU_BASE"] and "cudnn" in args["GPU_BASE"]
    final = [
        i
        for i in parser.structure
        if i["startline"] > max(j["startline"] for j in parser.structure if j["instruction"] == "FROM")
    ]
    instructions = {i["instruction"]: i["value"] for i in final}
    assert instructions["USER"].split(":")[0] not in ("0", "root")
    assert "/healthz" in instructions["HEALTHCHECK"]
    assert any("parley prepare" in i["value"] for i in parser.structure if i["instruction"] == "RUN")


def test_compose_runs_parley_prometheus_grafana_coturn_and_a_gpu_profile_with_vllm() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"parley", "prometheus", "grafana", "coturn", "vllm", "parley-gpu"} <= set(services)
    assert services["vllm"]["profiles"] == ["gpu"] and services["parley-gpu"]["profiles"] == ["gpu"]
    assert services["parley-gpu"]["environment"]["PARLEY_LLM_URL"] == "http://vllm:8000/v1"
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{source} is mounted but missing"
    scrape = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert "parley:8080" in scrape["scrape_configs"][0]["static_configs"][0]["targets"]
