"""What `parley test` tells a team: the JUnit XML a CI reads (counts, failures naming the turn, the
transcript), the HTML report they open (a timeline per call, the turns, escaped text, the failures shown),
and the lines printed while it runs (results only, when the output is not a terminal)."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from parley.scenarios.junit import write_junit
from parley.scenarios.progress import Progress
from parley.scenarios.report_html import write_report
from parley.scenarios.results import ScenarioResult, Span, TurnResult, Verdict

HOSTILE = 'Your order is <script>alert("x")</script> & on its way'
NOT_SHIPPED = "the reply did not say 'shipped': heard 'Your order is ...'"
NOT_TRANSFERRED = "outcome was hangup, expected transferred"


def passing() -> ScenarioResult:
    return ScenarioResult(
        name="order lookup",
        path="scenarios/order.toml",
        transport="sip",
        seed=7,
        call_id="c-123",
        outcome="agent_hangup",
        duration_s=14.2,
        greeting="Hello, thanks for calling Acme.",
        turns=[
            TurnResult(
                index=1,
                action='said "Where is my order 4471?"',
                said="Where is my order 4471?",
                spoke=Span(2.0, 4.0),
                heard="where is my order 4471",
                reply="Your order shipped yesterday.",
                response_s=0.70,
                tools=[
                    {"name": "lookup_order", "arguments": {"order": "4471"}, "result": {"status": "shipped"}}
                ],
            ),
            TurnResult(
                index=2,
                action='said "Thanks, bye"',
                said="Thanks, bye",
                spoke=Span(7.0, 8.0),
                heard="thanks bye",
                reply="Goodbye!",
                response_s=0.72,
            ),
        ],
        tool_calls=[{"name": "lookup_order", "arguments": {"order": "4471"}}],
        caller_speech=[Span(2.0, 4.0), Span(7.0, 8.0)],
        agent_speech=[Span(0.3, 1.8), Span(4.7, 6.5), Span(8.7, 9.5)],
        response_p50_s=0.71,
        response_p95_s=0.72,
        judge=Verdict(passed=True, reason="Polite and correct."),
    )


def failing() -> ScenarioResult:
    """A reply cut by a barge-in, with text a caller could have said, a call-level failure, an LLM turn."""
    return ScenarioResult(
        name="barge-in & transfer",
        path="scenarios/barge.toml",
        transport="webrtc",
        seed=11,
        call_id="c-456",
        outcome="hangup",
        duration_s=13.0,
        turns=[
            TurnResult(
                index=1,
                action='said "Where is my order?"',
                said="Where is my order?",
                spoke=Span(2.0, 3.5),
                heard="where is my <b>order</b>",
                reply=HOSTILE,
                interrupted=True,
                response_s=0.9,
                failures=[NOT_SHIPPED],
            ),
            TurnResult(
                index=2,
                action='said "Stop, stop"',
                said="Stop, stop",
                spoke=Span(5.0, 5.8),  # inside the agent's 4.4-6.0 s: the barge-in that cut turn 1's reply
                heard="stop stop",
                reply="Sorry, go ahead.",
                response_s=0.6,
            ),
            TurnResult(
                index=3,
                action='said "Can I talk to a person?"',
                said="Can I talk to a person?",
                spoke=Span(9.0, 10.5),
                heard="can i talk to a person",
                reply="Transferring you now.",
                response_s=0.6,
                tools=[{"name": "transfer", "arguments": {"to": "+15550100"}, "result": {"ok": True}}],
                by_llm=True,
            ),
        ],
        caller_speech=[Span(2.0, 3.5), Span(5.0, 5.8), Span(9.0, 10.5)],
        agent_speech=[Span(0.2, 1.5), Span(4.4, 6.0), Span(6.4, 7.8), Span(11.1, 12.5)],
        talk_over=[Span(5.0, 5.8)],
        tool_calls=[{"name": "transfer", "arguments": {"to": "+15550100"}}],
        response_p50_s=0.6,
        response_p95_s=0.9,
        judge=Verdict(passed=False, reason="It never <em>apologised</em> & hung up."),
        failures=[NOT_TRANSFERRED],
    )


def broken() -> ScenarioResult:
    return ScenarioResult(
        name="no call",
        path="scenarios/none.toml",
        transport="carrier",
        seed=0,
        error="could not connect: 503 Service Unavailable",
    )


RESULTS = [passing(), failing(), broken()]


# JUnit XML


def junit(tmp_path: Path) -> ET.Element:
    path = tmp_path / "reports" / "junit.xml"
    write_junit(RESULTS, path)
    assert path.read_bytes().startswith(b"<?xml version='1.0' encoding='utf-8'?>")
    return ET.parse(path).getroot()


def test_junit_counts_one_case_per_scenario_named_by_transport_and_file(tmp_path: Path) -> None:
    suites = junit(tmp_path).findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    assert suite.get("name") == "parley test"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    assert float(suite.get("time", "")) == pytest.approx(27.2)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", suite.get("timestamp", ""))
    cases = suite.findall("testcase")
    assert [(c.get("name"), c.get("classname"), c.get("file")) for c in cases] == [
        ("order lookup", "sip", "scenarios/order.toml"),
        ("barge-in & transfer", "webrtc", "scenarios/barge.toml"),
        ("no call", "carrier", "scenarios/none.toml"),
    ]
    assert float(cases[0].get("time", "")) == pytest.approx(14.2)
    assert cases[0].find("failure") is None and cases[0].find("error") is None


def test_a_failed_scenario_names_its_first_failure_and_lists_every_one(tmp_path: Path) -> None:
    case = junit(tmp_path).findall("testsuite/testcase")[1]
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("type") == "expectation"
    assert failure.get("message") == f"turn 1: {NOT_SHIPPED}"
    assert (failure.text or "").splitlines() == [f"turn 1: {NOT_SHIPPED}", NOT_TRANSFERRED]


def test_a_run_that_failed_is_an_error_not_a_failure(tmp_path: Path) -> None:
    case = junit(tmp_path).findall("testsuite/testcase")[2]
    error = case.find("error")
    assert case.find("failure") is None and error is not None
    assert error.get("message") == "could not connect: 503 Service Unavailable"


def test_a_crash_in_colour_still_makes_a_file_the_ci_can_read(tmp_path: Path) -> None:
    crashed = broken()
    crashed.error = "\x1b[31mConnectionRefusedError\x1b[0m: port 5060\x00"
    write_junit([crashed], tmp_path / "junit.xml")
    write_report([crashed], tmp_path / "report.html")
    error = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite/testcase/error")
    assert error is not None and error.get("message") == "ConnectionRefusedError: port 5060"
    assert "</strong>: ConnectionRefusedError: port 5060</li>" in (tmp_path / "report.html").read_text()


def test_the_output_is_the_transcript_turn_by_turn_with_the_seed(tmp_path: Path) -> None:
    out = junit(tmp_path).findall("testsuite/testcase")[1].findtext("system-out") or ""
    assert "seed 11" in out
    assert 'turn 1 (caller): said "Where is my order?"' in out
    assert "agent heard: where is my <b>order</b>" in out  # the caller's text, intact through the XML
    assert f"agent replied (0.90 s): {HOSTILE} [interrupted]" in out
    assert "turn 3 (LLM caller)" in out
    assert 'tool transfer {"to": "+15550100"} -> {"ok": true}' in out
    assert "judge: failed: It never <em>apologised</em> & hung up." in out


# The HTML report


class Page(HTMLParser):
    """What a browser would build of the page: the elements met, the text shown, per SVG its rects."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.svgs: list[list[tuple[str, dict[str, str | None]]]] = []
        self._in_svg = False
        self._rows: list[tuple[str, list[str]]] = []
        self._row: tuple[str, list[str]] | None = None
        self._skip = 0  # inside <style> or an SVG <title>: not text on the page

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"] or "")
        if tag == "a" and found.get("href"):
            self.links.append(found["href"] or "")
        if tag == "svg":
            self._in_svg = True
            self.svgs.append([])
        elif self._in_svg:
            self.svgs[-1].append((tag, found))
        if tag == "tr":
            self._row = (found.get("id") or "", [])
            self._rows.append(self._row)
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._in_svg = False
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)
            if self._row is not None:
                self._row[1].append(data)

    def shapes(self, svg: int, cls: str) -> int:
        return sum(1 for _, attrs in self.svgs[svg] if (attrs.get("class") or "").split()[:1] == [cls])

    def row(self, row_id: str) -> str:
        return " ".join(" ".join(parts) for found, parts in self._rows if found == row_id)


