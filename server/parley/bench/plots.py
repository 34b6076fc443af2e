"""PNG plots of benchmark results (matplotlib, from the dev extra): latency distributions, and latency and
CPU per call against the number of callers. Without matplotlib the benchmarks still run, without plots."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[dev]'): no plots", file=sys.stderr)
        return None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_latency_distribution(named: dict[str, list[float]], path: Path, title: str) -> Path | None:
    """Cumulative distribution of response latencies, one line per series (e.g. before / after)."""
    plt = _pyplot()
    if plt is None or not any(named.values()):
        return None
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, values in named.items():
        if values:
            ordered = sorted(values)
            share = [(i + 1) / len(ordered) for i in range(len(ordered))]
            axes.step(ordered, share, where="post", label=f"{name} (n={len(ordered)})")
    axes.set_xlabel("end of question -> first reply audio at the caller (s)")
    axes.set_ylabel("share of replies")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_capacity(levels: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Response latency (p50, p95) and CPU per call against callers; the latency distribution per level."""
    plt = _pyplot()
    if plt is None or not levels:
        return []
    callers = [level["callers"] for level in levels]
    p50 = [level["response_s"]["p50"] for level in levels]
    p95 = [level["response_s"]["p95"] for level in levels]
    cpu = [level["cpu_per_call_pct"] for level in levels]
    figure, left = plt.subplots(figsize=(7, 4))
    left.plot(callers, p50, "o-", label="response p50")
    left.plot(callers, p95, "s--", label="response p95")
    left.set_xlabel("callers asking questions at once (8-12 s apart each)")
    left.set_ylabel("response latency at the caller (s)")
    left.grid(alpha=0.3)
    right = left.twinx()
    right.plot(callers, cpu, "^:", color="tab:red", label="service CPU per call")
    right.set_ylabel("% of a core per call")
    lines = left.get_lines() + right.get_lines()
    left.legend(lines, [line.get_label() for line in lines], loc="upper left")
    left.set_title("Full pipeline: latency and CPU per call against callers")
    folder.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    scaling = folder / "capacity-full.png"
    figure.savefig(scaling, dpi=110)
    plt.close(figure)
    distribution = plot_latency_distribution(
        {f"{level['callers']} callers": level["latencies"] for level in levels},
        folder / "capacity-full-latency.png",
        "Response latency per level",
    )
    return [scaling] + ([distribution] if distribution else [])
