"""SileroVad: the packaged silero ONNX model, one shared session, independent per-call streams."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from parley.config import Settings
from parley.engines.vad import CHUNK_SAMPLES, SileroVad, load_vad, packaged_silero_path
from tests.unit.test_engines_speech import needs_espeak, speech

pytestmark = needs_espeak


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return load_vad(Settings())


@pytest.fixture(scope="module")
def utterance(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    audio = speech("what is the weather like in paris today", tmp_path_factory.mktemp("vad"))
    # Half a second of silence either side, as a caller's turn would have.
    pad = np.zeros(8000, dtype=np.int16)
    return np.concatenate((pad, audio, pad))


def chunks(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[i : i + CHUNK_SAMPLES] for i in range(0, audio.size - CHUNK_SAMPLES + 1, CHUNK_SAMPLES)]


def probabilities(vad: SileroVad, audio: np.ndarray) -> list[float]:
    stream = vad.new_stream()
    return [stream.probability(c) for c in chunks(audio)]


def test_engine_shape() -> None:
    engine = SileroVad()

    assert engine.sample_rate == 16000
    assert engine.chunk_samples == 512
    assert packaged_silero_path().is_file()


def test_speech_is_detected_and_the_silence_around_it_is_not(vad: SileroVad, utterance: np.ndarray) -> None:
    probs = probabilities(vad, utterance)

    speech_chunks = [p for p in probs if p > 0.5]
    assert max(probs) > 0.9
    assert len(speech_chunks) >= 20  # ~2.7 s of speech is ~84 chunks; most must count
    assert max(probs[:10]) < 0.2  # the leading half second of silence
    assert probs[-1] < 0.5  # the trailing silence, once the model has caught up


def test_silence_and_low_noise_are_not_speech(vad: SileroVad) -> None:
    rng = np.random.default_rng(1)
    noise = (rng.normal(0.0, 0.003, 16000 * 2) * 32767).astype(np.int16)

    assert max(probabilities(vad, np.zeros(16000 * 2, dtype=np.int16))) < 0.1
    assert max(probabilities(vad, noise)) < 0.3  # measured ~0.13; the turn threshold is 0.5


def test_float32_input_matches_int16(vad: SileroVad, utterance: np.ndarray) -> None:
    as_float = utterance.astype(np.float32) / 32768.0

    np.testing.assert_allclose(probabilities(vad, as_float), probabilities(vad, utterance), atol=1e-5)


def test_streams_keep_independent_state(vad: SileroVad, utterance: np.ndarray) -> None:
    silence = np.zeros_like(utterance)
    alone_speech = probabilities(vad, utterance)
    alone_silence = probabilities(vad, silence)

    a, b = vad.new_stream(), vad.new_stream()
    interleaved_a, interleaved_b = [], []
    for speech_chunk, silent_chunk in zip(chunks(utterance), chunks(silence), strict=True):
        interleaved_a.append(a.probability(speech_chunk))
        interleaved_b.append(b.probability(silent_chunk))

    np.testing.assert_allclose(interleaved_a, alone_speech, atol=1e-6)
    np.testing.assert_allclose(interleaved_b, alone_silence, atol=1e-6)


def test_streams_in_parallel_threads_match_sequential_results(vad: SileroVad, utterance: np.ndarray) -> None:
    expected = probabilities(vad, utterance)
    results: list[list[float]] = [[] for _ in range(4)]

    def run(i: int) -> None:
        results[i] = probabilities(vad, utterance)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for got in results:
        np.testing.assert_allclose(got, expected, atol=1e-6)


def test_reset_forgets_the_previous_audio(vad: SileroVad, utterance: np.ndarray) -> None:
    stream = vad.new_stream()
    first = [stream.probability(c) for c in chunks(utterance)]
    stream.reset()
    second = [stream.probability(c) for c in chunks(utterance)]

    np.testing.assert_allclose(second, first, atol=1e-6)


def test_chunks_of_the_wrong_size_are_refused(vad: SileroVad) -> None:
    stream = vad.new_stream()

    with pytest.raises(ValueError, match="512"):
        stream.probability(np.zeros(480, dtype=np.int16))


def test_a_model_path_setting_loads_that_file(tmp_path: Path) -> None:
    copy = tmp_path / "vad.onnx"
    copy.write_bytes(packaged_silero_path().read_bytes())

    engine = load_vad(Settings(vad_model=str(copy)))

    assert engine.model_path == copy
    with pytest.raises(FileNotFoundError):
        load_vad(Settings(vad_model=str(tmp_path / "missing.onnx")))
