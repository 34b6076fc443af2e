"""A rolling restart under load (issue 46, item 6): two instances with the real models behind Kamailio
(SIP) and HAProxy (the page's calls), one PostgreSQL for their records. While SIP and WebRTC callers keep
calling (each call: hear the greeting, talk a few seconds, hang up), each instance in turn is drained,
waits for its calls to end, stops, and is replaced by a new one on the same ports. No call may be
dropped (every record reads "hangup": its caller ended it) and none refused while the other instance
had room. Slow (two services, their replacements, two proxies): `make test-all`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from parley.bench.caller import Caller
from parley.bench.listening import CallFailed
from parley.bench.service import Service, metric_value
from parley.bench.sip_caller import SipCaller
from tests.fleet.conftest import instances
from tests.fleet.haproxy import HAProxy
from tests.fleet.kamailio import Kamailio
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

LOAD_S = 120.0  # the callers keep calling this long
CALL_S = 5.0  # each call lasts this long after its greeting was heard
SIP_CALLERS, PAGE_CALLERS = 2, 1


@dataclass
class Tally:
    placed: list[tuple[str, str]] = field(default_factory=list)  # (transport, call id)
    refused: list[str] = field(default_factory=list)


async def keep_calling(
    new_caller: Callable[[], Caller | SipCaller], until: float, tally: Tally, kind: str
) -> None:
    """One caller's calls, one after another, until `until`."""
    while time.monotonic() < until:
        caller = new_caller()
        try:
            await caller.connect(timeout=30)
        except (CallFailed, OSError, TimeoutError) as exc:
            tally.refused.append(f"{kind} at {time.strftime('%X')}: {exc}")
        else:
            tally.placed.append((kind, caller.call_id))
            with contextlib.suppress(TimeoutError):
                await caller.wait_for_audio(after=0.0, timeout=20)
            await asyncio.sleep(CALL_S)
        finally:
            await caller.hangup()
        await asyncio.sleep(0.5)


def drain(service: Service) -> None:
    request = urllib.request.Request(
        f"{service.base_url}/api/drain", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def live_calls(service: Service) -> list[dict[str, object]]:
    calls: list[dict[str, object]] = service.get_json("/api/calls")
    return calls


async def replace(
    services: list[Service], index: int, folder: Path, args: list[str], env: dict[str, str]
) -> dict[str, float]:
    """Drain the instance, let its calls end, stop it, start a new one on its ports; how long each took."""
    old = services[index]
    began = time.monotonic()
    await asyncio.to_thread(drain, old)
    while await asyncio.to_thread(live_calls, old):
        await asyncio.sleep(0.5)
    drained = time.monotonic()
    assert await asyncio.to_thread(old.stop) == 0
    new = Service(args, env=env, log_path=folder / f"parley-{index}-new.log", ports=(old.port, old.sip_port))
    await asyncio.to_thread(new.start)
    services[index] = new
    return {"drained_s": round(drained - began, 1), "replaced_s": round(time.monotonic() - drained, 1)}


async def test_instances_replaced_one_by_one_under_calls_drop_and_refuse_none(
    tmp_path: Path, cluster: PostgresCluster
) -> None:
    database = cluster.new_database()
    args = [["--instance-tag", tag, "--trusted-proxies", "127.0.0.1"] for tag in ("p1", "p2")]
    env: dict[str, str] = {}
    with (
        instances(tmp_path, database, args, env) as services,
        Kamailio(tmp_path, [s.sip_port for s in services]) as kamailio,
        HAProxy(tmp_path, [s.port for s in services]) as haproxy,
    ):
        sip_uri = f"sip:parley@127.0.0.1:{kamailio.port}"
        tally = Tally()
        until = time.monotonic() + LOAD_S
        callers = [
            *(
                keep_calling(lambda: SipCaller(haproxy.url, sip_uri), until, tally, "sip")
                for _ in range(SIP_CALLERS)
            ),
            *(keep_calling(lambda: Caller(haproxy.url), until, tally, "webrtc") for _ in range(PAGE_CALLERS)),
        ]
        load = asyncio.gather(*callers)
        await asyncio.sleep(15)
        steps = []
        for index in range(len(services)):
            steps.append(
                await replace(services, index, tmp_path, ["--database", database, *args[index]], env)
            )
            await asyncio.sleep(10)
        await load

        outcomes: dict[str, str] = {}
        for _, call_id in tally.placed:
            record = await asyncio.to_thread(services[0].get_json, f"/api/calls/{call_id}")
            outcomes[call_id] = str(record.get("ended_reason"))
        dropped = {c: o for c, o in outcomes.items() if o != "hangup"}
        by_kind = {kind: sum(k == kind for k, _ in tally.placed) for kind in ("sip", "webrtc")}
        print(
            f"rolling restart: {len(tally.placed)} calls {by_kind}, {len(dropped)} dropped, "
            f"{len(tally.refused)} refused; steps {json.dumps(steps)}"
        )
        assert not tally.refused, tally.refused
        assert not dropped, dropped
        assert len(tally.placed) >= 20
        # The new instances took calls too (their counters started at zero).
        taken = [metric_value(s.metrics_text(), "parley_calls_total") for s in services]
        assert all(count > 0 for count in taken), taken
