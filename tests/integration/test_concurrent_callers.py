"""Three callers ask three different questions at the same moment: each hears its own answer."""

from __future__ import annotations

import pytest

from parley.bench import calls
from parley.bench.service import Service


# WebRTC callers at once run in make test-all (the default suite's time budget): its media path is
# churned by tests/robustness/test_leaks.py and each WebRTC call's answer by the integration tests.
# Both in make test-all, for the default suite's margin under 12 minutes: callers at once are also
# run through Kamailio (tests/fleet: four SIP callers, four baresip phones) and over carrier streams
# (twenty callers); in make test, concurrent callers share each engine in the unit tests (test_engines_stt,
# test_engines_llm, test_vad_batching).
@pytest.mark.slow
@pytest.mark.parametrize("transport", ["webrtc", "sip"])
async def test_three_simultaneous_callers_each_get_the_reply_to_their_own_question(
    service: Service, transport: str
) -> None:
    results = await calls.measure(service.base_url, callers=3, rounds=1, service=service, transport=transport)
    rows = [r for caller in results["callers"] for r in caller["rounds"]]
    assert len(rows) == 3
    for row in rows:
        # Over SIP the question reaches Whisper as 8 kHz audio, which costs it a word now and then.
        assert row["transcript_overlap"] >= (0.6 if transport == "webrtc" else 0.5), row
        assert row["right_turn"] and row["reply"], row
    assert len({caller["call_id"] for caller in results["callers"]}) == 3
    for caller in results["callers"]:
        assert service.get_json(f"/api/calls/{caller['call_id']}")["transport"] == transport
