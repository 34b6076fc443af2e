"""The page through a proxy (issue 46, item 4): headless Chromium loads the served page from Debian's
HAProxy running the deployed config (deploy/haproxy/haproxy.cfg, but for its addresses) in front of two
instances with the real models, each taking one call at a time (`--max-calls 1`). Two pages call: the
first call takes one instance, so the second page's offer, refused 503 by that full instance if the
proxy sends it there, is retried on the other. Each caller hears its greeting, with media straight
between Chromium and the instance; the page's hang-up (`DELETE /whip/<id>`) reaches the instance that
holds the call, named in its id; and each call's record ends. Slow (two services, a proxy and a
browser): `make test-all`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.bench.browser import CHROMIUM, chromium_flags
from parley.bench.service import Service, metric_value
from parley.bench.speech import silence_ms, write_wav
from tests.fleet.conftest import behind_haproxy
from tests.fleet.haproxy import HAProxy
from tests.fleet.test_sip_through_kamailio import ended
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

TAGS = ("p1", "p2")


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, cluster: PostgresCluster
) -> Iterator[tuple[list[Service], HAProxy]]:
    folder = tmp_path_factory.mktemp("page-fleet")
    tagged = [["--instance-tag", tag, "--trusted-proxies", "127.0.0.1", "--max-calls", "1"] for tag in TAGS]
    with behind_haproxy(folder, cluster.new_database(), tagged) as fleet:
        yield fleet


@pytest.fixture
def microphone_wav(tmp_path: Path) -> Path:
    # A quiet caller: the greeting is all this test listens for.
    wav = tmp_path / "quiet.wav"
    write_wav(wav, silence_ms(5000))
    return wav


def not_found(service: Service) -> float:
    """Requests the instance answered 404 (a call it does not hold), from its metrics."""
    return metric_value(service.metrics_text(), "parley_http_errors_total", {"reason": "not_found"})


def refused_full(service: Service) -> float:
    """Offers the instance refused 503 for being at capacity (its metrics)."""
    return metric_value(
        service.metrics_text(), "parley_calls_refused_total", {"transport": "webrtc", "reason": "capacity"}
    )


def greeted(page: Any, timeout_s: float = 30.0) -> str:
    """Click Call, wait until the greeting is on screen and its audio has arrived; the call's id."""
    page.click("#call-button")
    page.wait_for_function("window.parley.callId !== null", timeout=20_000)
    page.wait_for_function(
        "window.parley.transcript.some(e => e.role === 'agent' && e.turn_id === 'greeting' && e.text)",
        timeout=timeout_s * 1000,
    )
    deadline = time.monotonic() + timeout_s
    while page.evaluate("window.parley.inboundAudioEnergy()") <= 0:
        assert time.monotonic() < deadline, "no greeting audio reached the page"
        time.sleep(0.2)
    call_id: str = page.evaluate("window.parley.callId")
    return call_id


def hung_up(page: Any, call_id: str) -> int:
    """Click Hang up; the status the page's DELETE of the call got."""
    with page.expect_response(
        lambda r: r.request.method == "DELETE" and call_id in r.url, timeout=10_000
    ) as deleted:
        page.click("#call-button")
    page.wait_for_function("document.body.dataset.state === 'ended'", timeout=10_000)
    status: int = deleted.value.status
    return status


def test_page_calls_through_haproxy_reach_both_instances_and_hang_up_where_they_are(
    fleet: tuple[list[Service], HAProxy], microphone_wav: Path
) -> None:
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (make install installs it)")
    services, proxy = fleet
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_flags(microphone_wav))
        try:
            pages = [browser.new_page(), browser.new_page()]
            errors: list[str] = []
            call_ids = []
            for page in pages:
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"{proxy.url}/?raw=1")
                full_before = [refused_full(s) for s in services]
                began = time.monotonic()
                call_ids.append(greeted(page))
                retried = sum(refused_full(s) - f for s, f in zip(services, full_before, strict=True))
                print(
                    f"\npage call {call_ids[-1]}: greeting heard {time.monotonic() - began:.2f} s after Call "
                    f"(offers refused by a full instance and retried by the proxy: {retried:.0f})"
                )
            # One call on each instance: the second offer could only be taken by the instance left free.
            assert sorted(c.split("-")[1] for c in call_ids) == sorted(TAGS), call_ids
            for call_id in call_ids:
                live = services[TAGS.index(call_id.split("-")[1])].get_json("/api/calls")
                assert [c["id"] for c in live] == [call_id], live

            for page, call_id in zip(pages, call_ids, strict=True):
                holder = TAGS.index(call_id.split("-")[1])
                missed = [not_found(s) for s in services]
                status = hung_up(page, call_id)
                # The DELETE went to the instance named in the id: only it can answer 200, and it alone
                # answers 404 when the browser's closing the connection ended the call first.
                grown = [not_found(s) - m for s, m in zip(services, missed, strict=True)]
                assert grown[1 - holder] == 0, grown
                assert status == 200 or (status == 404 and grown[holder] == 1), (status, grown)
                record = ended(services[holder], call_id)
                assert record["state"] == "ended" and record["ended_reason"] == "hangup", record
                assert record["transport"] == "webrtc"
                print(f"hang-up of {call_id}: DELETE answered {status} by {TAGS[holder]}")
            assert errors == []
        finally:
            browser.close()
