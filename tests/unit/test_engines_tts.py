"""Piper with the packaged voice, streamed sentence by sentence, intelligible to Whisper; repeated sentences
from the phrase cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parley.audio import PIPELINE_RATE, resample
from parley.config import DEFAULT_GREETING, Settings
from parley.engines.compute_load import COMPUTE
from parley.engines.piper_stream import (
    CONTEXT_FRAMES,
    FIRST_FRAMES,
    FLOW_CONTEXT_FRAMES,
    split_graph,
    stretches,
)
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
    stream = tts.engine._stream  # type: ignore[attr-defined]
    busy_inside: list[bool] = []
    for method in ("latent", "decode"):
        original = getattr(stream, method)

        def watched(*args: Any, _original: Any = original) -> Any:
            busy_inside.append(COMPUTE.busy())
            return _original(*args)

        monkeypatch.setattr(stream, method, watched)
    busy_between = [COMPUTE.busy() for _ in tts.engine.synthesize("One sentence. And another one.")]

    assert len(busy_inside) >= 4 and all(busy_inside)  # the LLM steps aside while Piper computes
    assert busy_between and not any(busy_between)  # but not while the TTS stage hands the audio on


LONG = "The moon is approximately three hundred and eighty four thousand kilometres away from the Earth."


def test_a_sentence_decoded_a_stretch_at_a_time_is_the_sentence_decoded_whole(tts: PhraseCache) -> None:
    stream = tts.engine._stream  # type: ignore[attr-defined]
    voice = tts.engine._voice  # type: ignore[attr-defined]
    latent = stream.latent(voice.phonemes_to_ids(voice.phonemize(LONG)[0]), (0.667, 1.0, 0.8))
    frames = latent.frames
    whole = stream.decode(latent, 0, frames)
    parts = [stream.decode(latent, start, end) for start, end in stretches(frames)]

    assert len(parts) >= 3 and parts[0].size == FIRST_FRAMES * stream.hop
    assert whole.size == frames * stream.hop == sum(p.size for p in parts)
    assert float(np.max(np.abs(np.concatenate(parts) - whole))) < 1e-4


def test_the_latent_made_first_for_the_first_stretch_then_for_the_rest_is_the_latent_made_whole(
    tts: PhraseCache,
) -> None:
    stream = tts.engine._stream  # type: ignore[attr-defined]
    voice = tts.engine._voice  # type: ignore[attr-defined]
    latent = stream.latent(voice.phonemes_to_ids(voice.phonemize(LONG)[0]), (0.667, 1.0, 0.8))
    first = latent.upto(FIRST_FRAMES + CONTEXT_FRAMES).copy()  # what the first stretch needs: one run
    made_first = latent._made.shape[2]
    whole = latent.upto(latent.frames)  # the rest: a second run

    assert FIRST_FRAMES + CONTEXT_FRAMES == made_first < latent.frames - FLOW_CONTEXT_FRAMES
    at_once = latent._flow(0, latent.frames)  # the flow over the whole sentence in one run
    assert whole.shape == at_once.shape
    assert float(np.max(np.abs(whole - at_once))) < 1e-5
    assert float(np.max(np.abs(first - at_once[:, :, :made_first]))) < 1e-5


def test_the_first_words_of_a_long_sentence_come_before_the_rest_is_made(tts: PhraseCache) -> None:
    started = time.perf_counter()
    stream = tts.engine.synthesize(LONG)
    first = next(stream)
    first_s = time.perf_counter() - started
    rest = list(stream)
    whole_s = time.perf_counter() - started

    assert first.size < 0.3 * tts.sample_rate  # at most the first stretch, its opening silence trimmed
    assert len(rest) >= 2 and first_s < 0.6 * whole_s
    print(f"first audio after {first_s:.3f} s, the whole sentence after {whole_s:.3f} s")


def test_every_sentence_has_the_voices_level_without_clipping(tts: PhraseCache) -> None:
    for sentence in ("Yes.", "Certainly!", SENTENCE, LONG, "Wow, that's amazing!"):
        audio = np.concatenate(list(tts.engine.synthesize(sentence))).astype(np.float64) / 32767.0
        level = float(np.sqrt(np.mean(audio**2)))
        assert 0.03 < level < 0.2, (sentence, level)  # about -22 dBFS, sentence after sentence
        assert np.mean(np.abs(audio) >= 0.999) < 0.001, sentence


def test_a_graph_without_piper_s_decoder_is_synthesised_whole(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Identity", ["input"], ["output"], name="/enc/Identity")
    graph = helper.make_graph(
        [node],
        "voice",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1])],
    )
    model = tmp_path / "voice.onnx"
    onnx.save(helper.make_model(graph), str(model))
    assert split_graph(model) is None
    joe = split_graph(voice_files("joe")[0])
    assert joe is not None and joe.flow is not None  # Piper's export: the flow is cut out too


def test_stretches_start_short_then_double_and_leave_no_scrap() -> None:
    assert list(stretches(10)) == [(0, 10)]
    assert list(stretches(60)) == [(0, 24), (24, 60)]
    assert list(stretches(180)) == [(0, 24), (24, 72), (72, 180)]
    assert list(stretches(200)) == [(0, 24), (24, 72), (72, 168), (168, 200)]
    covered = [end - start for start, end in stretches(1000)]
    assert sum(covered) == 1000 and covered[0] == FIRST_FRAMES and min(covered[1:]) >= FIRST_FRAMES
