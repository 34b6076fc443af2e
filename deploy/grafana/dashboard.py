"""The parley Grafana dashboard, as code (grafana-foundation-sdk).

    python deploy/grafana/dashboard.py           # writes deploy/grafana/dashboards/parley.json
    python deploy/grafana/dashboard.py --check   # exits 1 if the committed JSON is not what this makes

Panels are declared once in PANELS (title, unit, queries, layout); the JSON is generated from them and
committed, and tests/unit/test_deploy.py checks the two agree. tests/integration/test_prometheus.py runs
every query of the committed JSON against a real Prometheus scraping a real service.
Install with `pip install -e '.[deploy]'` (the dev extra includes it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos, VariableRefresh, VariableSort

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "parley.json"
UID = "parley-calls"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
ALL = 'instance=~"$instance"'  # the instance variable; "All" is .*
WIDTH = 24  # Grafana's grid is 24 columns wide


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    width: int = 8
    height: int = 8
    kind: str = "timeseries"  # or "stat"
    stacked: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def quantiles(metric: str, by: str = "") -> tuple[Query, ...]:
    labels = f"le, {by}" if by else "le"
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({labels}) (rate({metric}_bucket{{{ALL}}}[{RATE}])))",
            f"p{round(q * 100)}" + (f" {{{{{by}}}}}" if by else ""),
        )
        for q in (0.5, 0.95, 0.99)
    )


def rate(metric: str, by: str = "", legend: str = "") -> Query:
    grouped = f"sum by ({by}) " if by else "sum "
    return Query(f"{grouped}(rate({metric}{{{ALL}}}[{RATE}]))", legend or (f"{{{{{by}}}}}" if by else metric))


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Calls",
        (
            Panel(
                "Active calls by transport",
                "Calls in progress on every instance, by how they came in.",
                "short",
                (Query(f"sum by (transport) (parley_calls_active{{{ALL}}})", "{{transport}}"),),
                stacked=True,
            ),
            Panel(
                "Call rate and outcomes",
                "Calls ended per second by outcome (hangup, busy, ice_failed, ...); refused calls by reason.",
                "cps",
                (
                    rate("parley_calls_total", "outcome"),
                    rate("parley_calls_refused_total", "reason", "refused: {{reason}}"),
                ),
            ),
            Panel(
                "Capacity left",
                "Lines free (sum of --max-calls minus calls in progress) and instances ready for calls.",
                "short",
                (
                    Query(
                        f"sum(parley_calls_max{{{ALL}}}) - sum(parley_calls_active{{{ALL}}})", "lines free"
                    ),
                    Query(f"sum(parley_ready{{{ALL}}})", "ready instances"),
                ),
                kind="stat",
            ),
        ),
    ),
    (
        "Latency",
        (
            Panel(
                "Response latency",
                "End of the caller's speech to the first reply audio sent. Target: p50 under 1.2 s.",
                "s",
                quantiles("parley_response_latency_seconds"),
                width=6,
            ),
            Panel(
                "Interruption latency",
                "Caller's speech onset heard to the agent's audio stopped. Target: p95 under 0.15 s.",
                "s",
                quantiles("parley_interruption_latency_seconds"),
                width=6,
            ),
            Panel(
                "Stage latency (p95)",
                "Per turn: VAD per chunk, STT per utterance, LLM to its first token, TTS to its first audio.",
                "s",
                (
                    Query(
                        "histogram_quantile(0.95, sum by (le, stage) "
                        f"(rate(parley_stage_latency_seconds_bucket{{{ALL}}}[{RATE}])))",
                        "{{stage}}",
                    ),
                ),
                width=6,
            ),
            Panel(
                "LLM prompt tokens",
                "Prompt tokens per second the in-process LLM (llama.cpp) kept from each call's conversation "
                "and read anew. Read tokens are what delays the first token; a rising share read means "
                "conversations no longer fit the sequences kept.",
                "short",
                (rate("parley_llm_prompt_tokens_total", "outcome"),),
                width=6,
            ),
        ),
    ),
    (
        "Turns and interruptions",
        (
            Panel(
                "Turns and barge-ins",
                "User turns opened and confirmed interruptions of the agent, per second.",
                "cps",
                (
                    rate("parley_turns_total", legend="turns"),
                    rate("parley_barge_ins_total", legend="barge-ins"),
                ),
            ),
            Panel(
                "Turn revisions and reopen outcomes",
                "A pause then more speech: reopen candidates confirmed (the turn was revised), cancelled "
                "(a blip) or timed out; and turns whose transcript stopped mid-sentence or mid-number, their "
                "reply held longer in case the caller goes on.",
                "cps",
                (
                    rate("parley_turn_revisions_total", legend="revisions"),
                    rate("parley_reopen_candidates_total", "outcome", "reopen {{outcome}}"),
                    rate("parley_unfinished_holds_total", legend="held mid-sentence or mid-number"),
                ),
            ),
            Panel(
                "False interruptions and replies",
                "Candidate interruptions that were blips or backchannels (the agent resumed), and how "
                "replies ended: committed, interrupted, superseded by a revision.",
                "cps",
                (
                    rate("parley_false_interruptions_total", legend="false interruptions"),
                    rate("parley_commits_total", "outcome", "reply {{outcome}}"),
                ),
            ),
        ),
    ),
    (
        "Phone teams",
        (
            Panel(
                "Who answered outbound calls",
                "The answering-machine verdict of the agent's outbound calls per second: human, machine "
                "(voicemail), ivr, unknown (how long the verdicts take: parley_amd_decision_seconds).",
                "cps",
                (rate("parley_amd_total", "result"),),
                width=6,
            ),
            Panel(
                "Recordings",
                "Call recordings stored, failed (the file or the store failed) and dropped (the writer fell "
                "behind), per second. The call goes on either way: failures here are recordings lost.",
                "cps",
                (rate("parley_recordings_total", "outcome"),),
                width=6,
            ),
            Panel(
                "Post-call analyses",
                "Analyses per second by outcome (ok, invalid, failed, dropped) and ended calls waiting for "
                "theirs. A queue that only grows means the LLM has no time left beside the live calls.",
                "short",
                (
                    rate("parley_analyses_total", "outcome"),
                    Query(f"sum(parley_analyses_waiting{{{ALL}}})", "waiting"),
                ),
                width=6,
            ),
            Panel(
                "Idle callers",
                "Lines said to callers who went quiet per second: prompts ('Are you still there?') and "
                "closings, after which the call ends as idle.",
                "cps",
                (rate("parley_idle_prompts_total", "type"),),
                width=6,
            ),
        ),
    ),
    (
        "Health",
        (
            Panel(
                "Queue depths",
                "Items waiting per stage across calls (and record events waiting for the database). "
                "A growing VAD queue means the CPU cannot keep up.",
                "short",
                (Query(f"sum by (stage) (parley_queue_depth{{{ALL}}})", "{{stage}}"),),
                width=6,
            ),
            Panel(
                "Dropped frames",
                "Caller audio dropped because a stage fell seconds behind.",
                "cps",
                (rate("parley_frames_dropped_total", "reason"),),
                width=6,
            ),
            Panel(
                "Engine errors",
                "Failures of the VAD, STT, LLM or TTS engine; each loses a reply.",
                "cps",
                (rate("parley_engine_errors_total", "engine"),),
                width=6,
            ),
            Panel(
                "Transport errors",
                "ICE failures and timeouts, SIP and carrier-stream problems, by reason.",
                "cps",
                (rate("parley_transport_errors_total", "transport, reason", "{{transport}} {{reason}}"),),
                width=6,
            ),
        ),
    ),
)


def _panel(spec: Panel, panel_id: int, x: int, y: int) -> Any:
    builder: Any = stat.Panel() if spec.kind == "stat" else timeseries.Panel()
    builder = (
        builder.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .grid_pos(GridPos(h=spec.height, w=spec.width, x=x, y=y))
    )
    if spec.kind == "timeseries":
        builder = (
            builder.line_width(1)
            .fill_opacity(10)
            .legend(
                common_builders.VizLegendOptions()
                .display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
        )
        if spec.stacked:
            builder = builder.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    for ref, query in zip("ABCDEFGH", spec.queries, strict=False):
        builder = builder.with_target(
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(ref)
            .datasource(DATASOURCE)
        )
    return builder


def build() -> dict[str, Any]:
    board = (
        dashboard.Dashboard("parley: calls")
        .uid(UID)
        .description("Calls, latency, interruptions and health of parley voice agents (deploy/grafana).")
        .tags(["parley", "voice"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("instance")
            .label("Instance")
            .datasource(DATASOURCE)
            .query("label_values(parley_calls_max, instance)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    y = 0
    panel_id = 0
    for title, panels in ROWS:
        panel_id += 1
        board = board.with_row(dashboard.Row(title).id(panel_id).grid_pos(GridPos(h=1, w=WIDTH, x=0, y=y)))
        y += 1
        x = 0
        for spec in panels:
            panel_id += 1
            board = board.with_panel(_panel(spec, panel_id, x, y))
            x += spec.width
        y += max(p.height for p in panels)
    data: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return data


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed JSON, write nothing")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
