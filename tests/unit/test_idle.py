"""Idle callers (idle.py): when a quiet caller is prompted, how often, when the call is closed, and what
starts the count again. Items in, decisions out: events and clock readings are handed in, nothing sleeps.
The closing line's hang-up is the replies' (replies.py), pulled by hand here too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parley import metrics
from parley.agent.agentfile import Agent, AgentFileError, load_agent_file
from parley.agent.variables import Variables
from parley.call_signals import CallSignals, CallState
from parley.config import Settings, SettingsError
from parley.idle import IdleCaller, IdlePolicy, IdlePrompts
from parley.pipeline.messages import AudioChunk, EndOfResponse
from parley.registry import CallRegistry
from parley.settings_sources import load_settings
from parley.watchdog import CallWatchdog
from tests.unit.test_config import parse
from tests.unit.test_replies import FRAME, HangUps, make, pull

POLICY = IdlePolicy(after_s=8.0, prompts=2, prompt="Are you still there?", closing="Goodbye.")


def state(name: CallState) -> dict[str, Any]:
    return {"type": "state", "state": name}


def lines_due(caller: IdleCaller, start: float, end: float, step: float = 0.5) -> list[tuple[float, str]]:
    """What `due` says on a clock ticking every `step` from `start` to `end`, the agent never speaking."""
    said: list[tuple[float, str]] = []
    now = start
    while now <= end:
        line = caller.due(now)
        if line is not None:
            said.append((now, line))
        now += step
    return said


def test_a_silent_caller_is_prompted_twice_then_closed_and_nothing_follows() -> None:
    caller = IdleCaller(POLICY, listening_since=None)
    caller.heard(state("listening"), 100.0)
    said: list[tuple[float, str]] = []
    now = 100.0
    while now < 200.0:
        line = caller.due(now)
        if line is not None:
            said.append((now, line))
            # The line plays for 1.5 s: the call speaks, then listens again.
            caller.heard(state("agent_speaking"), now + 0.3)
            caller.heard(state("listening"), now + 1.8)
        now += 0.5
    # Each wait starts when the call listens again after the line (1.8 s after it was due).
    assert said == [(108.0, "prompt"), (118.0, "prompt"), (128.0, "closing")]
    assert caller.lines == 3


def test_nothing_is_due_while_the_agent_talks_or_thinks_or_the_caller_speaks() -> None:
    for busy in ("agent_speaking", "thinking", "user_speaking", "starting", "ringing"):
        caller = IdleCaller(POLICY, listening_since=0.0)
        caller.heard(state(busy), 1.0)  # type: ignore[arg-type]
        assert lines_due(caller, 1.0, 60.0) == [], busy


def test_the_wait_counts_from_when_the_call_last_began_listening() -> None:
    caller = IdleCaller(POLICY, listening_since=0.0)
    caller.heard(state("thinking"), 5.0)
    caller.heard(state("agent_speaking"), 6.0)
    caller.heard(state("listening"), 9.0)
    assert caller.due(16.5) is None
    assert caller.due(17.0) == "prompt"


@pytest.mark.parametrize(
    "activity",
    [
        state("user_speaking"),
        {"type": "dtmf", "digit": "5"},
        {"type": "user_transcript", "text": "yes"},
        {"type": "agent_paused", "paused_at": 0.0},
    ],
)
def test_speech_or_a_keypress_starts_the_count_again(activity: dict[str, Any]) -> None:
    caller = IdleCaller(POLICY, listening_since=0.0)
    assert caller.due(8.0) == "prompt"
    caller.heard(state("agent_speaking"), 8.2)
    caller.heard(state("listening"), 9.0)
    assert caller.due(17.0) == "prompt"
    caller.heard(activity, 17.5)
    caller.heard(state("listening"), 18.0)
    # Two prompts again before the closing, counted from the caller's activity.
    assert [line for _, line in lines_due(caller, 18.0, 60.0, step=8.0)] == ["prompt", "prompt", "closing"]


def test_a_caller_who_speaks_over_the_closing_keeps_the_call() -> None:
    caller = IdleCaller(IdlePolicy(2.0, 0, "Still there?", "Bye."), listening_since=0.0)
    assert caller.due(2.0) == "closing"
    assert caller.due(10.0) is None  # the closing was said: nothing more
    caller.heard(state("agent_speaking"), 2.1)
    caller.heard(state("user_speaking"), 2.5)  # over the closing: the replies cut it, no hang-up
    caller.heard(state("listening"), 4.0)
    assert caller.due(6.0) == "closing"  # no prompts asked for: the closing again, after a new wait


def test_a_line_that_never_plays_is_not_said_again_on_every_tick() -> None:
    caller = IdleCaller(POLICY, listening_since=0.0)
    assert lines_due(caller, 0.0, 20.0) == [(8.0, "prompt"), (16.0, "prompt")]


def test_the_policy_is_the_agents_own_or_the_services_and_zero_is_off() -> None:
    plain = Agent(name="a", system_prompt="Help.")
    closing = "I'll hang up now. Goodbye."
    assert IdlePolicy.of(plain, 0.0) is None
    assert IdlePolicy.of(plain, 10.0) == IdlePolicy(10.0, 2, "Are you still there?", closing)
    own = Agent(name="b", system_prompt="Help.", idle_prompt_after_s=4.0, idle_prompts=1, idle_prompt="Hi?")
    assert IdlePolicy.of(own, 0.0) == IdlePolicy(4.0, 1, "Hi?", closing)
    quiet = Agent(name="c", system_prompt="Help.", idle_prompt_after_s=0.0)
    assert IdlePolicy.of(quiet, 10.0) is None


class Speaker:
    def __init__(self, fail: bool = False) -> None:
        self.said: list[tuple[str, str | None, str]] = []
        self.fail = fail

    def say(self, text: str, *, key: str | None = None, then_hang_up: str = "") -> None:
        if self.fail:
            raise RuntimeError("the TTS inbox is gone")
        self.said.append((text, key, then_hang_up))


class FakeCall:
    """What IdlePrompts needs of a call: real signals, a recording speaker, the agent, its variables."""

    def __init__(self, call_id: str, agent: Agent, speaker: Speaker | None = None) -> None:
        self.call_id = call_id
        self.agent = agent
        self.signals = CallSignals(call_id)
        self.replies = speaker or Speaker()

    def variables(self) -> Variables:
        return Variables({"caller": "+15550001111"})


AGENT = Agent(
    name="desk",
    system_prompt="Help.",
    idle_prompt_after_s=5.0,
    idle_prompt="Are you still there, {caller}?",
    idle_closing="Goodbye {caller}.",
)


def counted(line: str) -> float:
    return metrics.REGISTRY.get_sample_value("parley_idle_prompts_total", {"type": line}) or 0.0


def test_the_prompts_speak_through_the_calls_replies_templated_each_line_under_its_own_key() -> None:
    clock = [0.0]
    prompts = IdlePrompts(default_after_s=0.0, clock=lambda: clock[0])
    call = FakeCall("c-1", AGENT)
    before = counted("prompt"), counted("closing")
    prompts.call_added(call)
    call.signals.set_state("listening")
    for now in (4.5, 5.0, 5.5):
        prompts.tick(now)
    assert call.replies.said == [("Are you still there, +15550001111?", "idle-1", "")]
    clock[0] = 6.0
    call.signals.set_state("agent_speaking")
    clock[0] = 7.0
    call.signals.set_state("listening")
    prompts.tick(12.0)
    clock[0] = 12.5
    call.signals.set_state("agent_speaking")
    clock[0] = 13.0
    call.signals.set_state("listening")
    prompts.tick(18.0)
    assert [s[1:] for s in call.replies.said] == [("idle-1", ""), ("idle-2", ""), ("idle-3", "idle")]
    assert call.replies.said[-1][0] == "Goodbye +15550001111."
    assert (counted("prompt"), counted("closing")) == (before[0] + 2, before[1] + 1)


def test_agents_without_idle_prompts_are_not_watched_and_an_ended_call_is_forgotten() -> None:
    prompts = IdlePrompts(default_after_s=0.0)
    quiet = FakeCall("c-quiet", Agent(name="q", system_prompt="Help."))
    prompts.call_added(quiet)
    quiet.signals.set_state("listening")
    prompts.tick(1e9)
    assert quiet.replies.said == []
    assert quiet.signals._watchers == []

    watched = FakeCall("c-watched", AGENT)
    watched.signals.set_state("listening")  # already listening when added: the wait starts then
    prompts.call_added(watched)
    prompts.call_ended(watched)
    assert watched.signals._watchers == []
    prompts.tick(1e9)
    assert watched.replies.said == []


def test_a_call_whose_line_fails_leaves_the_others_prompted(caplog: pytest.LogCaptureFixture) -> None:
    prompts = IdlePrompts(default_after_s=0.0, clock=lambda: 0.0)
    broken = FakeCall("c-broken", AGENT, Speaker(fail=True))
    fine = FakeCall("c-fine", AGENT)
    for call in (broken, fine):
        prompts.call_added(call)
        call.signals.set_state("listening")
    prompts.tick(5.0)
    assert [s[1] for s in fine.replies.said] == ["idle-1"]
    assert "idle_prompt_failed" in [r.getMessage() for r in caplog.records]


def test_the_watchdog_ticks_its_clocked_parts_even_with_its_own_limits_off() -> None:
    ticks: list[float] = []

    class Part:
        def tick(self, now: float) -> None:
            ticks.append(now)

    class Broken:
        def tick(self, now: float) -> None:
            raise RuntimeError("boom")

    dog = CallWatchdog(CallRegistry(4), max_call_s=0, max_silence_s=0, clocked=(Broken(), Part()))
    dog.tick(3.0, 1000.0)
    assert ticks == [3.0]  # a failing part does not keep the next from its tick


# the closing line's hang-up (replies.py)


def test_a_closing_line_hangs_up_with_its_reason_once_heard() -> None:
    line = HangUps()
    replies, inboxes, _, conversation = make(line=line)
    replies.say("I'll hang up now.", key="idle-3", then_hang_up="idle")
    response = inboxes.spoken[0].response
    replies.outbound.push(AudioChunk(response, np.full(FRAME * 2, 100, dtype=np.int16), "I'll hang up now."))
    replies.outbound.push(EndOfResponse(response))
    pull(replies, 1)
    assert line.reasons == []
    pull(replies, 2)
    assert line.reasons == ["idle"]
    record = conversation.snapshot()[-1]
    assert record["turn_id"] == "idle-3" and record["agent"] == "I'll hang up now." and record["user"] == ""


def test_a_closing_line_the_caller_cuts_leaves_the_call_up() -> None:
    line = HangUps()
    replies, inboxes, _, conversation = make(line=line)
    replies.say("I'll hang up now. Goodbye.", key="idle-3", then_hang_up="idle")
    response = inboxes.spoken[0].response
    pcm = np.full(FRAME * 4, 100, dtype=np.int16)
    replies.outbound.push(AudioChunk(response, pcm, "I'll hang up now. Goodbye."))
    replies.outbound.push(EndOfResponse(response))
    pull(replies, 2)
    replies.interrupt()  # "I'm here!"
    pull(replies, 4)
    assert line.reasons == []
    assert conversation.snapshot()[-1]["agent_state"] == "interrupted"
    # The next reply the caller hears does not hang up either: the closing's hang-up went with it.
    answer = replies.start("c-1:turn-1", 0, speech_end=0.0)
    replies.outbound.push(AudioChunk(answer, np.full(FRAME, 100, dtype=np.int16), "Good."))
    replies.outbound.push(EndOfResponse(answer))
    pull(replies, 3)
    assert line.reasons == []


def test_an_idle_line_keeps_the_greeting_in_the_history() -> None:
    replies, inboxes, _, conversation = make()
    for text, key in (("Hello.", None), ("Are you still there?", "idle-1")):
        replies.say(text, key=key)
        response = inboxes.spoken[-2].response
        replies.outbound.push(AudioChunk(response, np.full(FRAME, 100, dtype=np.int16), text))
        replies.outbound.push(EndOfResponse(response))
        pull(replies, 2)
    assert [(t["turn_id"], t["agent"]) for t in conversation.snapshot()] == [
        ("greeting", "Hello."),
        ("idle-1", "Are you still there?"),
    ]


# the agent file and the setting


def test_an_agent_file_sets_its_idle_prompting_and_a_bad_value_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "desk.toml"
    path.write_text(
        'system_prompt = "Help."\nidle_prompt_after_s = 7.5\nidle_prompts = 1\n'
        'idle_prompt = "Hello, {caller}?"\nidle_closing = "Bye."\n'
    )
    desk = load_agent_file(path)
    assert (desk.idle_prompt_after_s, desk.idle_prompts, desk.idle_prompt, desk.idle_closing) == (
        7.5,
        1,
        "Hello, {caller}?",
        "Bye.",
    )
    path.write_text('system_prompt = "Help."\n')
    plain = load_agent_file(path)
    assert plain.idle_prompt_after_s is None and plain.idle_prompts == 2  # the service's wait, two prompts
    for line, words in (
        ("idle_prompt_after_s = -1", "idle_prompt_after_s must be seconds"),
        ("idle_prompt_after_s = true", "idle_prompt_after_s must be seconds"),
        ("idle_prompt_after_s = 601", "idle_prompt_after_s must be seconds"),
        ("idle_prompts = 1.5", "idle_prompts must be an integer"),
        ("idle_prompts = 11", "idle_prompts must be an integer"),
        ('idle_prompt = "  "', "idle_prompt must say something"),
        ("idle_closing = 3", "idle_closing must be a string"),
    ):
        path.write_text(f'system_prompt = "Help."\n\n{line}\n')
        with pytest.raises(AgentFileError, match=rf"desk\.toml, line 3: {words}"):
            load_agent_file(path)


def test_the_service_wide_wait_is_a_setting_and_off_by_default() -> None:
    assert Settings().idle_prompt_after_s == 0
    assert load_settings(parse("--idle-prompt-after-s", "10"), environ={}).idle_prompt_after_s == 10
    assert load_settings(parse(), environ={"PARLEY_IDLE_PROMPT_AFTER_S": "12"}).idle_prompt_after_s == 12
    with pytest.raises(SettingsError, match="idle_prompt_after_s must be 0 or more"):
        load_settings(parse("--idle-prompt-after-s", "-1"), environ={})
