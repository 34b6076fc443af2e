"""Fillers, exclamations, backchannels, laughs and coughs over a reply; interruptions that must cut it.

Real models over WebRTC, the corpus of `parley bench interruption` (espeak-ng speech, a voiced cough).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from parley.bench.caller import Caller
from parley.bench.corpus import Sound
from parley.bench.interruption import speech_onset_s
from parley.bench.service import Service, metric_value
from parley.bench.speech import espeak

STORY = "tell me a story about a brave little dragon"
# The sounds are made over this greeting: it is long and always the same, where a model's story may be
# over before three sounds and their checks (about 1.5 s each) fit in.
LONG_GREETING = (
    "Hello, this is Parley, the voice assistant of the demo line. I can answer questions about the weather, "
    "recommend books and recipes, tell you stories, and help you plan a short trip. Ask me anything you "
    "like, and take your time. How can I help you today?"
)

GROUPS = {
    "fillers": (Sound("filler", "uh"), Sound("filler", "hmm"), Sound("filler", "um")),
    "exclamations": (Sound("exclamation", "oh wow"), Sound("filler", "huh"), Sound("exclamation", "ah okay")),
    "backchannels, a laugh, a cough": (
        Sound("backchannel", "uh huh"),
        Sound("laugh", "ha ha"),
        Sound("cough", "voiced cough"),
    ),
}


async def greeted(service: Service) -> Caller:
    caller = Caller(service.base_url)
    await caller.connect()
    await caller.wait_for_event("agent_done", timeout=30, turn_id="greeting")
    return caller


async def reply_playing(caller: Caller) -> tuple[float, dict[str, object]]:
    started, asked = await caller.say(espeak(STORY))
    said = await caller.wait_for_event("user_transcript", timeout=20, after=started)
    await caller.wait_for_audio(after=asked, timeout=30)
    await asyncio.sleep(0.3)
    return started, said


def playing(caller: Caller) -> bool:
    """The agent is talking: speech in the last 0.6 s (a pause between words or clauses is not the end)."""
    now = time.monotonic()
    return caller.speech_seconds_between(now - 0.6, now) > 0.1


async def playing_again(caller: Caller, timeout: float) -> None:
    """Until the agent talks again after a pause, or its greeting is over."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not playing(caller):
        if any(e["type"] == "agent_done" and e.get("turn_id") == "greeting" for _, e in caller.events):
            return
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def greeting_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The real service with the long greeting the sounds are made over."""
    log_path = tmp_path_factory.mktemp("fillers") / "parley.log"
    with Service(["--greeting", LONG_GREETING], log_path=log_path) as service:
        yield service


# Every group in make test-all: the default suite keeps this behaviour in-process
# (tests/unit/test_call_backchannel.py) and keeps its 12 minutes; `bench backchannels` measures it.
@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS)
async def test_sounds_over_the_agent_pause_it_and_it_goes_on(greeting_service: Service, group: str) -> None:
    service = greeting_service
    false_before = metric_value(service.metrics_text(), "parley_false_interruptions_total")
    caller = Caller(service.base_url)
    await caller.connect()
    try:
        started = await caller.wait_for_audio(after=0.0, timeout=30)
        await asyncio.sleep(0.5)
        spoken = 0
        for i, sound in enumerate(GROUPS[group]):
            if not playing(caller):
                break  # the reply is over: a sound now would be the caller's turn, not a backchannel
            await caller.say(sound.clip(seed=i))
            spoken += 1
            # The agent paused for the sound and goes on once Whisper has judged it (0.7-1.0 s here, more
            # on a busy machine): the next sound is made over its speech again.
            await playing_again(caller, timeout=8.0)
            await asyncio.sleep(0.5)
        done = await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
        await caller.wait_for_silence(after=time.monotonic(), hold_s=1.0, timeout=30)
        assert spoken >= 2, "the greeting ended before the sounds could be made over it"
        assert done["interrupted"] is False, [e for _, e in caller.events if e["type"] == "agent_resumed"]
        assert "How can I help you today" in done["text"]  # heard to its end, after every pause
        assert not any(e["type"] == "barge_in" for _, e in caller.events)
        turns = [e["text"] for t, e in caller.events if t > started and e["type"] == "user_transcript"]
        assert turns == [], f"a sound became a turn: {turns}"
        history = service.get_json(f"/api/calls/{caller.call_id}")["transcript"]
        assert [t["user"] for t in history if t["turn_id"] != "greeting"] == []
    finally:
        await caller.hangup()
    assert metric_value(service.metrics_text(), "parley_false_interruptions_total") > false_before


# make test-all, for the default suite's margin under 12 minutes: in make test, a caller's barge-in cuts
# the reply over WebRTC, SIP and carrier streams (test_barge_in, test_sip_call, test_carrier_streams), and
# which short sounds pause a reply rather than cut it is decided in tests/unit/test_call_backchannel.py.
@pytest.mark.slow
@pytest.mark.parametrize("words", ["no", "uh, wait", "stop"])
async def test_a_short_interruption_cuts_the_reply_and_is_answered(service: Service, words: str) -> None:
    caller = await greeted(service)
    try:
        _, said = await reply_playing(caller)
        clip = espeak(words)
        playback = caller.mic.play(clip)
        onset = await playback.started + speech_onset_s(clip)
        silent_at = await caller.wait_for_silence(after=onset, hold_s=0.5, timeout=10)
        assert silent_at - onset < 0.5, "the agent kept talking over the caller"
        cut = await caller.wait_for_event("agent_done", timeout=30, turn_id=said["turn_id"])
        assert cut["interrupted"] is True
        heard = await caller.wait_for_event("user_transcript", timeout=20, after=onset)
        assert heard["text"]  # its own turn ("No.", "Stop.", "Wait.")
        answer = await caller.wait_for_event("agent_done", timeout=60, turn_id=heard["turn_id"])
        assert answer["interrupted"] is False and answer["text"]
        assert not [e for t, e in caller.events if t > onset and e["type"] == "agent_resumed"]
    finally:
        await caller.hangup()
