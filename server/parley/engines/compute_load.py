"""Which engines are computing on the CPU right now, so that the LLM knows when it has the cores to itself.

llama.cpp's threads meet at a spinning barrier after every operation: when Whisper or Piper takes a core
from one of them, the other spins out its time slice, and all of them go slower than with one LLM thread.
So the LLM takes one thread while another engine computes, and otherwise chooses by its own load
(llm_llamacpp.py, `_threads`). Whisper's batches and Piper's synthesis say when they compute on the CPU;
on a GPU they do not count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ComputeLoad:
    """A count of the engine runs in progress; thread-safe, and cheap enough to ask before every step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    @contextmanager
    def running(self, device: str = "cpu") -> Iterator[None]:
        """Count the enclosed work as an engine computing, when it computes on the CPU (`device`)."""
        if device != "cpu":
            yield
            return
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def busy(self) -> bool:
        """Whether another engine is computing now."""
        return self._running > 0


COMPUTE = ComputeLoad()  # the process's engines share the cores, and this count