def report(tmp_path: Path) -> tuple[str, Page]:
    path = tmp_path / "reports" / "report.html"
    write_report(RESULTS, path)
    html = path.read_text(encoding="utf-8")
    page = Page()
    page.feed(html)
    page.close()
    return html, page


def test_the_report_stands_alone(tmp_path: Path) -> None:
    html, page = report(tmp_path)
    assert html.startswith("<!DOCTYPE html>")
    assert "script" not in page.tags  # nothing runs, not even the caller's words
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # no external asset


def test_the_summary_counts_and_links_every_scenario(tmp_path: Path) -> None:
    _, page = report(tmp_path)
    shown = " ".join(page.text)
    assert "1 passed" in shown and "2 failed" in shown
    for number in (1, 2, 3):
        assert f"#scenario-{number}" in page.links
        assert f"scenario-{number}" in page.ids


def test_each_call_with_speech_has_a_timeline_of_both_lanes(tmp_path: Path) -> None:
    _, page = report(tmp_path)
    assert len(page.svgs) == 2  # the run that never placed its call has no timeline
    for svg, result in enumerate(RESULTS[:2]):
        assert page.shapes(svg, "caller") == len(result.caller_speech)
        assert page.shapes(svg, "agent") == len(result.agent_speech)
        assert page.shapes(svg, "talkover") == len(result.talk_over)
    assert page.shapes(0, "cutmark") == 0
    assert page.shapes(1, "cutmark") == 1  # turn 1's reply, cut by turn 2's barge-in


