"""The hold sound while a tool runs (agent/hold_sound.py, the Outbound's loop, the LLM stage's wait): the
file checked when the agent file is read, the loop under the reply, and in a call the clip's samples in
what the transport pulls while the tool runs, gone within a frame or two of its result."""

from __future__ import annotations

import threading
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parley.agent.agentfile import AgentFileError, load_agent_file
from parley.agent.hold_sound import HoldSoundError, load_hold_sound
from parley.agent.tools import ToolRunner
from parley.call import Call
from parley.config import Settings
from parley.engines.toolcalls import ToolCall
from parley.pipeline.messages import AudioChunk
from tests import agent_tools
from tests.doubles import ScriptedLlm, ScriptedStt, loud, make_engines, quiet
from tests.unit.test_agent_call import SLOW, agent
from tests.unit.test_replies import FRAME, RATE, make

CLIP_HZ = 1000.0  # the hold sound; the test TTS speaks at 440 Hz, the test caller at 200 Hz


def tone(rate: int, seconds: float, hz: float = CLIP_HZ, level: float = 6000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * hz * t) * level).astype(np.int16)


def write_wav(path: Path, pcm: np.ndarray, rate: int, *, channels: int = 1, width: int = 2) -> Path:
    samples = np.repeat(pcm, channels)
    if width == 1:
        data = ((samples.astype(np.int32) >> 8) + 128).astype(np.uint8).tobytes()
    elif width == 3:
        wide = samples.astype("<i4") << 8
        data = b"".join(v.to_bytes(4, "little", signed=True)[:3] for v in wide.tolist())
    else:
        data = samples.astype("<i2").tobytes()
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(data)
    return path


# the file


@pytest.mark.parametrize(("channels", "width"), [(1, 2), (2, 2), (1, 1), (2, 3)])
def test_a_wav_clip_loads_as_mono_16_bit_whatever_its_layout(
    tmp_path: Path, channels: int, width: int
) -> None:
    pcm = tone(8000, 0.5)
    sound = load_hold_sound(write_wav(tmp_path / "hold.wav", pcm, 8000, channels=channels, width=width))
    assert sound.rate == 8000 and sound.pcm.dtype == np.int16 and sound.pcm.size == pcm.size
    assert np.abs(sound.pcm.astype(np.int32) - pcm).max() <= 256  # 8-bit keeps the top byte only


def test_a_clip_is_resampled_once_per_rate_a_call_plays_it_at(tmp_path: Path) -> None:
    sound = load_hold_sound(write_wav(tmp_path / "hold.wav", tone(8000, 0.5), 8000))
    at_48k = sound.at(48000)
    assert abs(at_48k.size - 24000) <= 2 and sound.at(48000) is at_48k
    spectrum = np.abs(np.fft.rfft(at_48k.astype(np.float64)))
    assert abs(np.argmax(spectrum) * 48000 / at_48k.size - CLIP_HZ) < 10  # still the same tone


@pytest.mark.parametrize(
    ("make_file", "words"),
    [
        (lambda p: p, "no such file"),
        (lambda p: (p.write_bytes(b"RIFF....WAVEjunk"), p)[1], "not a WAV file"),
        (lambda p: write_wav(p, tone(8000, 0.5), 4000), "4000 Hz"),
        (lambda p: write_wav(p, tone(8000, 0.02), 8000), "lasts 0.02 s"),
        (lambda p: write_wav(p, tone(8000, 31.0), 8000), "lasts 31.00 s"),
        (lambda p: write_wav(p, np.zeros(8000, dtype=np.int16), 8000), "silent"),
    ],
)
def test_a_clip_that_cannot_be_played_is_refused_saying_why(
    tmp_path: Path, make_file: Callable[[Path], Path], words: str
) -> None:
    with pytest.raises(HoldSoundError, match=words):
        load_hold_sound(make_file(tmp_path / "hold.wav"))


