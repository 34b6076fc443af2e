"""Voice activity detection: silero VAD (v5+) through onnxruntime.

One InferenceSession serves every call (onnxruntime's run() is thread-safe); each call gets its own
stream holding the recurrent state and the audio context. The model is tiny (~0.2 ms a chunk), so it
stays on the CPU with one thread: a GPU round trip per 32 ms chunk would cost more than the work.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parley.audio import to_float32
from parley.config import Settings
from parley.engines.cache import package_dir

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
CHUNK_SAMPLES = 512
CONTEXT_SAMPLES = 64  # silero v5 at 16 kHz looks at the tail of the previous chunk
STATE_SHAPE = (2, 1, 128)


class VadStream(Protocol):
    def probability(self, chunk: np.ndarray) -> float: ...
    def reset(self) -> None: ...


class VadEngine(Protocol):
    sample_rate: int
    chunk_samples: int

    def new_stream(self) -> VadStream: ...


def packaged_silero_path() -> Path:
    # Importing silero_vad would set torch's thread count to 1 for the whole process; only its file is needed.
    return package_dir("silero_vad") / "data" / "silero_vad.onnx"


class SileroVadStream:
    """Per-call state. Not shared between threads: each call's VAD thread owns its stream."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self._state = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)

    def probability(self, chunk: np.ndarray) -> float:
        samples = to_float32(np.asarray(chunk)).reshape(-1)
        if samples.size != CHUNK_SAMPLES:
            raise ValueError(f"VAD chunks must hold {CHUNK_SAMPLES} samples, not {samples.size}")
        window = np.concatenate((self._context, samples))[np.newaxis, :]
        output, state = self._session.run(None, {"input": window, "state": self._state, "sr": self._sr})
        self._state = state
        self._context = samples[-CONTEXT_SAMPLES:].copy()
        return float(output[0, 0])

    def reset(self) -> None:
        self._state = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)


class SileroVad:
    """VadEngine: one shared ONNX session, a stream per call."""

    sample_rate: int = SAMPLE_RATE
    chunk_samples: int = CHUNK_SAMPLES

    def __init__(self, model_path: str | Path | None = None) -> None:
        import onnxruntime

        path = Path(model_path) if model_path else packaged_silero_path()
        if not path.is_file():
            raise FileNotFoundError(f"silero VAD model not found: {path}")
        options = onnxruntime.SessionOptions()
        # Many calls run their VAD at once: one thread each scales better than each grabbing all cores.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.model_path = path
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        names = {i.name for i in self._session.get_inputs()}
        if not {"input", "state", "sr"} <= names:
            raise ValueError(f"{path} is not a silero VAD v5+ model (inputs {sorted(names)})")

    def new_stream(self) -> SileroVadStream:
        return SileroVadStream(self._session)


def load_vad(settings: Settings) -> SileroVad:
    return SileroVad(None if settings.vad_model == "silero" else settings.vad_model)