def test_the_cut_mark_sits_at_the_end_of_the_reply_the_caller_barged_into(tmp_path: Path) -> None:
    _, page = report(tmp_path)
    agent = [attrs for tag, attrs in page.svgs[1] if tag == "rect" and attrs.get("class") == "agent"]
    cut = next(attrs for tag, attrs in page.svgs[1] if attrs.get("class") == "cutmark")
    barged = agent[1]  # the agent's 4.4-6.0 s span, where turn 2 began
    end = float(barged["x"] or 0) + float(barged["width"] or 0)
    assert float(cut["x1"] or 0) == pytest.approx(end, abs=0.2)


def test_caller_and_agent_text_is_escaped_and_shown_as_said(tmp_path: Path) -> None:
    html, page = report(tmp_path)
    shown = " ".join(page.text)
    assert HOSTILE in shown
    assert "where is my <b>order</b>" in shown
    assert "It never <em>apologised</em> & hung up." in shown
    assert "<script>" not in html and "<b>order" not in html


def test_the_failures_are_listed_naming_the_turn_and_its_row_marked(tmp_path: Path) -> None:
    html, page = report(tmp_path)
    section = html[html.index('id="scenario-2"') : html.index('id="scenario-3"')]
    failures = section[section.index('class="failures"') :]
    assert '<a href="#scenario-2-turn-1"><strong>turn 1</strong></a>' in failures
    assert NOT_SHIPPED.replace("'", "&#x27;") in failures
    assert NOT_TRANSFERRED in failures
    assert 'id="scenario-2-turn-1" class="failed"' in section
    row = page.row("scenario-2-turn-1")
    assert "[cut]" in row and NOT_SHIPPED in row and "0.90 s" in row
    assert "Judge: failed" in " ".join(page.text)
    broken_section = html[html.index('id="scenario-3"') :]
    assert "<strong>the run failed</strong>: could not connect: 503 Service" in broken_section


def test_turns_show_tool_calls_and_which_the_llm_caller_played(tmp_path: Path) -> None:
    _, page = report(tmp_path)
    assert "lookup_order" in page.row("scenario-1-turn-1")
    assert '{"order": "4471"}' in page.row("scenario-1-turn-1")
    assert '{"status": "shipped"}' in page.row("scenario-1-turn-1")
    assert "LLM caller" in page.row("scenario-2-turn-3")
    assert "LLM caller" not in page.row("scenario-2-turn-2")


# Progress while it runs


def run(progress: Progress) -> None:
    for result in RESULTS:
        progress.started(result.name)
        for turn in result.turns:
            progress.turn(turn.index)
        progress.finished(result)


def test_a_log_gets_one_line_per_scenario_and_no_progress_bar() -> None:
    stream = io.StringIO()
    progress = Progress(len(RESULTS), stream)
    run(progress)
    assert stream.getvalue().splitlines() == [
        "PASS  order lookup (sip, 14.2 s, p50 0.71 s)",
        f"FAIL  barge-in & transfer (webrtc, 13.0 s): turn 1: {NOT_SHIPPED} (and 1 more)",
        "FAIL  no call (carrier, 0.0 s): error: could not connect: 503 Service Unavailable",
    ]
    assert re.fullmatch(r"1 passed, 2 failed in \d+\.\d s", progress.summary())


def test_the_summary_counts_scenarios_that_never_finished() -> None:
    progress = Progress(4, io.StringIO())
    progress.finished(passing())
    assert re.fullmatch(r"1 passed, 3 not run in \d+\.\d s", progress.summary())


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_redrawn_in_place_and_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    stream = Terminal()
    progress = Progress(2, stream)
    progress.finished(passing())
    progress.started("barge-in & transfer")
    progress.turn(2)
    out = stream.getvalue()
    assert "\x1b[32mPASS\x1b[0m  order lookup" in out
    assert out.endswith("\r\x1b[K[##########----------] 1/2 scenarios · barge-in & transfer · turn 2")


def test_no_color_keeps_the_bar_but_drops_the_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    stream = Terminal()
    progress = Progress(1, stream)
    progress.started("order lookup")
    progress.finished(passing())
    out = stream.getvalue()
    assert "\r" in out
    assert "PASS  order lookup" in out and "\x1b[32m" not in out
