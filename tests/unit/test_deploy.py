"""What deploy/ ships stays valid: the alert rules pass promtool (syntax and their unit tests), the
committed dashboard is what its generator makes, and Grafana's provisioning points at it."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from parley.config import Settings
from tests.prometheus import DASHBOARD, binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
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


def k8s_documents() -> list[tuple[Path, dict[str, object]]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [
            (path, doc)
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc["kind"] != "Kustomization"
        ]
    return docs


def test_the_kubernetes_manifests_validate_against_the_api_schemas() -> None:
    import kubernetes_validate

    kinds = set()
    for _, doc in k8s_documents():
        kinds.add(doc["kind"])
        if str(doc["apiVersion"]).startswith(("monitoring.coreos.com/", "kustomize.config.k8s.io/")):
            continue  # custom resources: checked below
        kubernetes_validate.validate(doc, "1.33.0", strict=True)
    assert {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ServiceMonitor",
    } <= kinds


def test_the_kubernetes_pieces_fit_together() -> None:
    docs = {(str(d["kind"]), d["metadata"]["name"]): d for _, d in k8s_documents()}  # type: ignore[index]
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (DEPLOY / "k8s" / resource).is_file()
    for generator in kustomization["configMapGenerator"]:
        assert all((DEPLOY / "k8s" / f).is_file() for f in generator["files"])
    for variant in ("deployment-cpu.yaml", "deployment-gpu.yaml"):
        deployment = yaml.safe_load((DEPLOY / "k8s" / variant).read_text())
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] and pod["terminationGracePeriodSeconds"] >= 600
        drain = container["lifecycle"]["preStop"]["exec"]["command"]
        assert drain[:2] == ["parley", "drain"]
        # No call is cut by a pod's removal: the drain outwaits the longest call, the grace the drain.
        max_call_s = next(f.default for f in dataclasses.fields(Settings) if f.name == "max_call_s")
        waits = float(drain[drain.index("--wait-s") + 1])
        assert max_call_s < waits < pod["terminationGracePeriodSeconds"], (max_call_s, waits)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    gpu = yaml.safe_load((DEPLOY / "k8s" / "deployment-gpu.yaml").read_text())["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in gpu["containers"][0]["env"]}
    assert env["PARLEY_LLM_URL"] == "http://vllm:8000/v1" and "nvidia.com/gpu" in str(gpu)
    hpa = docs[("HorizontalPodAutoscaler", "parley")]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "parley_calls_active"  # type: ignore[index]
    adapter = yaml.safe_load(docs[("ConfigMap", "prometheus-adapter-parley")]["data"]["config.yaml"])  # type: ignore[index]
    assert adapter["rules"][0]["name"]["as"] == "parley_calls_active"
    monitor = docs[("ServiceMonitor", "parley")]["spec"]
    service = docs[("Service", "parley")]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()  # type: ignore[index]
    assert monitor["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}  # type: ignore[index]
    rule = docs[("PrometheusRule", "parley")]["spec"]
    assert rule["groups"] == yaml.safe_load((PROMETHEUS / "rules.yml").read_text())["groups"]  # type: ignore[index]


def test_the_kamailio_dispatcher_config_passes_kamailio_s_check() -> None:
    kamailio = shutil.which("kamailio") or "/usr/sbin/kamailio"
    if not Path(kamailio).exists():
        pytest.skip("Debian's kamailio is not installed")
    listed = f'DISPATCHER_LIST="{DEPLOY / "kamailio" / "dispatcher.list"}"'
    result = subprocess.run(
        [kamailio, "-c", "-f", str(DEPLOY / "kamailio" / "kamailio.cfg"), "-A", listed],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ds_select_dst" in (DEPLOY / "kamailio" / "kamailio.cfg").read_text()


def test_the_haproxy_config_passes_haproxy_s_check_and_routes_each_instance_s_calls_to_it() -> None:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.skip("Debian's haproxy is not installed")
    config = DEPLOY / "haproxy" / "haproxy.cfg"
    result = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    text = config.read_text()
    servers = {line.split()[1] for line in text.splitlines() if line.strip().startswith("server ")}
    routed = {line.split()[1] for line in text.splitlines() if line.strip().startswith("use-server ")}
    assert servers == routed == {"p1", "p2"}  # every instance's calls have their route


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
