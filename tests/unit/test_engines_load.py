"""Loading the engines: all four with the defaults, without torch; preparing the cache; device choice."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parley.config import Settings
from parley.engines import device, prepare_models
from parley.engines.vad import packaged_silero_path


def test_default_engines_load_without_torch_keep_blas_to_one_thread_and_close_their_threads() -> None:
    script = textwrap.dedent(
        """
        import sys, threading
        import numpy as np
        from parley.config import Settings
        from parley.engines import load_engines

        engines = load_engines(Settings())
        chunk = np.zeros(engines.vad.chunk_samples, dtype=np.int16)
        assert engines.vad.new_stream().probability(chunk) < 0.5
        audio = np.concatenate(list(engines.tts.synthesize("Good morning.")))
        assert audio.size > engines.tts.sample_rate // 2
        assert "".join(engines.llm.stream([{"role": "user", "content": "Hi!"}], lambda: True)) == ""
        assert engines.stt.transcribe(np.zeros(16000, dtype=np.int16)).text == ""
        assert "torch" not in sys.modules, "the default engines imported torch"
        from threadpoolctl import threadpool_info
        blas = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
        assert blas and set(blas) == {1}, blas  # numpy's BLAS threads would spin against the engines
        engines.close()
        assert not [t for t in threading.enumerate() if t.name.startswith("stt-worker")]
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_prepare_models_verifies_the_warm_cache(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="parley.engines"):
        prepare_models(Settings())

    ready = [r for r in caplog.records if r.getMessage() == "model_ready"]
    # `--llm-model auto` chooses by the agents it is started with: an image holds both of its models.
    assert [getattr(r, "engine", None) for r in ready] == ["vad", "stt", "llm", "llm", "tts"]
    llms = [str(getattr(r, "path", "")) for r in ready if getattr(r, "engine", None) == "llm"]
    assert "qwen2.5-0.5b" in llms[0] and "qwen2.5-coder-1.5b" in llms[1], llms


def test_device_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "cuda_device_count", lambda: 0)
    assert device.resolve_device("auto") == "cpu"
    assert device.resolve_device("cpu") == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA device"):
        device.resolve_device("cuda")
    with pytest.raises(ValueError):
        device.resolve_device("tpu")

    monkeypatch.setattr(device, "cuda_device_count", lambda: 1)
    assert device.resolve_device("auto") == "cuda"
    assert device.resolve_device("cuda") == "cuda"
    assert device.resolve_device("cpu") == "cpu"


def test_cpu_threads_share_the_cores() -> None:
    assert device.cpu_threads(1) >= 1
    assert device.cpu_threads(1000) == 1
    assert device.onnx_providers("cpu") == ["CPUExecutionProvider"]


def test_ctranslate2_runs_its_avx512_kernels_only_where_the_cpu_has_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "")  # restored after the test, whatever this sets
    monkeypatch.delenv("CT2_FORCE_CPU_ISA")
    with_avx512 = tmp_path / "with"
    with_avx512.write_text("flags\t\t: sse4_1 avx2 avx512f avx512cd avx512dq avx512bw avx512vl\n")
    without = tmp_path / "without"
    without.write_text("processor\t: 0\nflags\t\t: fpu sse4_1 avx2 avx512f\n")
    assert not device.prefer_avx512_for_ctranslate2(without)
    assert "CT2_FORCE_CPU_ISA" not in os.environ
    assert not device.prefer_avx512_for_ctranslate2(tmp_path / "missing")
    assert device.prefer_avx512_for_ctranslate2(with_avx512)
    assert os.environ["CT2_FORCE_CPU_ISA"] == "AVX512"
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "AVX2")  # the user's own choice stands
    assert not device.prefer_avx512_for_ctranslate2(with_avx512)
    assert os.environ["CT2_FORCE_CPU_ISA"] == "AVX2"


def test_the_end_of_turn_model_is_chosen_by_setting_and_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from parley.engines import turn_end

    monkeypatch.setattr(turn_end, "resolve_device", lambda setting: "cpu")
    assert turn_end.turn_model_path(Settings()) is None  # auto: not on a CPU, where replies are slower
    assert turn_end.turn_model_path(Settings(turn_model="none")) is None
    packaged = turn_end.load_turn_end(Settings(turn_model="smart-turn"))  # checked against its digest
    assert packaged.model_path.name == "smart-turn-v3.2-cpu.onnx"
    monkeypatch.setattr(turn_end, "resolve_device", lambda setting: "cuda")
    assert turn_end.turn_model_path(Settings()) == packaged.model_path
    with pytest.raises(FileNotFoundError):
        turn_end.load_turn_end(Settings(turn_model=str(tmp_path / "missing.onnx")))
    with pytest.raises(ValueError, match="not a Smart Turn v3 model"):
        turn_end.load_turn_end(Settings(turn_model=str(packaged_silero_path())))  # an ONNX model, of a VAD
    with caplog.at_level(logging.INFO, logger="parley.engines"):
        prepare_models(Settings(turn_model="smart-turn"))
    ready = [getattr(r, "engine", None) for r in caplog.records if r.getMessage() == "model_ready"]
    assert ready[-1] == "turn_end"
