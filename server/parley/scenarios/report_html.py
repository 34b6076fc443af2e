"""A `parley test` run as one self-contained HTML page, the file a team opens after a CI run: a summary,
then per scenario its facts, its failures, a timeline of both channels' speech on one clock (inline SVG)
and its turns in a table. Inline CSS only: no script, no external asset, so it opens anywhere, from an
artifact download or an email.
"""

from __future__ import annotations

import html
import json
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from parley.scenarios.results import ScenarioResult, Span, TurnResult

# The timeline's geometry, in SVG user units (the picture scales to the page's width).
_WIDTH = 960
_LEFT = 92  # room for the lanes' names
_RIGHT = 14
_TOP = 20  # room for the turns' numbers above the caller's lane
_LANE = 24
_GAP = 10
_AXIS = _TOP + 2 * _LANE + _GAP + 8
_HEIGHT = _AXIS + 20
_MIN_WIDTH = 1.5  # a blip of speech still shows
_CUT_S = 0.6  # how much of a cut reply's end is hatched
_TICK_STEPS = (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600)
_MAX_TICKS = 12
_LONG_JSON = 160  # tool JSON past this folds into a <details>
# An escape sequence whole (an exception's colour codes), else any other control character.
_CONTROL = re.compile("\x1b\\[[0-9;]*[A-Za-z]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_CSS = """
:root { --pass: #1a7f37; --pass-bg: #dafbe1; --fail: #cf222e; --fail-bg: #ffebe9; --ink: #1f2328;
  --muted: #656d76; --line: #d0d7de; --soft: #eaeef2; --caller: #0969da; --agent: #8250df;
  --over: #fb8500; }
* { box-sizing: border-box; }
body { margin: 0; background: #f6f8fa; color: var(--ink);
  font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1160px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0; }
h2 { font-size: 18px; margin: 0; display: flex; align-items: center; gap: 10px; }
h3 { font-size: 13px; margin: 20px 0 8px; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; }
a { color: var(--caller); text-decoration: none; }
a:hover { text-decoration: underline; }
.muted { color: var(--muted); }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px;
  margin: 16px 0; }
.card.passed { border-left: 4px solid var(--pass); }
.card.failed { border-left: 4px solid var(--fail); }
.head { display: flex; justify-content: space-between; align-items: baseline; flex-wrap: wrap; gap: 8px; }
.counts { display: flex; gap: 8px; align-items: center; margin-top: 10px; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 999px; font-size: 12px; font-weight: 600;
  letter-spacing: .02em; white-space: nowrap; }
.badge.pass { background: var(--pass-bg); color: var(--pass); }
.badge.fail { background: var(--fail-bg); color: var(--fail); }
.badge.llm { background: #fbefff; color: var(--agent); font-weight: 500; }
.counts .badge { font-size: 14px; padding: 3px 12px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: 7px 8px; border-bottom: 1px solid var(--soft); }
th { font-size: 12px; color: var(--muted); font-weight: 600; text-transform: uppercase;
  letter-spacing: .04em; white-space: nowrap; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { background: #fff8f7; }
tr.failed td:first-child { box-shadow: inset 3px 0 var(--fail); }
dl.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px 24px;
  margin: 14px 0 0; }
dl.facts dt { font-size: 12px; color: var(--muted); }
dl.facts dd { margin: 0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.failures { background: var(--fail-bg); border: 1px solid #ffcecb; border-radius: 6px; color: #82071e;
  padding: 10px 16px; margin-top: 16px; }
.failures strong { color: var(--fail); }
.failures ul, ul.fails { margin: 4px 0 0; padding-left: 18px; }
ul.fails { color: var(--fail); }
.verdict { border-radius: 6px; padding: 10px 16px; margin-top: 16px; border: 1px solid; }
.verdict.pass { background: #f0fff4; border-color: #aceebb; }
.verdict.fail { background: var(--fail-bg); border-color: #ffcecb; }
.cut { color: var(--fail); font-weight: 600; white-space: nowrap; }
code, pre { font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; white-space: pre-wrap;
  overflow-wrap: anywhere; }
pre { background: #f6f8fa; padding: 6px 8px; border-radius: 4px; white-space: pre-wrap;
  overflow-wrap: anywhere; margin: 4px 0; }
.tool + .tool { margin-top: 6px; }
details summary { cursor: pointer; }
svg.timeline { display: block; width: 100%; height: auto; margin-top: 4px; }
svg text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; fill: var(--muted); }
svg .lane { fill: #f6f8fa; }
svg .grid { stroke: var(--soft); }
svg .axis { stroke: var(--line); }
svg .caller { fill: var(--caller); }
svg .agent { fill: var(--agent); }
svg .talkover { fill: var(--over); opacity: .45; }
svg .overedge { fill: none; stroke: var(--over); stroke-width: 2; }
svg .cutmark { stroke: var(--fail); stroke-width: 3; }
svg .turnmark { stroke: #8c959f; stroke-dasharray: 2 2; }
svg text.lanename { font-size: 12px; font-weight: 600; fill: var(--ink); }
svg text.turnno { font-weight: 600; fill: var(--ink); }
svg text.turnno.llm { fill: var(--agent); font-style: italic; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 12px; color: var(--muted);
  margin: 4px 0 0 8px; }
.legend i { display: inline-block; width: 12px; height: 10px; border-radius: 2px; margin-right: 5px;
  vertical-align: -1px; }
"""


def write_report(results: list[ScenarioResult], path: Path) -> None:
    """Write the run's report to `path` (UTF-8), its folder made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(results), encoding="utf-8")


def render_report(results: list[ScenarioResult]) -> str:
    """The report's HTML."""
    passed = sum(1 for r in results if r.passed)
    failed = len(results) - passed
    title = f"parley test: {passed} passed" + (f", {failed} failed" if failed else "")
    body = [_summary(results, passed, failed)]
    body += [_scenario(result, number) for number, result in enumerate(results, 1)]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_text(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(body)
        + "\n</main>\n</body>\n</html>\n"
    )


def _summary(results: list[ScenarioResult], passed: int, failed: int) -> str:
    written = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    calls_s = sum(r.duration_s for r in results)
    counts = f'<span class="badge pass">{passed} passed</span>'
    if failed:
        counts += f'<span class="badge fail">{failed} failed</span>'
    counts += (
        f'<span class="muted">{len(results)} scenario{"" if len(results) == 1 else "s"} · '
        f"{_seconds(calls_s)} of calls</span>"
    )
    rows = []
    for number, result in enumerate(results, 1):
        found = result.all_failures()
        if found:
            note = _text(found[0]) + (
                f' <span class="muted">(and {len(found) - 1} more)</span>' if len(found) > 1 else ""
            )
        else:
            note = ""
        rows.append(
            f'<tr class="{"passed" if result.passed else "failed"}"><td>{_badge(result)}</td>'
            f'<td><a href="#scenario-{number}">{_text(result.name)}</a></td>'
            f"<td>{_text(result.transport)}</td>"
            f'<td class="num">{_seconds(result.duration_s)}</td>'
            f'<td class="num">{_latency(result.response_p50_s)}</td>'
            f'<td class="num">{_latency(result.response_p95_s)}</td>'
            f"<td>{note}</td></tr>"
        )
    table = (
        "<table><thead><tr><th></th><th>Scenario</th><th>Transport</th><th>Duration</th>"
        "<th>p50</th><th>p95</th><th>First failure</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
        if results
        else '<p class="muted">No scenarios ran.</p>'
    )
    return (
        f'<section class="card"><div class="head"><h1>parley test</h1>'
        f'<span class="muted">written {_text(written)}</span></div>'
        f'<div class="counts">{counts}</div><h3>Scenarios</h3>{table}</section>'
    )


def _scenario(result: ScenarioResult, number: int) -> str:
    parts = [
        f'<section class="card {"passed" if result.passed else "failed"}" id="scenario-{number}">',
        f'<div class="head"><h2>{_badge(result)} {_text(result.name)}</h2>'
        f'<span class="muted">{_text(result.path)}</span></div>',
        _facts(result),
        _failures(result, number),
        _verdict(result),
    ]
    timeline = _timeline(result, number)
    parts.append("<h3>Timeline</h3>" + (timeline or '<p class="muted">No speech was recorded.</p>'))
    parts.append("<h3>Turns</h3>" + _turns(result, number))
    parts.append("</section>")
    return "\n".join(part for part in parts if part)


def _facts(result: ScenarioResult) -> str:
    outcome = _text(result.outcome) if result.outcome else '<span class="muted">none recorded</span>'
    if result.transferred_to:
        outcome += f" → {_text(result.transferred_to)}"
    tools = ", ".join(_text(str(call.get("name", "?"))) for call in result.tool_calls)
    facts = [
        ("Transport", _text(result.transport)),
        ("Seed", str(result.seed)),
        ("Call id", f"<code>{_text(result.call_id)}</code>" if result.call_id else "—"),
        ("Outcome", outcome),
        ("Duration", _seconds(result.duration_s)),
        (
            "Response p50 · p95",
            f"{_latency(result.response_p50_s)} · {_latency(result.response_p95_s)}",
        ),
        ("Tool calls", tools or '<span class="muted">none</span>'),
    ]
    return '<dl class="facts">' + "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in facts) + "</dl>"


def _failures(result: ScenarioResult, number: int) -> str:
    """Every failure, each naming where it happened, the turn ones linking to the turn's row."""
    items = []
    if result.error:
        items.append(f"<li><strong>the run failed</strong>: {_text(result.error)}</li>")
    for turn in result.turns:
        link = f'<a href="#scenario-{number}-turn-{turn.index}"><strong>turn {turn.index}</strong></a>'
        items += [f"<li>{link}: {_text(failure)}</li>" for failure in turn.failures]
    items += [f"<li><strong>the call</strong>: {_text(failure)}</li>" for failure in result.failures]
    if not items:
        return ""
    heading = f"{len(items)} failure{'' if len(items) == 1 else 's'}"
    return f'<div class="failures"><strong>{heading}</strong><ul>{"".join(items)}</ul></div>'


def _verdict(result: ScenarioResult) -> str:
    if result.judge is None:
        return ""
    passed = result.judge.passed
    return (
        f'<div class="verdict {"pass" if passed else "fail"}"><strong>Judge: '
        f"{'passed' if passed else 'failed'}</strong> {_text(result.judge.reason)}</div>"
    )


def _timeline(result: ScenarioResult, number: int) -> str:
    """Both channels on one time axis: the caller's speech, the agent's as the caller heard it, where
    they talked over each other, where each caller turn began and where a reply was cut."""
    spoken = [t.spoke for t in result.turns if t.spoke is not None]
    ends = [s.end for s in [*result.caller_speech, *result.agent_speech, *result.talk_over, *spoken]]
    if not ends:
        return ""
    length = max(result.duration_s, *ends)
    if length <= 0:
        return ""
    scale = (_WIDTH - _LEFT - _RIGHT) / length

    def x(t: float) -> float:
        return _LEFT + max(0.0, min(t, length)) * scale

    def rect(span: Span, y: float, height: float, cls: str, label: str) -> str:
        width = max(x(span.end) - x(span.start), _MIN_WIDTH)
        return (
            f'<rect class="{cls}" x="{x(span.start):.1f}" y="{y:.1f}" width="{width:.1f}" '
            f'height="{height:.1f}" rx="2"><title>{_text(label)} {span.start:.2f}–{span.end:.2f} s'
            "</title></rect>"
        )

    caller_y = _TOP
    agent_y = _TOP + _LANE + _GAP
    hatch = f"hatch-{number}"
    out = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_WIDTH} {_HEIGHT}" '
        f'role="img" aria-label="timeline of {_text(result.name)}">',
        f'<defs><pattern id="{hatch}" width="5" height="5" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="5" height="5" fill="#fff"/>'
        '<line x1="0" y1="0" x2="0" y2="5" stroke="#cf222e" stroke-width="3"/></pattern></defs>',
        f'<rect class="lane" x="{_LEFT}" y="{caller_y}" width="{_WIDTH - _LEFT - _RIGHT}" height="{_LANE}"/>',
        f'<rect class="lane" x="{_LEFT}" y="{agent_y}" width="{_WIDTH - _LEFT - _RIGHT}" height="{_LANE}"/>',
        f'<text class="lanename" x="{_LEFT - 10}" y="{caller_y + 16}" text-anchor="end">caller</text>',
        f'<text class="lanename" x="{_LEFT - 10}" y="{agent_y + 11}" text-anchor="end">agent</text>',
        f'<text x="{_LEFT - 10}" y="{agent_y + 23}" text-anchor="end">as heard</text>',
    ]
    step = next((s for s in _TICK_STEPS if length / s <= _MAX_TICKS), _TICK_STEPS[-1])
    for i in range(math.floor(length / step) + 1):
        t = i * step
        out.append(
            f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{caller_y}" y2="{_AXIS}"/>'
            f'<text x="{x(t):.1f}" y="{_AXIS + 14}" text-anchor="middle">{_tick(t)}</text>'
        )
    out.append(f'<line class="axis" x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{_AXIS}" y2="{_AXIS}"/>')
    # Talk-over spans both lanes, since it is the two of them at once: a band under the speech, so both
    # keep their colours, and its outline over them.
    over_y = caller_y - 4
    over_height = agent_y + _LANE - caller_y + 8
    out += [rect(s, over_y, over_height, "talkover", "talk-over") for s in result.talk_over]
    out += [rect(s, caller_y, _LANE, "caller", "caller") for s in result.caller_speech]
    out += [rect(s, agent_y, _LANE, "agent", "agent") for s in result.agent_speech]
    out += [rect(s, over_y, over_height, "overedge", "talk-over") for s in result.talk_over]
    for position, turn in enumerate(result.turns):
        if turn.spoke is not None:
            at = x(turn.spoke.start)
            llm = " llm" if turn.by_llm else ""
            who = "the LLM caller's" if turn.by_llm else "the caller's"
            out.append(
                f'<line class="turnmark" x1="{at:.1f}" x2="{at:.1f}" y1="{caller_y - 6}" '
                f'y2="{caller_y + _LANE}"/><text class="turnno{llm}" x="{at + 3:.1f}" '
                f'y="{caller_y - 6}">{turn.index}<title>turn {turn.index}, {who}</title></text>'
            )
        cut = _cut_span(result, position)
        if cut is not None:
            hatched = Span(max(cut.start, cut.end - _CUT_S), cut.end)
            width = max(x(hatched.end) - x(hatched.start), _MIN_WIDTH)
            out.append(
                f'<rect class="cutend" x="{x(hatched.start):.1f}" y="{agent_y}" width="{width:.1f}" '
                f'height="{_LANE}" fill="url(#{hatch})"/>'
                f'<line class="cutmark" x1="{x(cut.end):.1f}" x2="{x(cut.end):.1f}" y1="{agent_y - 4}" '
                f'y2="{agent_y + _LANE + 4}"><title>the reply to turn {turn.index} was cut at '
                f"{cut.end:.2f} s</title></line>"
            )
    out.append("</svg>")
    legend = (
        '<div class="legend"><span><i style="background:var(--caller)"></i>caller speech</span>'
        '<span><i style="background:var(--agent)"></i>agent speech, as the caller heard it</span>'
        '<span><i style="background:#fdc892;border:2px solid var(--over)"></i>talk-over</span>'
        '<span><i style="background:var(--fail)"></i>reply cut</span>'
        "<span><b>1</b> caller turn · <b><em>4</em></b> turn played by the LLM caller</span></div>"
    )
    return "".join(out) + legend


def _cut_span(result: ScenarioResult, position: int) -> Span | None:
    """The agent span that ends an interrupted turn's reply: the last one heard from the turn's start
    until the next caller turn began (a barge-in lands inside it), or until the call ended."""
    turn = result.turns[position]
    if not turn.interrupted or turn.spoke is None:
        return None
    begun = turn.spoke.start
    later = [t.spoke.start for t in result.turns[position + 1 :] if t.spoke is not None]
    until = later[0] if later else math.inf
    reply = [s for s in result.agent_speech if begun <= s.start < until]
    return max(reply, key=lambda s: s.start) if reply else None


def _turns(result: ScenarioResult, number: int) -> str:
    rows = []
    if result.greeting:
        rows.append(
            '<tr><td class="num muted">—</td><td class="muted">(call connected)</td><td></td>'
            f"<td>{_text(result.greeting)}</td><td></td><td></td><td></td></tr>"
        )
    rows += [_turn_row(turn, number) for turn in result.turns]
    if not rows:
        return '<p class="muted">No turns were played.</p>'
    return (
        "<table><thead><tr><th>#</th><th>Caller</th><th>Agent heard</th><th>Agent said</th>"
        "<th>Tools</th><th>Response</th><th>Failures</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _turn_row(turn: TurnResult, number: int) -> str:
    caller = _text(turn.action)
    if turn.said and turn.said not in turn.action:
        caller += f'<br><span class="muted">{_text(turn.said)}</span>'
    if turn.by_llm:
        caller += ' <span class="badge llm">LLM caller</span>'
    heard = _text(turn.heard) if turn.heard else '<span class="muted">—</span>'
    said = _text(turn.reply) if turn.reply else '<span class="muted">(no reply)</span>'
    if turn.interrupted:
        said += ' <span class="cut">… [cut]</span>'
    tools = "".join(_tool(call) for call in turn.tools)
    failures = (
        '<ul class="fails">' + "".join(f"<li>{_text(f)}</li>" for f in turn.failures) + "</ul>"
        if turn.failures
        else ""
    )
    marked = ' class="failed"' if turn.failures else ""
    return (
        f'<tr id="scenario-{number}-turn-{turn.index}"{marked}>'
        f'<td class="num">{turn.index}</td><td>{caller}</td><td>{heard}</td><td>{said}</td>'
        f'<td>{tools}</td><td class="num">{_latency(turn.response_s)}</td><td>{failures}</td></tr>'
    )


def _tool(call: dict[str, Any]) -> str:
    arguments = _json_block(call.get("arguments", {}))
    if call.get("error"):
        answer = f'<span class="cut">error</span> {_text(str(call["error"]))}'
    else:
        answer = _json_block(call.get("result"))
    return (
        f'<div class="tool"><strong>{_text(str(call.get("name", "?")))}</strong> {arguments} → {answer}</div>'
    )


def _json_block(value: Any) -> str:
    """JSON inline when short; a long one (a whole order record) folded, its start showing."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= _LONG_JSON:
        return f"<code>{_text(text)}</code>"
    full = json.dumps(value, ensure_ascii=False, default=str, indent=2)
    return f"<details><summary><code>{_text(text[:60])}…</code></summary><pre>{_text(full)}</pre></details>"


def _text(value: str) -> str:
    """Text as HTML shows it: escaped (it is the caller's and the agent's words), and without the control
    characters an HTML page cannot hold."""
    return html.escape(_CONTROL.sub("", value))


def _badge(result: ScenarioResult) -> str:
    return '<span class="badge pass">PASS</span>' if result.passed else '<span class="badge fail">FAIL</span>'


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def _latency(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _tick(t: float) -> str:
    return f"{t:g} s"
