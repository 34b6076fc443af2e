"""A Call with test engines: the whole stage chain, barge-in, reopen, and an orderly end."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from parley.call import Call
from parley.config import Settings
from tests.doubles import ScriptedLlm, ScriptedStt, loud, make_engines, quiet

RATE = 16000
FRAME = 320


class Line:
    """Plays the transport: feeds caller audio in 20 ms frames at real pace and pulls reply frames."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.events: list[dict[str, Any]] = []
        self.heard: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self.flushes = 0
        self._puller = threading.Thread(target=self._pull, daemon=True)
        call.attach(self)

    def deliver_event(self, payload: dict[str, Any]) -> None:
        self.events.append(payload)

    def audio_flushed(self) -> None:
        self.flushes += 1

    def _pull(self) -> None:
        while not self._stop.is_set():
            frame = self.call.outbound.pull_frame()
            self.heard.append((time.monotonic(), bool(frame.any())))
            time.sleep(0.02)

    def start(self) -> None:
        self._puller.start()

    def say(self, pcm: np.ndarray) -> None:
        for i in range(0, pcm.size, FRAME):
            self.call.push_audio(pcm[i : i + FRAME])
            time.sleep(0.02)

    def wait(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"events so far: {self.events}")
            time.sleep(0.01)

    def event(self, kind: str, **match: Any) -> dict[str, Any] | None:
        for e in self.events:
            if e["type"] == kind and all(e.get(k) == v for k, v in match.items()):
                return e
        return None

    def playing(self) -> bool:
        return any(sound for _, sound in self.heard[-3:])

    def stop(self) -> None:
        self._stop.set()
        self._puller.join()


@contextlib.contextmanager
def on_a_line(call: Call) -> Iterator[Line]:
    """The call started with a line playing its transport; both stopped, and the call joined, after."""
    line = Line(call)
    call.start()
    line.start()
    try:
        yield line
    finally:
        line.stop()
        call.end("test_over")
        assert call.join(5.0)


@pytest.fixture
def call_and_line() -> Iterator[tuple[Call, Line]]:
    settings = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    engines = make_engines(llm=ScriptedLlm(token_s=0.02), stt=ScriptedStt())
    call = Call("c-test", "test", settings, engines, outbound_rate=RATE)
    with on_a_line(call) as line:
        yield call, line


