"""Where the engines run: one answer to 'auto', 'cpu' or 'cuda' for every engine."""

from __future__ import annotations

import logging
import os
from functools import cache

log = logging.getLogger(__name__)


@cache
def cuda_device_count() -> int:
    # CTranslate2 answers without importing torch and is installed whatever the configuration.
    try:
        import ctranslate2

        return int(ctranslate2.get_cuda_device_count())
    except Exception:  # a broken CUDA install must not stop a CPU start-up
        log.exception("cuda_probe_failed")
        return 0


def resolve_device(setting: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; 'cuda' without a GPU is an error."""
    if setting == "cpu":
        return "cpu"
    if setting == "cuda":
        if cuda_device_count() == 0:
            raise RuntimeError("device 'cuda' was asked for but no CUDA device is visible")
        return "cuda"
    if setting == "auto":
        return "cuda" if cuda_device_count() > 0 else "cpu"
    raise ValueError(f"device must be auto, cpu or cuda, not {setting!r}")


def cpu_threads(workers: int = 1) -> int:
    """Threads per worker so that `workers` parallel workers share the cores without oversubscribing."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def onnx_providers(device: str) -> list[str]:
    """onnxruntime providers for a resolved device, falling back to CPU when the CUDA build is absent."""
    import onnxruntime

    if device == "cuda":
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        log.warning("onnxruntime has no CUDA provider; running on CPU")
    return ["CPUExecutionProvider"]
