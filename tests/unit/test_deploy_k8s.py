"""The Kubernetes overlays (deploy/k8s) as `kubectl kustomize` renders them: each validates against the
API's schemas, a pod being removed drains and outwaits its longest call, each pod is tagged with its own
name under a headless Service, HAProxy and the dispatcher reach every pod the autoscaler may run, the
settings, secrets and monitoring refer to what is there, the GPU overlay puts the LLM in vLLM, and the
copies of shared configs are the deployed ones. The proxies run on those configs in test_k8s_proxies.py."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from parley.bench.daemon import system_program
from parley.config import Settings
from parley.settings_sources import load_settings
from tests.unit.test_deploy import DEPLOY, PROMETHEUS

K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu")
HEADLESS = "parley-pods"  # the StatefulSet's headless Service: every pod's DNS name is under it


def tool(name: str) -> str:
    """A program the checks run, from the PATH or where Debian puts it; the test is skipped without it."""
    found = system_program(name)
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
    import kubernetes_validate  # type: ignore[import-untyped]

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
