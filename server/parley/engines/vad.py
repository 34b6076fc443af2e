"""Voice activity detection: silero VAD (v5+) through onnxruntime.

One InferenceSession serves every call (onnxruntime's run() is thread-safe); each call gets its own
stream holding the recurrent state and the audio context. The model is tiny (~0.3 ms a chunk), so it
stays on the CPU with one thread: a GPU round trip per 32 ms chunk would cost more than the work.
`probabilities` runs the chunks of several streams as one batch (engines/vad_batching.py does so for
every call's VAD): measured here, 10 chunks cost 1.1 ms together against 2.9 ms one by one, with the
same probabilities and states to the bit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parley.audio import to_float32
from parley.engine_settings import EngineSettings
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

    def probabilities(self, pairs: Sequence[tuple[VadStream, np.ndarray]]) -> list[float]:
        """Each stream's probability for its chunk (streams of this engine, each at most once), as a batch."""
        ...


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
        samples = self.window_for(chunk)
        inputs = {"input": samples[np.newaxis, :], "state": self._state, "sr": self._sr}
        output, state = self._session.run(None, inputs)
        self.advance(samples, state)
        return float(output[0, 0])

    def window_for(self, chunk: np.ndarray) -> np.ndarray:
        """What the model reads for `chunk`: the previous chunk's tail, then the chunk (float32)."""
        samples = to_float32(np.asarray(chunk)).reshape(-1)
        if samples.size != CHUNK_SAMPLES:
            raise ValueError(f"VAD chunks must hold {CHUNK_SAMPLES} samples, not {samples.size}")
        return np.concatenate((self._context, samples))

    def advance(self, window: np.ndarray, state: np.ndarray) -> None:
        """After the model read `window`: its new recurrent state, and the tail the next chunk follows."""
        self._state = state
        self._context = window[-CONTEXT_SAMPLES:].copy()

    @property
    def state(self) -> np.ndarray:
        return self._state

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
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        names = {i.name for i in self._session.get_inputs()}
        if not {"input", "state", "sr"} <= names:
            raise ValueError(f"{path} is not a silero VAD v5+ model (inputs {sorted(names)})")

    def new_stream(self) -> SileroVadStream:
        return SileroVadStream(self._session)

    def probabilities(self, pairs: Sequence[tuple[VadStream, np.ndarray]]) -> list[float]:
        streams = [stream for stream, _ in pairs]
        if not all(isinstance(s, SileroVadStream) and s._session is self._session for s in streams):
            raise ValueError("every stream must come from this VAD engine")
        silero: list[SileroVadStream] = streams  # type: ignore[assignment]
        if len(silero) == 1:
            return [silero[0].probability(pairs[0][1])]
        windows = [stream.window_for(chunk) for stream, (_, chunk) in zip(silero, pairs, strict=True)]
        states = np.concatenate([stream.state for stream in silero], axis=1)
        output, state = self._session.run(None, {"input": np.stack(windows), "state": states, "sr": self._sr})
        for i, (stream, window) in enumerate(zip(silero, windows, strict=True)):
            stream.advance(window, np.ascontiguousarray(state[:, i : i + 1]))
        return [float(p) for p in output[:, 0]]


def load_vad(settings: EngineSettings) -> SileroVad:
    return SileroVad(None if settings.vad_model == "silero" else settings.vad_model)
