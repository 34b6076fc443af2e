"""Noise suppression (`--denoise`): each engine quiets noise and keeps speech, the resampling around it
keeps frames whole, and a call's denoise stage makes its state with the call, hands the VAD (and so
Whisper) the cleaned audio, frees the state when the call ends, and costs a failing denoiser only its
cleaning."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from parley import metrics
from parley.audio import PIPELINE_RATE, Downsampler, Upsampler, rms_dbfs
from parley.bench.speech import espeak, trim
from parley.call import Call
from parley.config import Settings, SettingsError
from parley.engines.denoise import DeepFilterNet, Denoiser, DenoiseStream, Rnnoise, load_denoiser
from parley.engines.denoise_workers import DenoiseWorkers, LaneEnded
from parley.engines.stt import Transcription
from parley.engines.vad import SileroVad
from parley.settings_sources import load_settings
from tests.doubles import ScriptedStt, loud, make_engines, quiet

FRAME = 320  # 20 ms at 16 kHz, what a call's inbox holds


@pytest.fixture(scope="module")
def engines_by_name() -> dict[str, Denoiser]:
    return {"rnnoise": Rnnoise(), "deepfilternet": DeepFilterNet()}


def cleaned(stream: DenoiseStream, pcm: np.ndarray) -> np.ndarray:
    try:
        return np.concatenate([stream.process(pcm[i : i + FRAME]) for i in range(0, pcm.size, FRAME)])
    finally:
        stream.close()


def pink_noise(seconds: float, dbfs: float, seed: int = 1) -> np.ndarray:
    """Noise falling 3 dB an octave (like much of a street's), at `dbfs`."""
    rng = np.random.default_rng(seed)
    n = int(seconds * PIPELINE_RATE)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum /= np.sqrt(np.maximum(1.0, np.arange(spectrum.size)))
    noise = np.fft.irfft(spectrum, n)
    noise *= 10 ** (dbfs / 20) * 32768 / np.sqrt(np.mean(noise**2))
    return np.asarray(np.clip(noise, -32768, 32767).astype(np.int16))


def at_level(pcm: np.ndarray, dbfs: float) -> np.ndarray:
    return np.asarray(np.clip(pcm * 10 ** ((dbfs - rms_dbfs(pcm)) / 20), -32768, 32767).astype(np.int16))


def test_the_resampling_around_a_denoiser_keeps_each_20ms_frame_whole_and_on_time() -> None:
    t = np.arange(PIPELINE_RATE) / PIPELINE_RATE
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    up, down = Upsampler(3), Downsampler(3)
    frames = [down.process(up.process(tone[i : i + FRAME])) for i in range(0, tone.size, FRAME)]
    assert {f.size for f in frames} == {FRAME}  # nothing held back for later frames
    out = np.concatenate(frames).astype(np.float64)
    lag = int(np.argmax(np.correlate(out[:4000], tone[:4000].astype(np.float64), "full"))) - 3999
    assert 0 <= lag <= PIPELINE_RATE // 500  # under 2 ms late
    steady = slice(1000, tone.size - 1000)
    assert abs(rms_dbfs(out[steady].astype(np.int16)) - rms_dbfs(tone[steady])) < 0.5


@pytest.mark.parametrize("name", ["rnnoise", "deepfilternet"])
def test_each_denoiser_quiets_a_stretch_of_noise_alone(
    engines_by_name: dict[str, Denoiser], name: str
) -> None:
    noise = pink_noise(3.0, -35.0)
    out = cleaned(engines_by_name[name].new_stream(), noise)
    assert out.size == noise.size
    settled = slice(PIPELINE_RATE, None)  # after its first second, once the model has heard the noise
    assert rms_dbfs(out[settled]) < rms_dbfs(noise[settled]) - 10.0


@pytest.mark.parametrize("name", ["rnnoise", "deepfilternet"])
def test_each_denoiser_keeps_speech_the_vad_hears(engines_by_name: dict[str, Denoiser], name: str) -> None:
    speech = at_level(trim(espeak("can you recommend a good book to read")), -24.0)
    pad = np.zeros(PIPELINE_RATE // 2, dtype=np.int16)
    line = np.concatenate([pad, speech, pad]) + pink_noise(
        (speech.size + 2 * pad.size) / PIPELINE_RATE, -44.0
    )
    out = cleaned(engines_by_name[name].new_stream(), line.astype(np.int16))
    spoken = slice(pad.size, pad.size + speech.size)
    assert rms_dbfs(out[spoken]) > rms_dbfs(speech) - 6.0  # the words lose little of their level
    vad = SileroVad()

    def speech_chunks(pcm: np.ndarray) -> int:
        stream = vad.new_stream()
        return sum(stream.probability(pcm[i : i + 512]) >= 0.5 for i in range(0, pcm.size - 511, 512))

    assert speech_chunks(out) >= 0.8 * speech_chunks(line.astype(np.int16))


def test_denoise_is_a_setting_with_three_choices() -> None:
    assert Settings().denoise == "off"
    assert load_settings(None, {"PARLEY_DENOISE": "rnnoise"}).denoise == "rnnoise"
    with pytest.raises(SettingsError, match="denoise must be one of rnnoise, deepfilternet, off"):
        load_settings(None, {"PARLEY_DENOISE": "krisp"})
    assert load_denoiser("off") is None


# A call's denoise stage


class Watched:
    """A denoiser's streams, counted as they are made, used and freed (wrapping a real one, or a double)."""

    def __init__(
        self, inner: Denoiser | None = None, *, make: Callable[[], DenoiseStream] | None = None
    ) -> None:
        self.name = inner.name if inner is not None else "double"
        self._make = make or (inner.new_stream if inner is not None else None)
        self.made: list[WatchedStream] = []
        self.made_on: list[str] = []

    def new_stream(self) -> DenoiseStream:
        assert self._make is not None
        self.made_on.append(threading.current_thread().name)
        stream = WatchedStream(self._make())
        self.made.append(stream)
        return stream


class WatchedStream:
    def __init__(self, inner: DenoiseStream) -> None:
        self.inner = inner
        self.frames = 0
        self.closed = False

    def process(self, pcm: np.ndarray) -> np.ndarray:
        assert not self.closed
        self.frames += 1
        return self.inner.process(pcm)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class Tone:
    """A stream that replaces the first `frames` it hears with a loud tone, then passes audio on: what
    comes out of it is unmistakable."""

    def __init__(self, frames: int = 30) -> None:
        self.left = frames

    def process(self, pcm: np.ndarray) -> np.ndarray:
        self.left -= 1
        return loud(1000 * pcm.size / PIPELINE_RATE) if self.left >= 0 else pcm

    def close(self) -> None: ...


class Failing:
    """A stream that fails on its `after`+1-th frame, passing audio on untouched until then."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.frames = 0

    def process(self, pcm: np.ndarray) -> np.ndarray:
        self.frames += 1
        if self.frames > self.after:
            raise RuntimeError("denoiser failed (injected)")
        return pcm

    def close(self) -> None: ...


class HeardStt(ScriptedStt):
    """Keeps the audio each transcription was asked for."""

    def __init__(self) -> None:
        super().__init__(text_for=lambda seconds: "hello there")
        self.audio: list[np.ndarray] = []

    def transcribe(self, audio: np.ndarray, **options: object) -> Transcription:  # type: ignore[override]
        self.audio.append(audio)
        return super().transcribe(audio, **options)  # type: ignore[arg-type]


def wait_for(check: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


@pytest.fixture
def calls() -> Iterator[Callable[..., Call]]:
    made: list[Call] = []

    def start(denoiser: Denoiser, stt: ScriptedStt | None = None) -> Call:
        engines = make_engines(denoiser=denoiser, stt=stt or ScriptedStt())
        call = Call("c-denoised", "test", Settings(greeting=""), engines, PIPELINE_RATE)
        call.start()
        made.append(call)
        return call

    yield start
    for call in made:
        call.end("test_over")
        assert call.join(5.0)
        call.engines.close()


def denoise_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "denoise" in t.name]


def test_a_calls_denoiser_state_is_made_off_the_callers_thread_and_freed_when_the_call_ends(
    calls: Callable[..., Call],
) -> None:
    denoiser = Watched(Rnnoise())
    call = calls(denoiser)
    for _ in range(25):
        call.push_audio(quiet(20))
    wait_for(lambda: denoiser.made and denoiser.made[0].frames == 25)
    assert denoiser.made_on == ["c-denoised:denoise-load"]
    assert "c-denoise-worker-0" in denoise_threads()
    workers = call.engines.denoise_workers
    assert workers is not None and workers.lanes() == 1

    call.end("hangup")
    assert call.join(5.0)
    assert denoiser.made[0].closed
    assert workers.lanes() == 0
    assert denoise_threads() == []  # the workers end with their last call


def test_what_the_vad_and_whisper_hear_is_the_cleaned_audio(calls: Callable[..., Call]) -> None:
    stt = HeardStt()
    call = calls(Watched(make=Tone), stt)
    for _ in range(60):  # the caller sends silence; the denoiser makes a tone of it, which is "speech"
        call.push_audio(quiet(20))
    wait_for(lambda: stt.audio)
    assert rms_dbfs(stt.audio[0]) > -30.0


def test_a_denoiser_that_fails_costs_the_call_its_cleaning_not_its_audio(calls: Callable[..., Call]) -> None:
    failures = metrics.ENGINE_ERRORS_TOTAL.labels(engine="denoise")
    before = failures._value.get()
    stt = HeardStt()
    call = calls(Watched(make=lambda: Failing(after=3)), stt)
    for _ in range(25):
        call.push_audio(loud(20))
    for _ in range(30):
        call.push_audio(quiet(20))
    wait_for(lambda: stt.audio)  # the caller's words still made a turn
    assert failures._value.get() == before + 1
    assert call.inboxes.vad.received >= 50 * FRAME


def test_a_denoiser_that_cannot_load_costs_the_call_its_cleaning_not_its_audio(
    calls: Callable[..., Call],
) -> None:
    def broken() -> DenoiseStream:
        raise RuntimeError("no model (injected)")

    stt = HeardStt()
    call = calls(Watched(make=broken), stt)
    for _ in range(25):
        call.push_audio(loud(20))
    for _ in range(30):
        call.push_audio(quiet(20))
    wait_for(lambda: stt.audio)
    assert rms_dbfs(stt.audio[0]) > -30.0


class Lane:
    """A lane that notes the thread each of its rounds of work ran on, and can be told its call ended."""

    def __init__(self, name: str, work_s: float = 0.0) -> None:
        self.name = name
        self.work_s = work_s
        self.ran_on: list[str] = []
        self.ended = False
        self.done = threading.Event()

    def work(self) -> None:
        if self.ended:
            raise LaneEnded(self.name)
        self.ran_on.append(threading.current_thread().name)
        time.sleep(self.work_s)

    def failed(self, error: BaseException) -> None: ...

    def finished(self) -> None:
        self.done.set()


def test_the_calls_of_a_process_are_cleaned_on_a_worker_each_not_one_behind_another() -> None:
    workers = DenoiseWorkers(threads=2)
    first, second = Lane("a", work_s=0.05), Lane("b", work_s=0.05)
    try:
        workers.add(first)
        workers.add(second)
        for _ in range(3):
            workers.ready(first)
            workers.ready(second)
            time.sleep(0.06)
        wait_for(lambda: len(first.ran_on) >= 2 and len(second.ran_on) >= 2)
        assert len(set(first.ran_on)) == 1 and len(set(second.ran_on)) == 1  # each call stays on its worker
        assert set(first.ran_on) != set(second.ran_on)  # and the two run side by side
        first.ended = True
        workers.ready(first)
        assert first.done.wait(5.0)
        assert workers.lanes() == 1
    finally:
        workers.close()
    assert second.done.is_set()
    assert denoise_threads() == []
