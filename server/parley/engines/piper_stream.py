"""A Piper voice decoded a stretch at a time, so that a sentence's first words go out before the rest is made.

Piper's VITS graph reads a sentence's phonemes into a latent sequence (text encoder, durations, flow), then
its HiFi-GAN decoder turns the whole latent into audio, and only then does Piper hand anything over. The
decoder is convolutional: a sample depends on a few latent frames around its own, so a stretch of latent
decoded with `CONTEXT_FRAMES` of its neighbours on each side gives the samples the whole would (measured on
the packaged voice: the same to 1e-5). The graph is cut where the decoder begins (its first node, named
`/dec/...` by Piper's export): one session makes the latent, another decodes `FIRST_FRAMES` (0.28 s) of it,
then stretches twice as long as the one before, each ready long before the audio ahead of it has played.
Measured here (joe-medium, 2 cores): "The capital city of Japan" gave its first audio after 62 ms (the latent
44 ms, the first stretch 18 ms) where the whole sentence took 161 ms; a 17-word sentence after 146 against
446 ms.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

FIRST_FRAMES = 24  # latent frames of a sentence's first stretch (256 samples each at 22.05 kHz: 0.28 s)
CONTEXT_FRAMES = 16  # neighbouring frames decoded with a stretch, either side: the decoder's reach
DECODER_PREFIX = "/dec/"


@dataclass(frozen=True)
class SplitGraph:
    front: bytes  # phonemes -> latent
    decoder: bytes  # latent -> audio
    latent: str  # the tensor between them


def split_graph(model: Path) -> SplitGraph | None:
    """The voice's graph cut where its decoder begins; None for a graph that cannot be cut there (another
    export, several speakers, more than one output): such a voice is synthesised whole."""
    import onnx
    from onnx.utils import Extractor

    proto = onnx.load(str(model))
    graph = proto.graph
    start = next((node for node in graph.node if node.name.startswith(DECODER_PREFIX)), None)
    inputs = [value.name for value in graph.input]
    outputs = [value.name for value in graph.output]
    if start is None or "sid" in inputs or len(outputs) != 1:
        return None
    latent = start.input[0]
    try:
        extractor = Extractor(proto)
        front = extractor.extract_model(inputs, [latent])
        decoder = extractor.extract_model([latent], outputs)
    except Exception:  # an unexpected graph: fall back to the whole
        log.warning("piper_graph_not_split", exc_info=True)
        return None
    if [value.name for value in decoder.graph.input] != [latent]:
        return None
    return SplitGraph(front.SerializeToString(), decoder.SerializeToString(), latent)


def stretches(frames: int) -> Iterator[tuple[int, int]]:
    """(start, end) of the latent stretches decoded one after the other: short first, then doubling."""
    start, size = 0, FIRST_FRAMES
    while start < frames:
        end = min(frames, start + size)
        if frames - end < FIRST_FRAMES:  # no short scrap at the end: it costs a run for little audio
            end = frames
        yield start, end
        start, size = end, size * 2


class StreamingVoice:
    """A split Piper graph: the latent of a sentence, then its audio a stretch at a time (float, unscaled)."""

    def __init__(self, graph: SplitGraph, hop: int, make_session: Callable[[bytes], Any]) -> None:
        self.hop = hop  # audio samples per latent frame
        self._latent_name = graph.latent
        self._front = make_session(graph.front)
        self._decoder = make_session(graph.decoder)

    def latent(self, phoneme_ids: list[int], scales: tuple[float, float, float]) -> np.ndarray:
        args = {
            "input": np.asarray([phoneme_ids], dtype=np.int64),
            "input_lengths": np.asarray([len(phoneme_ids)], dtype=np.int64),
            "scales": np.asarray(scales, dtype=np.float32),
        }
        latent: np.ndarray = self._front.run(None, args)[0]
        return latent

    def decode(self, latent: np.ndarray, start: int, end: int) -> np.ndarray:
        """The audio of latent frames [start, end), decoded with their neighbours for context."""
        frames = latent.shape[2]
        left, right = max(0, start - CONTEXT_FRAMES), min(frames, end + CONTEXT_FRAMES)
        audio = np.asarray(self._decoder.run(None, {self._latent_name: latent[:, :, left:right]})[0])
        audio = audio.reshape(-1)
        return audio[(start - left) * self.hop : (end - left) * self.hop]
