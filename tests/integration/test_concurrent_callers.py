"""Three callers ask three different questions at the same moment: each hears its own answer."""

from __future__ import annotations

from parley.bench import calls
from parley.bench.service import Service


async def test_three_simultaneous_callers_each_get_the_reply_to_their_own_question(service: Service) -> None:
    results = await calls.measure(service.base_url, callers=3, rounds=1)
    rows = [r for caller in results["callers"] for r in caller["rounds"]]
    assert len(rows) == 3
    for row in rows:
        assert row["transcript_overlap"] >= 0.6, row
        assert row["right_turn"] and row["reply"], row
    assert len({caller["call_id"] for caller in results["callers"]}) == 3
