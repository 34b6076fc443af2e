"""What deploy/ ships for a single host stays valid: the alert rules pass promtool (syntax and their unit
tests), the committed dashboard is what its generator makes and is drawn from query results, Grafana's
provisioning points at it, the Dockerfile builds a non-root image with its models and a health check, and
Compose runs parley with Prometheus, Grafana, coturn and a GPU profile. The Kubernetes overlays are
checked in test_deploy_k8s.py, the proxies' configs in test_k8s_proxies.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml  # type: ignore[import-untyped]

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


def test_the_dockerfile_builds_a_non_root_image_with_models_and_a_healthcheck() -> None:
    from dockerfile_parse import DockerfileParser  # type: ignore[import-untyped]

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