def test_the_caller_speaks_and_hears_a_reply(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line = call_and_line
    line.say(np.concatenate([loud(800), quiet(500)]))
    line.wait(lambda: line.event("agent_done") is not None)
    done = line.event("agent_done")
    assert done is not None and done["interrupted"] is False and "weather" in done["text"]
    assert line.event("user_transcript", text="hello there") is not None
    assert any(sound for _, sound in line.heard)
    transcript = call.details()["transcript"]
    assert transcript[0]["user"] == "hello there" and transcript[0]["agent_state"] == "committed"


def test_the_caller_interrupts_and_the_reply_stops_and_is_marked(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line = call_and_line
    call.engines.tts.seconds_per_word = 0.4  # type: ignore[attr-defined]
    line.say(np.concatenate([loud(800), quiet(400)]))
    line.wait(line.playing)
    line.say(loud(1000))
    line.wait(lambda: line.event("agent_done", interrupted=True) is not None)
    barge = line.event("barge_in")
    assert barge is not None and barge["stop_s"] < 0.2
    first = call.details()["transcript"][0]
    assert first["agent_state"] == "interrupted"
    line.say(quiet(500))
    line.wait(lambda: len(call.details()["transcript"]) == 2)


def test_a_caller_who_hangs_up_mid_reply_has_it_kept_as_far_as_it_was_heard(call_and_line) -> None:  # type: ignore[no-untyped-def]
    # Phone callers who have heard enough hang up: the record kept "agent": "" and "pending" for such a
    # reply, its heard part lost from the record and from call.ended.
    call, line = call_and_line
    call.engines.tts.seconds_per_word = 0.4  # type: ignore[attr-defined]
    line.say(np.concatenate([loud(800), quiet(400)]))
    line.wait(lambda: line.event("agent_text") is not None)
    line.wait(line.playing)
    time.sleep(0.5)  # some of it heard
    call.end("hangup")
    done = line.event("agent_done")
    assert done is not None and done["interrupted"] is True and done["text"], done
    first = call.details()["transcript"][0]
    assert first["agent_state"] == "interrupted" and first["agent"] == done["text"]


def test_a_pause_inside_the_grace_window_gives_one_reply(call_and_line) -> None:  # type: ignore[no-untyped-def]
    _, line = call_and_line
    line.say(np.concatenate([loud(600), quiet(400), loud(600), quiet(600)]))
    line.wait(lambda: line.event("agent_done") is not None)
    transcripts = [e for e in line.events if e["type"] == "user_transcript"]
    assert transcripts[-1]["revision"] == 1
    assert len([e for e in line.events if e["type"] == "agent_done"]) == 1


def test_a_slow_model_after_a_short_first_sentence_leaves_no_dead_air() -> None:
    # "Sure, that is easy." plays for 0.8 s; the next sentence takes the model 1.6 s. Spoken as a whole
    # sentence it would leave 0.8 s of silence; cut early as the audio runs dry, it follows at once.
    rest = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen."
    llm = ScriptedLlm(reply=f"Sure, that is easy. {rest}", token_s=0.1)
    settings = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    call = Call("c-dry", "test", settings, make_engines(llm=llm, stt=ScriptedStt()), outbound_rate=RATE)
    with on_a_line(call) as line:
        line.say(np.concatenate([loud(800), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None)
        sounding = [t for t, sound in line.heard if sound]
        longest_gap = max(b - a for a, b in itertools.pairwise(sounding))
        assert longest_gap < 0.4, f"{longest_gap:.2f} s of silence inside the reply"
        assert line.event("agent_done")["text"].endswith("sixteen.")  # type: ignore[index]


def test_ending_the_call_stops_every_thread() -> None:
    call = Call("c-end", "test", Settings(greeting="Hi there."), make_engines(), outbound_rate=RATE)
    before = threading.active_count()
    call.start()
    assert call.threads_alive() == 5  # VAD, STT, LLM, TTS and the backchannel check
    assert call.end("hangup") is True
    assert call.end("hangup") is False
    assert call.join(5.0)
    assert call.threads_alive() == 0
    assert threading.active_count() <= before
    assert call.details()["state"] == "ended"


def test_a_turn_is_transcribed_ahead_at_its_last_pause_and_not_again() -> None:
    stt = ScriptedStt()
    settings = Settings(greeting="", early_stt_ms=64, end_of_turn_ms=300)
    call = Call("c-early", "test", settings, make_engines(stt=stt), outbound_rate=RATE)
    with on_a_line(call) as line:
        line.say(np.concatenate([loud(800), quiet(600)]))
        line.wait(lambda: line.event("user_transcript") is not None)
        assert len(stt.calls) == 1  # the early transcription served the end of the turn


def test_a_greeting_cut_in_its_second_sentence_keeps_only_what_was_heard() -> None:
    settings = Settings(greeting="One two three. Four five six seven eight nine.")
    call = Call("c-cut", "test", settings, make_engines(), outbound_rate=RATE)
    with on_a_line(call) as line:
        line.wait(line.playing)
        time.sleep(0.9)  # the first sentence (0.6 s) is over, the second has begun
        line.say(loud(1000))
        line.wait(lambda: line.event("agent_done", interrupted=True) is not None)
        done = line.event("agent_done", interrupted=True)
        assert done is not None
        assert done["text"].startswith("One two three.") and "nine" not in done["text"]


def test_the_transport_hears_of_a_barge_in_flush(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line = call_and_line
    call.engines.tts.seconds_per_word = 0.4  # type: ignore[attr-defined]
    line.say(np.concatenate([loud(800), quiet(400)]))
    line.wait(line.playing)
    flushes = line.flushes
    line.say(loud(1000))
    line.wait(lambda: line.event("barge_in") is not None)
    assert line.flushes > flushes


def test_audio_at_the_telephone_rate_is_heard_as_speech(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line = call_and_line
    pcm = np.concatenate([loud(800, rate=8000), quiet(500, rate=8000)])
    for i in range(0, pcm.size, 160):
        call.push_audio(pcm[i : i + 160], 8000)
        time.sleep(0.02)
    line.wait(lambda: line.event("user_transcript", text="hello there") is not None)


def test_keys_pressed_become_a_turn_the_agent_answers(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line = call_and_line
    for digit in "42#":
        call.dtmf_received(digit)
    line.wait(lambda: line.event("agent_done") is not None)
    assert [e["digit"] for e in line.events if e["type"] == "dtmf"] == ["4", "2", "#"]
    said = line.event("user_transcript")
    assert said is not None and said["text"] == "[DTMF 42#]"
    prompt = call.engines.llm.prompts[-1]  # type: ignore[attr-defined]
    assert prompt[-1] == {"role": "user", "content": "[DTMF 42#]"}
    turn = call.details()["transcript"][0]
    assert turn["user"] == "[DTMF 42#]" and turn["agent_state"] == "committed"


def test_a_keypad_entry_without_hash_ends_after_the_timeout(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line = call_and_line
    call.dtmf_received("7")
    time.sleep(0.3)
    assert line.event("user_transcript") is None  # still waiting for more keys
    line.wait(lambda: line.event("user_transcript", text="[DTMF 7]") is not None, timeout=5)


def test_keys_pressed_while_the_agent_talks_stop_it(call_and_line) -> None:  # type: ignore[no-untyped-def]
    call, line = call_and_line
    call.engines.tts.seconds_per_word = 0.4  # type: ignore[attr-defined]
    line.say(np.concatenate([loud(800), quiet(400)]))
    line.wait(line.playing)
    call.dtmf_received("0")
    call.dtmf_received("#")
    line.wait(lambda: line.event("agent_done", interrupted=True) is not None)
    barge = line.event("barge_in")
    assert barge is not None and barge["by"] == "keypad"
    line.wait(lambda: line.event("user_transcript", text="[DTMF 0#]") is not None)


class CarrierLine(Line):
    """Plays a carrier's media stream: it plays what it is sent `delay_s` later, from its own buffer, and
    echoes each mark once the audio before it has played; a clear drops the buffer and echoes the marks
    still in it at once (those were never played)."""

    def __init__(self, call: Call, delay_s: float = 0.1, echo: bool = True) -> None:
        super().__init__(call)
        call.outbound.confirm_by_marks()
        self.delay_s = delay_s
        self.echo = echo
        self.pending: list[tuple[float, str]] = []
        self.lock = threading.Lock()

    def audio_flushed(self) -> None:
        super().audio_flushed()
        with self.lock:
            cleared, self.pending = self.pending, []
        for _, mark in cleared:
            assert not self.call.outbound.mark_played(mark)

    def _pull(self) -> None:
        while not self._stop.is_set():
            frame = self.call.outbound.pull_frame()
            now = time.monotonic()
            self.heard.append((now, bool(frame.any())))
            with self.lock:
                self.pending += [(now + self.delay_s, mark) for mark in self.call.outbound.take_marks()]
                due = [mark for at, mark in self.pending if at <= now]
                self.pending = [(at, mark) for at, mark in self.pending if at > now]
            for mark in due if self.echo else []:
                self.call.outbound.mark_played(mark)
            time.sleep(0.02)


def carrier_call(greeting: str, **line: Any) -> tuple[Call, CarrierLine]:
    call = Call("c-carrier", "twilio", Settings(greeting=greeting), make_engines(), outbound_rate=8000)
    carrier = CarrierLine(call, **line)
    call.start()
    carrier.start()
    return call, carrier


def test_over_a_carrier_a_reply_is_committed_once_its_last_mark_comes_back() -> None:
    call, carrier = carrier_call("Hello there.", delay_s=0.5)
    try:
        carrier.wait(lambda: carrier.event("agent_done") is not None)
        done_at = time.monotonic()
        last_sound = max(at for at, sound in carrier.heard if sound)
        assert done_at - last_sound >= 0.4  # it waited for the carrier to play it out
        done = carrier.event("agent_done")
        assert done is not None and done["text"] == "Hello there." and not done["interrupted"]
    finally:
        carrier.stop()
        call.end("test_over")
        assert call.join(5.0)


@pytest.mark.parametrize(("echo", "heard"), [(True, "One two three. Four"), (False, "One two three.")])
def test_over_a_carrier_only_audio_whose_mark_came_back_counts_as_heard(echo: bool, heard: str) -> None:
    second = "Four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen."
    call, carrier = carrier_call("One two three. " + second, echo=echo)
    try:
        carrier.wait(carrier.playing)
        time.sleep(1.2)  # the first sentence (0.6 s) has played, and its mark came back if the carrier echoes
        carrier.say(loud(1000))
        carrier.wait(lambda: carrier.event("agent_done", interrupted=True) is not None)
        done = carrier.event("agent_done", interrupted=True)
        assert done is not None and done["text"].startswith(heard) and "sixteen" not in done["text"]
        if not echo:  # without marks only the chunk the carrier was playing can have been heard
            assert done["text"] == heard
        assert carrier.flushes >= 1
    finally:
        carrier.stop()
        call.end("test_over")
        assert call.join(5.0)
