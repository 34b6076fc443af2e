"""A picture of the dashboard without a Grafana server: the panels of the committed dashboard JSON, laid
out on Grafana's grid, drawn with matplotlib from Prometheus query results.

    python deploy/grafana/render.py DATA.json OUT.png

DATA.json is what tests/integration/test_prometheus.py saves (PARLEY_DASHBOARD_DATA=DATA.json): for each
panel title, the series its queries returned from a real Prometheus scraping a real service.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DASHBOARD = Path(__file__).resolve().parent / "dashboards" / "parley.json"
ROW_HEIGHT_IN = 0.36  # one grid unit of height (Grafana: 30 px)
WIDTH_IN = 20.0
BACKGROUND = "#111217"
PANEL = "#181b1f"
TEXT = "#ccccdc"
COLOURS = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a")


def _format(value: float, unit: str) -> str:
    if unit == "s":
        if value < 0.01:
            return f"{value * 1000:.2f} ms"
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.3g}"


def render(data: dict[str, list[dict[str, Any]]], out: Path, dashboard: dict[str, Any] | None = None) -> None:
    board = dashboard or json.loads(DASHBOARD.read_text())
    panels = board["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height_in = bottom * ROW_HEIGHT_IN + 0.6
    figure = plt.figure(figsize=(WIDTH_IN, height_in), facecolor=BACKGROUND)
    figure.text(0.01, 1 - 0.25 / height_in, board["title"], color=TEXT, fontsize=14, va="center")
    for panel in panels:
        grid = panel["gridPos"]
        left, width = grid["x"] / 24, grid["w"] / 24
        top = 1 - (0.5 + grid["y"] * ROW_HEIGHT_IN) / height_in
        if panel["type"] == "row":
            figure.text(
                left + 0.005, top - 0.5 * ROW_HEIGHT_IN / height_in, panel["title"], color=TEXT, fontsize=12
            )
            continue
        panel_height = grid["h"] * ROW_HEIGHT_IN / height_in
        box = (left + 0.03, top - panel_height + 0.03, width - 0.036, panel_height - 0.065)
        axes = figure.add_axes(box, facecolor=PANEL)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        series = data.get(panel["title"], [])
        axes.set_title(panel["title"], color=TEXT, fontsize=10, loc="left")
        for spine in axes.spines.values():
            spine.set_color("#2c3235")
        axes.tick_params(colors=TEXT, labelsize=7)
        if panel["type"] == "stat":
            _stat(axes, series, unit)
        else:
            _timeseries(axes, series, unit)
    figure.savefig(out, dpi=80, facecolor=BACKGROUND)
    plt.close(figure)


def _stat(axes: Any, series: list[dict[str, Any]], unit: str) -> None:
    axes.set_xticks([])
    axes.set_yticks([])
    for n, line in enumerate(series):
        values = [v for _, v in line["points"] if math.isfinite(v)]
        shown = _format(values[-1], unit) if values else "no data"
        x = (n + 0.5) / max(1, len(series))
        axes.text(x, 0.55, shown, color=COLOURS[n % len(COLOURS)], fontsize=26, ha="center", va="center")
        axes.text(x, 0.2, line["legend"], color=TEXT, fontsize=9, ha="center", transform=axes.transAxes)


def _timeseries(axes: Any, series: list[dict[str, Any]], unit: str) -> None:
    start = min((p[0] for line in series for p in line["points"]), default=0.0)
    for n, line in enumerate(series):
        points = [(t - start, v) for t, v in line["points"] if math.isfinite(v)]
        if points:
            xs, ys = zip(*points, strict=True)
            axes.plot(xs, ys, color=COLOURS[n % len(COLOURS)], linewidth=1.2, label=line["legend"][:28])
    axes.set_xlabel("seconds", color=TEXT, fontsize=7)
    if unit == "s":
        axes.yaxis.set_major_formatter(lambda v, _: _format(v, "s"))
    if series:
        axes.legend(fontsize=6, loc="upper left", facecolor=PANEL, labelcolor=TEXT, framealpha=0.6, ncols=2)
    axes.grid(color="#2c3235", linewidth=0.5)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    render(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
