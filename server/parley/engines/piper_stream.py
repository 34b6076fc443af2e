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

The latent's last step, the flow (`/flow/...`: coupling layers of small convolutions), reaches
`FLOW_CONTEXT_FRAMES` either side too, so where the graph can be cut there as well, the flow runs twice: on
the frames the first stretch needs, then on the rest (`SentenceLatent`); the frames it gives are those of
one run over the whole (measured: identical). Measured on the packaged voice, 2 cores, 37 replies' first
sentences each synthesised once: the first audio p50 56 against 73 ms, the whole sentence as long as before.
In the service it showed only once the LLM stopped stepping on the same two cores while a first piece is
voiced (engines/urgency.py, `HELD`): first audio p50 0.077-0.080 s with this alone, 0.069-0.079 s with both.
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
# The flow's reach, either side: 4 coupling layers, each a WaveNet of 4 convolutions of width 5 (4 x 8).
FLOW_CONTEXT_FRAMES = 32
DECODER_PREFIX = "/dec/"
FLOW_PREFIX = "/flow/"


@dataclass(frozen=True)
class FlowGraph:
    graph: bytes  # prior and mask -> latent
    prior: str
    mask: str


@dataclass(frozen=True)
class SplitGraph:
    front: bytes  # phonemes -> latent (or, with a flow, the flow's prior and mask)
    decoder: bytes  # latent -> audio
    latent: str  # the tensor between them
    flow: FlowGraph | None = None


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
        decoder = extractor.extract_model([latent], outputs)
        if [value.name for value in decoder.graph.input] != [latent]:
            return None
        flow = _flow_graph(extractor, latent)
        front = extractor.extract_model(inputs, [latent] if flow is None else [flow.prior, flow.mask])
    except Exception:  # an unexpected graph: fall back to the whole
        log.warning("piper_graph_not_split", exc_info=True)
        return None
    return SplitGraph(front.SerializeToString(), decoder.SerializeToString(), latent, flow)


def _flow_graph(extractor: Any, latent: str) -> FlowGraph | None:
    """The flow between the prior and the latent, where Piper's export has it: its first node takes the
    prior, and the latent is its output times the frames' mask. None otherwise (the front keeps it)."""
    nodes = extractor.graph.node
    first = next((node for node in nodes if node.name.startswith(FLOW_PREFIX)), None)
    made = next((node for node in nodes if latent in node.output), None)
    if first is None or made is None or made.op_type != "Mul" or len(made.input) != 2:
        return None
    prior, mask = first.input[0], made.input[1]
    try:
        flow = extractor.extract_model([prior, mask], [latent])
    except Exception:
        log.warning("piper_flow_not_split", exc_info=True)
        return None
    if sorted(value.name for value in flow.graph.input) != sorted([prior, mask]):
        return None
    if any(node.op_type.startswith("Random") for node in flow.graph.node):
        return None  # noise drawn inside would differ between the two runs
    return FlowGraph(flow.SerializeToString(), prior, mask)


def stretches(frames: int) -> Iterator[tuple[int, int]]:
    """(start, end) of the latent stretches decoded one after the other: short first, then doubling."""
    start, size = 0, FIRST_FRAMES
    while start < frames:
        end = min(frames, start + size)
        if frames - end < FIRST_FRAMES:  # no short scrap at the end: it costs a run for little audio
            end = frames
        yield start, end
        start, size = end, size * 2


class SentenceLatent:
    """A sentence's latent, made as far as it is asked for: whole at once without a flow of its own; with
    one, the flow first runs on the frames asked for and its reach beyond them, then once on the rest."""

    def __init__(self, frames: int, made: np.ndarray, flow: Callable[[int, int], np.ndarray] | None) -> None:
        self.frames = frames
        self._made = made  # the latent's frames [0, made.shape[2]), as one run over the whole gives them
        self._flow = flow  # the flow's output on prior frames [start, end)

    def upto(self, end: int) -> np.ndarray:
        """Frames [0, end) of the latent."""
        made = self._made.shape[2]
        if end > made and self._flow is not None:
            if made == 0:
                right = min(self.frames, end + FLOW_CONTEXT_FRAMES)
                exact = self.frames if right == self.frames else right - FLOW_CONTEXT_FRAMES
                self._made = self._flow(0, right)[:, :, :exact]
            else:  # the rest, from the reach before the frames already made
                left = made - FLOW_CONTEXT_FRAMES
                rest = self._flow(left, self.frames)[:, :, FLOW_CONTEXT_FRAMES:]
                self._made = np.concatenate([self._made, rest], axis=2)
        return self._made[:, :, :end]


class StreamingVoice:
    """A split Piper graph: the latent of a sentence, then its audio a stretch at a time (float, unscaled)."""

    def __init__(self, graph: SplitGraph, hop: int, make_session: Callable[[bytes], Any]) -> None:
        self.hop = hop  # audio samples per latent frame
        self._latent_name = graph.latent
        self._front = make_session(graph.front)
        self._decoder = make_session(graph.decoder)
        self._flow = None if graph.flow is None else (make_session(graph.flow.graph), graph.flow)

    def latent(self, phoneme_ids: list[int], scales: tuple[float, float, float]) -> SentenceLatent:
        args = {
            "input": np.asarray([phoneme_ids], dtype=np.int64),
            "input_lengths": np.asarray([len(phoneme_ids)], dtype=np.int64),
            "scales": np.asarray(scales, dtype=np.float32),
        }
        if self._flow is None:
            latent: np.ndarray = self._front.run(None, args)[0]
            return SentenceLatent(latent.shape[2], latent, None)
        prior, mask = self._front.run(None, args)
        flow, names = self._flow

        def run_flow(start: int, end: int) -> np.ndarray:
            feed = {names.prior: prior[:, :, start:end], names.mask: mask[:, :, start:end]}
            return np.asarray(flow.run(None, feed)[0])

        return SentenceLatent(prior.shape[2], prior[:, :, :0], run_flow)

    def decode(self, latent: SentenceLatent, start: int, end: int) -> np.ndarray:
        """The audio of latent frames [start, end), decoded with their neighbours for context."""
        left, right = max(0, start - CONTEXT_FRAMES), min(latent.frames, end + CONTEXT_FRAMES)
        frames = latent.upto(right)[:, :, left:right]
        audio = np.asarray(self._decoder.run(None, {self._latent_name: frames})[0])
        audio = audio.reshape(-1)
        return audio[(start - left) * self.hop : (end - left) * self.hop]
