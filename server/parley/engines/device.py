"""Where the engines run: one answer to 'auto', 'cpu' or 'cuda' for every engine."""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

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


# What CTranslate2 requires of a CPU before it runs its AVX-512 kernels (its cpu_supports_avx512).
AVX512_FLAGS = frozenset(("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"))


def cpu_fields(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The CPU's fields as /proc/cpuinfo gives them (its first logical CPU's; they are all alike), {} where
    it cannot be read (not Linux)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for key, _, value in (line.partition(":") for line in lines):
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`); empty where they cannot be read."""
    fields = cpu_fields(cpuinfo)
    return frozenset((fields.get("flags") or fields.get("Features") or "").split())


def prefer_avx512_for_ctranslate2(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Let CTranslate2 run its AVX-512 kernels on a CPU that has them; True when this set it up.

    CTranslate2 leaves AVX-512 out of its automatic dispatch (every x86 CPU gets its AVX2 kernels) unless
    `CT2_FORCE_CPU_ISA` names it, and it reads that once, when it first computes: so this runs before
    any CTranslate2 model loads, and a value already set (by the user) is left as it is. Measured on this
    AMD EPYC (Whisper base, 2 cores, alternating runs): a transcription took 5-10 % less, with the same
    words; the matrix products themselves go through oneDNN, which picks its own instructions.
    """
    if "CT2_FORCE_CPU_ISA" in os.environ:
        return False
    if not cpu_flags(cpuinfo) >= AVX512_FLAGS:  # unreadable (not Linux) too: CTranslate2's own choice
        return False
    os.environ["CT2_FORCE_CPU_ISA"] = "AVX512"
    return True


def single_threaded_blas() -> dict[str, int]:
    """Keep the BLAS libraries loaded so far (numpy's OpenBLAS) to one thread; returns their threads before.

    A numpy matrix product on OpenBLAS's threads leaves them spinning on the other cores for a while
    after it returns, and the engines are what they spin against: faster-whisper's log-mel features (one
    product, ~4 ms) made the Whisper encoder that ran next take 134 against 82 ms, and a transcription
    0.24-0.26 against 0.18-0.22 s (a 2 s question, 12 s of context, 2 cores of this AMD EPYC). numpy's
    products here are that small; every engine has threads of its own.
    """
    from threadpoolctl import ThreadpoolController

    blas = ThreadpoolController().select(user_api="blas")
    before = {lib.prefix: lib.num_threads for lib in blas.lib_controllers}
    blas.limit(limits=1)
    return before


def onnx_providers(device: str) -> list[str]:
    """onnxruntime providers for a resolved device, falling back to CPU when the CUDA build is absent."""
    import onnxruntime

    if device == "cuda":
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        log.warning("onnxruntime has no CUDA provider; running on CPU")
    return ["CPUExecutionProvider"]
