"""A rolling restart under load (issue 46, item 6), run as `parley bench rolling` runs it (the bench's own
`measure`, parley/bench/rolling.py): two instances with the real models behind Kamailio (SIP) and
HAProxy (the page's calls), one PostgreSQL for their records (the bench's --database), as a fleet has.
While SIP and WebRTC callers keep calling (each call: hear the greeting, stay a few seconds, hang up),
each instance in turn is drained, waits for its calls to end, stops, and is replaced by a new one on the
same ports. No call may be dropped (every record reads "hangup": its caller ended it) and none refused.
Slow (two services, their replacements, two proxies): `make test-all`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.bench import rolling
from tests.postgres import PostgresCluster

pytestmark = pytest.mark.slow

LOAD_S = 120.0  # the callers keep calling at least this long


async def test_instances_replaced_one_by_one_under_calls_drop_and_refuse_none(
    tmp_path: Path, cluster: PostgresCluster
) -> None:
    results = await rolling.measure(
        tmp_path, instances=2, load_s=LOAD_S, sip_callers=2, page_callers=1, database=cluster.new_database()
    )
    summary = results["summary"]
    print(f"rolling restart: {json.dumps(summary)}")
    assert not results["refused"], results["refused"]
    assert not results["dropped"], results["dropped"]
    assert sum(summary["calls placed"].values()) >= 20, summary["calls placed"]
    assert all(count > 0 for count in summary["calls placed"].values()), summary["calls placed"]
    # Each old instance left cleanly once its calls had ended, and each replacement was sent calls over
    # SIP and WebRTC again by both proxies.
    assert [step["instance"] for step in results["steps"]] == ["p1", "p2"]
    for step in results["steps"]:
        assert step["drain_code"] == 0 and step["exit_code"] == 0, step
        assert step["back_in_rotation_s"] is not None, step
    assert all(taken > 0 for taken in summary["calls taken by each replacement"].values())
    assert results["ok"]
