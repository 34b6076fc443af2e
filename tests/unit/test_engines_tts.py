"""Piper with the packaged voice, streamed sentence by sentence, intelligible to Whisper; repeated sentences
from the phrase cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parley.audio import PIPELINE_RATE, resample
from parley.config import DEFAULT_GREETING, Settings
from parley.engines.compute_load import COMPUTE
from parley.engines.stt import SttEngine
from parley.engines.tts import PhraseCache, load_tts, voice_files
from tests.unit.test_engines_speech import normalise

SENTENCE = "The weather in Paris is sunny and warm today."


@pytest.fixture(scope="module")
def tts() -> PhraseCache:
    return load_tts(Settings())


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))


def test_a_sentence_gives_int16_audio_of_plausible_length(tts: PhraseCache) -> None:
    started = time.perf_counter()
    chunks = []
    first_audio_s = None
    for chunk in tts.synthesize(SENTENCE):
        first_audio_s = first_audio_s or time.perf_counter() - started
        chunks.append(chunk)
    audio = np.concatenate(chunks)
    seconds = audio.size / tts.sample_rate

    assert tts.sample_rate == 22050
    assert all(c.dtype == np.int16 and c.ndim == 1 for c in chunks)
    assert 1.5 < seconds < 6.0  # nine words
    assert rms(audio) > 500  # not silence
    print(f"first audio after {first_audio_s:.3f}s, {seconds:.2f}s of speech")


def test_each_sentence_is_streamed_as_soon_as_it_is_ready(tts: PhraseCache) -> None:
    stream = tts.synthesize(
        "Hello there. This is the second sentence, which is a good deal longer than the first."
    )
    first = next(stream)
    rest = list(stream)

    assert len(rest) >= 1
    assert first.size < sum(c.size for c in rest)


def test_text_without_words_gives_no_audio(tts: PhraseCache) -> None:
    assert list(tts.synthesize("")) == []
    assert list(tts.synthesize("  ... ")) == []


def test_whisper_hears_what_piper_said(tts: PhraseCache, whisper: SttEngine) -> None:
    # Piper varies its timing from run to run (noise in the duration model), and Whisper base now and
    # then mishears one take ("how can I" -> "I can't"): three fresh takes (past the phrase cache, which
    # would replay the first), one must be heard word for word.
    heard = []
    for _ in range(3):
        take = np.concatenate(list(tts.engine.synthesize(DEFAULT_GREETING)))
        audio = resample(take, tts.sample_rate, PIPELINE_RATE)
        heard.append(normalise(whisper.transcribe(audio).text))
        if heard[-1] == normalise(DEFAULT_GREETING):
            return
    pytest.fail(f"Whisper never heard the greeting: {heard}")


def test_concurrent_callers_all_get_whole_audio(tts: PhraseCache) -> None:
    expected = np.concatenate(list(tts.synthesize(SENTENCE)))
    results: list[np.ndarray] = [np.zeros(0, dtype=np.int16)] * 3

    def run(i: int) -> None:
        results[i] = np.concatenate(list(tts.synthesize(SENTENCE)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for audio in results:
        # Not sample-identical: Piper's duration model is stochastic.
        assert abs(audio.size - expected.size) < 0.2 * expected.size
        assert rms(audio) > 500


def test_voice_paths(tmp_path: Path) -> None:
    model, config = voice_files("joe")
    assert model.is_file() and config.is_file()
    assert voice_files(str(model)) == (model, config)

    lonely = tmp_path / "voice.onnx"
    lonely.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="config"):
        voice_files(str(lonely))
    with pytest.raises(FileNotFoundError):
        voice_files(str(tmp_path / "missing.onnx"))


def test_a_repeated_sentence_comes_from_the_phrase_cache_at_once(tts: PhraseCache) -> None:
    sentence = "Thank you for calling, have a lovely day."
    first = list(tts.synthesize(sentence))
    started = time.perf_counter()
    again = list(tts.synthesize(sentence))
    assert time.perf_counter() - started < 0.01
    assert len(again) == len(first) and all(np.array_equal(a, b) for a, b in zip(again, first, strict=True))


def test_a_sentence_cut_short_is_not_cached(tts: PhraseCache) -> None:
    sentence = "This one is abandoned after its first piece of audio, on purpose."
    stream = tts.synthesize(sentence)
    next(stream)
    stream.close()
    started = time.perf_counter()
    list(tts.synthesize(sentence))
    assert time.perf_counter() - started > 0.02  # synthesised again, not served from a partial entry


def test_piper_counts_as_computing_while_it_synthesises_and_not_while_its_audio_is_used(
    tts: PhraseCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    voice = tts.engine._voice  # type: ignore[attr-defined]
    synthesize = voice.synthesize
    busy_inside: list[bool] = []

    def watched(text: str) -> Iterator[Any]:
        for chunk in synthesize(text):
            busy_inside.append(COMPUTE.busy())
            yield chunk

    monkeypatch.setattr(voice, "synthesize", watched)
    busy_between = [COMPUTE.busy() for _ in tts.engine.synthesize("One sentence. And another one.")]

    assert busy_inside == [True, True]  # the LLM steps aside while Piper computes (compute_load.py)
    assert busy_between == [False, False]  # but not while the TTS stage hands the audio on
