"""The dashboard and the alerts, kept true by a real Prometheus: it scrapes the real service every second
while a caller talks over WebRTC (asks, then talks over the reply) and another over SIP, and every
dashboard query and every rule expression must then return data through Prometheus' HTTP API."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import yaml

from parley.bench.caller import Caller
from parley.bench.service import Service
from parley.bench.sip_caller import SipCaller
from parley.bench.speech import espeak
from tests.prometheus import DASHBOARD, RULES, Prometheus, finite_points

GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$instance": ".*"}
COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)\s+(?!bool\b)")


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """(panel, target, PromQL as Grafana would send it) for every query of every panel."""
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
            found.append((panel, target, expr))
    return found


def rule_expressions() -> list[tuple[str, str]]:
    """(name, PromQL) of every rule; an alert's comparisons take `bool`, so that a quiet alert still
    answers (with 0) when the series behind it exist."""
    rules = yaml.safe_load(RULES.read_text())
    found = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                found += [(rule["record"], rule["expr"]), (rule["record"] + " (stored)", rule["record"])]
            else:
                found.append((rule["alert"], COMPARISON.sub(r"\1 bool ", rule["expr"])))
    return found


async def webrtc_call_with_a_barge_in(service: Service) -> None:
    caller = Caller(service.base_url)
    await caller.connect()
    try:
        await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        _, asked = await caller.say(espeak("tell me a story about a brave little dragon"))
        await caller.wait_for_audio(after=asked, timeout=30)
        await asyncio.sleep(0.6)
        interruption = espeak("sorry, what time is it in london")
        playback = caller.mic.play(interruption)
        await playback.started
        await caller.wait_for_event("barge_in", timeout=15)
        await playback.finished
    finally:
        await caller.hangup()


async def sip_call_with_a_question(service: Service) -> None:
    caller = SipCaller(service.base_url, service.sip_uri)
    await caller.connect()
    try:
        await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
        _, asked = await caller.say(espeak("what is the capital city of japan"))
        await caller.wait_for_audio(after=asked, timeout=30)
        await asyncio.sleep(0.5)
    finally:
        await caller.hangup()


def series_for_picture(
    panel: dict[str, Any], target: dict[str, Any], result: list[dict[str, Any]]
) -> list[Any]:
    lines = []
    for series in result:
        labels: dict[str, str] = series["metric"]
        legend = re.sub(
            r"\{\{(\w+)\}\}", lambda m, labels=labels: labels.get(m.group(1), ""), target["legendFormat"]
        )
        lines.append({"legend": legend, "points": [[float(t), float(v)] for t, v in series["values"]]})
    return lines


async def test_every_panel_and_rule_returns_data_from_a_real_prometheus(
    service: Service, tmp_path: Path
) -> None:
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{service.port}"]).start()
    try:
        start = time.time()
        await asyncio.sleep(2)  # a first scrape or two before anything happens: rate() needs a baseline
        await asyncio.gather(webrtc_call_with_a_barge_in(service), sip_call_with_a_question(service))
        await asyncio.sleep(3)  # the calls' last counts scraped, the rules evaluated over them
        end = time.time()

        dashboard = json.loads(DASHBOARD.read_text())
        picture: dict[str, list[Any]] = {}
        empty = []
        for panel, target, expr in panel_queries(dashboard):
            result = await asyncio.to_thread(prometheus.query_range, expr, start, end)
            if not finite_points(result):
                empty.append(f"{panel['title']}: {expr}")
            picture.setdefault(panel["title"], []).extend(series_for_picture(panel, target, result))
        assert not empty, "panels without data:\n" + "\n".join(empty)

        for name, expr in rule_expressions():
            result = await asyncio.to_thread(prometheus.query_range, expr, start, end)
            assert finite_points(result), f"rule {name} has no data: {expr}"
        groups = prometheus.api("rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        assert len(rules) == len([r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]])
        assert all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]
    finally:
        prometheus.stop()
    _picture(picture, tmp_path)


def _picture(data: dict[str, list[Any]], folder: Path) -> None:
    """Draw the dashboard from this run's data (PARLEY_DASHBOARD_PNG=docs/dashboard.png keeps it, and
    PARLEY_DASHBOARD_DATA=FILE the data, for deploy/grafana/render.py)."""
    if os.environ.get("PARLEY_DASHBOARD_DATA"):
        Path(os.environ["PARLEY_DASHBOARD_DATA"]).write_text(json.dumps(data))
    spec = importlib.util.spec_from_file_location("render", DASHBOARD.parents[1] / "render.py")
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    out = Path(os.environ.get("PARLEY_DASHBOARD_PNG") or folder / "dashboard.png")
    render.render(data, out)
    assert out.stat().st_size > 10_000