def test_the_agent_file_reads_its_hold_sound_beside_it_and_names_a_bad_one(tmp_path: Path) -> None:
    folder = tmp_path / "agents"
    folder.mkdir()
    write_wav(folder / "hold.wav", tone(16000, 0.5), 16000)
    good = folder / "desk.toml"
    good.write_text('system_prompt = "Help."\nhold_sound = "hold.wav"\n')
    loaded = load_agent_file(good).hold_sound
    assert loaded is not None and loaded.path == str(folder / "hold.wav") and loaded.rate == 16000
    bad = folder / "bad.toml"
    bad.write_text('system_prompt = "Help."\n\nhold_sound = "missing.wav"\n')
    with pytest.raises(AgentFileError, match=r"bad\.toml, line 3: hold_sound .*missing\.wav.*no such file"):
        load_agent_file(bad)
    assert load_agent_file(folder / "desk.toml").hold_sound is not None
    none = folder / "none.toml"
    none.write_text('system_prompt = "Help."\n')
    assert load_agent_file(none).hold_sound is None


# the Outbound's loop


def frames(replies: Any, count: int) -> list[np.ndarray]:
    return [replies.outbound.pull_frame().copy() for _ in range(count)]


def test_the_loop_fills_what_the_reply_leaves_and_wraps_around() -> None:
    replies, _, events, _ = make()
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    clip = np.arange(1, FRAME * 3 // 2 + 1, dtype=np.int16)  # a frame and a half, never zero
    words = np.full(FRAME * 2, -7, dtype=np.int16)
    replies.outbound.push(AudioChunk(response, words, "Let me check."))
    replies.outbound.loop(response.tag, clip)
    pulled = np.concatenate(frames(replies, 5))
    assert (pulled[: FRAME * 2] == -7).all()  # the reply's words first
    looped = pulled[FRAME * 2 :]
    assert np.array_equal(looped, np.tile(clip, 2))  # then the clip, again and again
    assert not replies.outbound.has_audio()  # nothing of the reply waits
    assert response.played_segments == ["Let me check."]  # the loop has no words
    assert [e["text"] for e in events if e["type"] == "agent_text"] == ["Let me check."]


def test_a_stopped_or_flushed_or_paused_loop_is_silent_from_the_next_frame() -> None:
    replies, _, _, _ = make()
    response = replies.start("c-1:turn-1", 0, speech_end=0.0)
    clip = np.full(FRAME * 10, 500, dtype=np.int16)
    replies.outbound.loop(response.tag, clip)
    assert frames(replies, 1)[0].all()
    replies.pause()
    assert not frames(replies, 1)[0].any()
    replies.resume()
    assert frames(replies, 1)[0].all()  # a backchannel: it goes on
    replies.outbound.stop_loop()
    assert not frames(replies, 1)[0].any()
    replies.outbound.loop(response.tag, clip)
    replies.interrupt()  # the caller took the turn: flushed with the reply
    assert not replies.outbound.looping and not frames(replies, 1)[0].any()


def test_a_loop_plays_only_when_its_reply_may_and_ends_when_that_went_stale() -> None:
    replies, _, _, _ = make()
    draft = replies.start_draft("c-1:turn-1", 0, speech_end=1.0)  # the turn may go on: held at the gate
    replies.outbound.loop(draft.tag, np.full(FRAME, 500, dtype=np.int16))
    assert not frames(replies, 1)[0].any() and replies.outbound.looping
    assert replies.adopt("c-1:turn-1", 0, speech_end=1.0) is not None  # the turn ended there
    assert frames(replies, 1)[0].all()
    replies.scope.cancel()  # the reply went stale (a reopened turn, the call's end)
    assert not frames(replies, 1)[0].any() and not replies.outbound.looping


# in a call


class Ears:
    """The transport's side: pulls a frame every 20 ms and keeps each with when it was pulled; hears the
    call's events with when they came."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.frames: list[tuple[float, np.ndarray]] = []
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pull, daemon=True)
        call.attach(self)

    def deliver_event(self, payload: dict[str, Any]) -> None:
        self.events.append((time.monotonic(), payload))

    def audio_flushed(self) -> None:
        pass

    def _pull(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.frames.append((time.monotonic(), self.call.outbound.pull_frame().copy()))
            next_at += 0.02
            time.sleep(max(0.0, next_at - time.monotonic()))

    def say(self, pcm: np.ndarray) -> None:
        for i in range(0, pcm.size, 320):
            self.call.push_audio(pcm[i : i + 320])
            time.sleep(0.02)

    def first(self, kind: str, **match: Any) -> float | None:
        for at, e in self.events:
            if e["type"] == kind and all(e.get(k) == v for k, v in match.items()):
                return at
        return None

    def wait(self, predicate: Callable[[], object], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, [e for _, e in self.events]
            time.sleep(0.01)

    def clip_frames(self) -> list[float]:
        """When each frame carrying the clip (1 kHz the loudest) was pulled."""
        found = []
        for at, frame in self.frames:
            if frame.any():
                spectrum = np.abs(np.fft.rfft(frame.astype(np.float64)))
                if abs(np.argmax(spectrum) * RATE / frame.size - CLIP_HZ) < 60:
                    found.append(at)
        return found

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def start_call(tmp_path: Path, **agent_fields: Any) -> tuple[Call, Ears]:
    sound = load_hold_sound(write_wav(tmp_path / "hold.wav", tone(16000, 0.3), 16000))
    script: list[list[str | ToolCall]] = [
        [ToolCall("call_1", "slow_lookup", '{"number": "7"}')],
        ["It ", "is ", "delayed."],
    ]
    settings = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    engines = make_engines(llm=ScriptedLlm(token_s=0.01, script=script), stt=ScriptedStt())
    the_agent = agent(tools=(SLOW,), hold_after_ms=300, hold_sound=sound, **agent_fields)
    call = Call("c-hold", "test", settings, engines, RATE, the_agent, tool_runner=ToolRunner())
    ears = Ears(call)
    call.start()
    ears.start()
    return call, ears


def finish(call: Call, ears: Ears) -> None:
    ears.stop()
    call.end("test_over")
    assert call.join(5.0)
    assert call.tool_runner is not None
    call.tool_runner.close()


@pytest.fixture(autouse=True)
def fresh_calls() -> None:
    agent_tools.CALLS.clear()


def test_the_clip_plays_after_the_hold_phrase_while_the_tool_runs_and_stops_at_its_result(
    tmp_path: Path,
) -> None:
    call, ears = start_call(tmp_path, hold_phrase="One moment.")
    try:
        ears.say(np.concatenate([loud(800), quiet(500)]))
        ears.wait(lambda: ears.first("agent_done"), timeout=20)
        result_at = ears.first("tool_result")
        phrase_at = ears.first("agent_text", text="One moment.")
        assert result_at is not None and phrase_at is not None
        clip = ears.clip_frames()
        # The clip ran while the tool did (1.5 s, the hold from 0.3 s, the phrase 0.4 s first)...
        during = [at for at in clip if phrase_at < at < result_at]
        assert len(during) >= 20, len(during)
        assert min(clip) > phrase_at + 0.3  # ...after the phrase's words, not over them
        # ...and is gone within two frames of the result (pulled up to 20 ms apart).
        assert max(clip) <= result_at + 0.05, max(clip) - result_at
        done = next(e for _, e in ears.events if e["type"] == "agent_done")
        assert done["text"] == "One moment. It is delayed." and not done["interrupted"]
    finally:
        finish(call, ears)


def test_the_clip_alone_when_there_is_no_hold_phrase_and_the_callers_speech_stops_it(
    tmp_path: Path,
) -> None:
    call, ears = start_call(tmp_path)
    try:
        ears.say(np.concatenate([loud(800), quiet(500)]))
        ears.wait(lambda: len(ears.clip_frames()) >= 10)
        spoke_at = time.monotonic()
        ears.say(loud(1200))  # the caller talks over it
        ears.wait(lambda: ears.first("agent_done", interrupted=True))
        paused_at = ears.first("agent_paused")
        assert paused_at is not None and paused_at > spoke_at
        clip = ears.clip_frames()
        assert max(clip) <= paused_at + 0.05  # the pause silences it at once; the barge-in drops it
        done = next(e for _, e in ears.events if e["type"] == "agent_done")
        assert done["text"] == ""  # no words were heard: the clip is none
        ears.wait(lambda: agent_tools.CALLS, timeout=5)
    finally:
        finish(call, ears)
