"""Test doubles for the engines: fast, deterministic, in tests only (the service runs real models)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from parley.engines import Engines
from parley.engines.llm import Calls, Message, allows
from parley.engines.stt import SttCancelled, Transcription
from parley.engines.toolcalls import ToolCall

TONE_RATE = 16000


class LoudnessVadStream:
    """Speech = loud: probability 1.0 for chunks above an RMS level, 0.0 otherwise."""

    def __init__(self, level: float = 500.0) -> None:
        self.level = level

    def probability(self, chunk: np.ndarray) -> float:
        rms = float(np.sqrt(np.mean(chunk.astype(np.float64) ** 2))) if chunk.size else 0.0
        return 1.0 if rms > self.level else 0.0

    def reset(self) -> None:
        pass


class LoudnessVad:
    sample_rate = 16000
    chunk_samples = 512

    def new_stream(self) -> LoudnessVadStream:
        return LoudnessVadStream()

    def probabilities(self, pairs: Sequence[tuple[Any, np.ndarray]]) -> list[float]:
        return [stream.probability(chunk) for stream, chunk in pairs]


class ScriptedStt:
    """Answers `text_for(duration_s)`, with `odds` for the words it is asked to weigh; records what it
    was asked."""

    def __init__(
        self,
        text_for: Callable[[float], str] | None = None,
        delay_s: float = 0.0,
        odds: dict[str, float] | None = None,
    ) -> None:
        self.text_for = text_for or (lambda seconds: "hello there" if seconds > 0.25 else "")
        self.delay_s = delay_s
        self.odds = odds or {}
        self.calls: list[float] = []
        self.weighed: list[tuple[str, ...]] = []

    def transcribe(
        self,
        audio: np.ndarray,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
        weigh: tuple[str, ...] = (),
    ) -> Transcription:
        if wanted is not None and not wanted():
            raise SttCancelled("no longer wanted")
        seconds = audio.size / 16000
        self.calls.append(seconds)
        self.weighed.append(weigh)
        time.sleep(self.delay_s)
        weighed = {word: self.odds.get(word, 0.0) for word in weigh}
        return Transcription(self.text_for(seconds), 0.0, self.delay_s, weighed=weighed)


class ScriptedLlm:
    """Streams a fixed reply word by word, one word per `token_s` (the first after `first_token_s` more:
    a loaded machine); remembers the prompts and the tools it was offered. With `script`, each model turn
    plays the next entry instead: words, and ToolCalls that it asks for (the last entry repeats)."""

    def __init__(
        self,
        reply: str = "Sure, the weather is fine today. Anything else?",
        token_s: float = 0.01,
        script: list[list[str | ToolCall]] | None = None,
        first_token_s: float = 0.0,
    ):
        self.reply = reply
        self.token_s = token_s
        self.first_token_s = first_token_s
        self.script = script
        self.prompts: list[list[Message]] = []
        self.offered: list[list[str]] = []
        self.calls_allowed: list[Calls] = []  # per prompt: the tools the reply could (or must) call
        self.stopped = threading.Event()

    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: list[dict[str, Any]] | None = None,
        *,
        calls: Calls = True,
    ) -> Iterator[str | ToolCall]:
        self.prompts.append(messages)
        self.calls_allowed.append(calls)
        self.offered.append([t["function"]["name"] for t in tools or []])
        if self.script is not None:
            turn = self.script[min(len(self.prompts) - 1, len(self.script) - 1)]
        else:
            turn = [word + " " for word in self.reply.split(" ")]
        ready_at = time.monotonic() + self.first_token_s
        while time.monotonic() < ready_at:  # thinking, and stopping early when told to
            if should_stop():
                self.stopped.set()
                return
            time.sleep(0.01)
        for item in turn:
            if should_stop():
                self.stopped.set()
                return
            time.sleep(self.token_s)
            if isinstance(item, ToolCall) and not (tools and allows(calls, item)):
                continue  # not offered tools, or told not to use this one: a model could not ask for it
            yield item


class ToneTts:
    """A 440 Hz tone, `seconds_per_word` long per word, in chunks of `chunk_s`."""

    sample_rate = TONE_RATE

    def __init__(self, seconds_per_word: float = 0.2) -> None:
        self.seconds_per_word = seconds_per_word

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        n = int(self.sample_rate * self.seconds_per_word * max(1, len(text.split())))
        t = np.arange(n) / self.sample_rate
        yield (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)


def make_engines(**overrides: object) -> Engines:
    parts: dict[str, object] = {
        "vad": LoudnessVad(),
        "stt": ScriptedStt(),
        "llm": ScriptedLlm(),
        "tts": ToneTts(),
    }
    parts.update(overrides)
    return Engines(**parts)  # type: ignore[arg-type]


def loud(ms: float, rate: int = 16000) -> np.ndarray:
    """Audio the LoudnessVad calls speech."""
    n = int(rate * ms / 1000)
    t = np.arange(n) / rate
    return (np.sin(2 * np.pi * 200 * t) * 6000).astype(np.int16)


def quiet(ms: float, rate: int = 16000) -> np.ndarray:
    return np.zeros(int(rate * ms / 1000), dtype=np.int16)


class Fault:
    """How an engine double misbehaves, and on which of its calls (counted from 1): "raise" an error, or
    "hang" until `release()` (a model that never returns). Shared by the faulty doubles below."""

    def __init__(self, how: str = "raise", when: Callable[[int], bool] = lambda n: True) -> None:
        assert how in ("raise", "hang")
        self.how = how
        self.when = when
        self.calls = 0
        self.struck = 0
        self._released = threading.Event()
        self._lock = threading.Lock()

    def strike(self, engine: str) -> None:
        """Called by a double as its work begins: raises, hangs, or lets the work go on."""
        with self._lock:
            self.calls += 1
            if not self.when(self.calls):
                return
            self.struck += 1
        if self.how == "raise":
            raise RuntimeError(f"{engine} failed (injected)")
        self._released.wait()

    def release(self) -> None:
        self._released.set()


class FaultyStt(ScriptedStt):
    def __init__(self, fault: Fault, **options: Any) -> None:
        super().__init__(**options)
        self.fault = fault

    def transcribe(
        self,
        audio: np.ndarray,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
        weigh: tuple[str, ...] = (),
    ) -> Transcription:
        self.fault.strike("stt")
        return super().transcribe(audio, urgent=urgent, wanted=wanted, weigh=weigh)


class FaultyLlm(ScriptedLlm):
    def __init__(self, fault: Fault, **options: Any) -> None:
        super().__init__(**options)
        self.fault = fault

    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: list[dict[str, Any]] | None = None,
        *,
        calls: bool = True,
    ) -> Iterator[str | ToolCall]:
        self.fault.strike("llm")
        yield from super().stream(messages, should_stop, tools, calls=calls)


class FaultyTts(ToneTts):
    def __init__(self, fault: Fault, **options: Any) -> None:
        super().__init__(**options)
        self.fault = fault

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        self.fault.strike("tts")
        yield from super().synthesize(text)


class CountingTts(ToneTts):
    """A ToneTts that remembers what it was asked to say."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.said: list[str] = []

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        self.said.append(text)
        yield from super().synthesize(text)


class FixedTurnEnd:
    """An end-of-turn model that always gives the same probability."""

    device = "cpu"

    def __init__(self, probability: float) -> None:
        self.probability = probability
        self.asked = 0

    def complete(self, audios: list[np.ndarray]) -> list[float]:
        self.asked += len(audios)
        return [self.probability] * len(audios)
