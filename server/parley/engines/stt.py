"""Speech to text: Whisper through CTranslate2, batched across calls.

faster-whisper's own transcribe() pads every utterance to 30 s, which makes a 2 s utterance cost as much
as a 30 s one. Here the encoder gets only the utterance (plus one second of silence, which Whisper needs
to end cleanly), so a short turn costs a fraction of that. Decoding keeps Whisper's timestamps: without
them it tends to repeat a short utterance over and over into the padding, with them it closes the segment
where the speech ends, and any segment that starts after the real audio is dropped. Requests from all
calls go through one queue; each worker takes whatever is waiting, has the batch encoded on every core
(one batch at a time) and decodes it on its own core: the encoder is matrix work that threads shorten, the
decoder a token at a time, faster on one thread than on two. What the tokens mean (segments, the odds of a
first word, which text to keep) is read in `engines/whisper_text.py`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parley.audio import to_float32
from parley.engine_settings import EngineSettings
from parley.engines.compute_load import COMPUTE
from parley.engines.device import cpu_threads, prefer_avx512_for_ctranslate2, resolve_device
from parley.engines.whisper_cache import whisper_source
from parley.engines.whisper_text import (
    MAX_TEXT_CHARS,
    SAMPLE_RATE,
    SILENT_PEAK,
    Segment,
    WhisperTokens,
    clean,
    quiet_cut,
    speech_end,
)
from parley.log import event

log = logging.getLogger(__name__)

HOP = 160
MAX_FRAMES = 3000  # Whisper's encoder has position embeddings for 30 s
TAIL_PADDING = SAMPLE_RATE  # one second of trailing silence
# Whisper was trained on 30 s windows. On 11 questions received over WebRTC (Opus) here, word errors were
# 5/83 with one second of padding, 3/83 with 8-10 s of context, 1/83 with 12 s and 0/83 with 30 s, at
# 0.18, 0.22, 0.25 and 0.61 s per utterance: 12 s is where accuracy stops paying for time.
MIN_CONTEXT_SAMPLES = 12 * SAMPLE_RATE
WINDOW_SAMPLES = MAX_FRAMES * HOP - TAIL_PADDING - HOP
MIN_SAMPLES = SAMPLE_RATE // 10
MIN_RESUME_S = 1.0  # a cut-off segment this early in a window: move on rather than risk no progress


@dataclass(frozen=True)
class Transcription:
    text: str
    no_speech_prob: float
    seconds: float
    avg_logprob: float = 0.0  # Whisper's mean token log-probability: how sure it is of the words
    # For each word `transcribe` was asked to weigh: how likely Whisper thought the text began with it,
    # whatever it wrote (over a phone line a "stop" may be written "Uh..." yet keep some of its odds).
    weighed: Mapping[str, float] = field(default_factory=dict)

    def odds_of(self, words: Iterable[str]) -> float:
        """The best odds Whisper gave any of `words` (weighed) to begin the text; 0 for one not weighed."""
        return max((self.weighed.get(word, 0.0) for word in words), default=0.0)


class SttEngine(Protocol):
    def transcribe(
        self,
        audio: np.ndarray,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
        weigh: tuple[str, ...] = (),
    ) -> Transcription:
        """`urgent`: ahead of the utterances already waiting (a paused agent is waiting for it).
        `wanted`: asked before the audio is worked on; False then raises SttCancelled (a speculative
        reply cancelled while it waited its turn costs nothing).
        `weigh`: lowercase words whose odds of beginning the text come back in `weighed`."""
        ...


@dataclass(frozen=True)
class _Decoded:
    segments: tuple[Segment, ...]
    no_speech_prob: float
    avg_logprob: float
    weighed: Mapping[str, float] = field(default_factory=dict)


@dataclass
class _Window:
    features: np.ndarray  # (n_mels, frames), already padded with a second of silence
    seconds: float  # real audio in the window, without the padding
    wanted: Callable[[], bool] | None = None
    weigh: tuple[str, ...] = ()
    future: Future[_Decoded] = field(default_factory=Future)

    def still_wanted(self) -> bool:
        """Claims the window for a worker: False (the future failed) when no one waits for it any more."""
        if self.wanted is not None and not self.wanted():
            if self.future.set_running_or_notify_cancel():
                self.future.set_exception(SttCancelled("no longer wanted"))
            return False
        return self.future.set_running_or_notify_cancel()


class SttClosed(RuntimeError):
    pass


class SttCancelled(RuntimeError):
    """The audio was no longer wanted when its turn came (`transcribe`'s `wanted`)."""


class WhisperStt:
    """SttEngine over a CTranslate2 Whisper model, shared by all calls; thread-safe."""

    def __init__(
        self,
        model: str = "base",
        *,
        device: str = "cpu",
        language: str = "en",
        workers: int = 1,
        max_batch: int = 8,
        cache_dir: Path | None = None,
    ) -> None:
        if device == "cpu":
            prefer_avx512_for_ctranslate2()
        from faster_whisper import WhisperModel

        source = whisper_source(model, cache_dir)
        self.device = device
        workers = max(1, workers)
        compute_type = "float16" if device == "cuda" else "int8"
        self._model = WhisperModel(
            source,
            device=device,
            compute_type=compute_type,
            cpu_threads=cpu_threads(workers),
            num_workers=workers,
        )
        self._whisper = self._model.model
        self._encoder = self._whisper
        if device == "cpu" and cpu_threads() > cpu_threads(workers):
            import ctranslate2

            # The encoder is matrix work that every core shortens (12 s of context: 96 against 176 ms on
            # one core here); decoding is a token at a time, faster on one core. So a replica on every core
            # encodes, one batch at a time, and each worker decodes on its own core.
            self._encoder = ctranslate2.models.Whisper(
                source, device=device, compute_type=compute_type, intra_threads=cpu_threads(), inter_threads=1
            )
        self._encoding = threading.Lock()
        tokenizer = self._model.hf_tokenizer
        self._tokenizer = tokenizer
        self._tokens = WhisperTokens(tokenizer)
        token = tokenizer.token_to_id
        self._multilingual = bool(self._whisper.is_multilingual)
        if not self._multilingual and language not in ("", "en"):
            raise ValueError(f"Whisper {model!r} hears only English, not {language!r}")
        self._language = language if self._multilingual else "en"
        if self._multilingual and language and token(f"<|{language}|>") is None:
            raise ValueError(f"Whisper does not know the language {language!r}")
        self._sot = token("<|startoftranscript|>")
        self._transcribe = token("<|transcribe|>")
        self._max_batch = max(1, max_batch)
        # (priority, order, window): urgent windows first, then in order; the stop sentinels (None) last.
        self._queue: queue.PriorityQueue[tuple[int, int, _Window | None]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._closed = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._serve, name=f"stt-worker-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # Caller side

    def transcribe(
        self,
        audio: np.ndarray,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
        weigh: tuple[str, ...] = (),
    ) -> Transcription:
        started = time.perf_counter()
        samples = to_float32(np.asarray(audio)).reshape(-1)
        if samples.size < MIN_SAMPLES or float(np.max(np.abs(samples))) < SILENT_PEAK:
            return Transcription("", 1.0, time.perf_counter() - started)
        texts: list[str] = []
        logprobs: list[float] = []
        no_speech = 1.0
        weighed: Mapping[str, float] = {}
        start = 0
        while samples.size - start >= MIN_SAMPLES:
            last = samples.size - start <= WINDOW_SAMPLES
            end = samples.size if last else quiet_cut(samples, start + WINDOW_SAMPLES)
            chunk = samples[start:end]
            # Feature extraction is numpy work: doing it here spreads it over the callers' threads.
            padding = max(TAIL_PADDING, MIN_CONTEXT_SAMPLES - chunk.size)
            features = self._model.feature_extractor(chunk, padding=padding)[:, :MAX_FRAMES]
            # Only the first window can begin the text.
            window = _Window(
                features.astype(np.float32), chunk.size / SAMPLE_RATE, wanted, weigh if start == 0 else ()
            )
            self._submit(window, urgent)
            decoded = window.future.result()
            weighed = weighed or decoded.weighed
            no_speech = min(no_speech, decoded.no_speech_prob)
            logprobs.append(decoded.avg_logprob)
            # Like Whisper's own long-form loop: a segment the window cut off is decoded again from its
            # start in the next window.
            open_starts = [seg.start for seg in decoded.segments if not seg.complete]
            resume = open_starts[-1] if open_starts and not last else 0.0
            resuming = resume >= MIN_RESUME_S
            ends = speech_end(chunk)
            kept = [
                seg.text
                for seg in decoded.segments
                if seg.start < ends and (seg.complete or not resuming) and seg.text
            ]
            texts.append(clean(" ".join(kept), decoded.no_speech_prob, decoded.avg_logprob))
            if last:
                break
            start = start + int(resume * SAMPLE_RATE) if resuming else end
        text = " ".join(t for t in texts if t)[:MAX_TEXT_CHARS]
        avg_logprob = sum(logprobs) / len(logprobs) if logprobs else 0.0
        return Transcription(text, no_speech, time.perf_counter() - started, avg_logprob, weighed)

    def _submit(self, window: _Window, urgent: bool = False) -> None:
        # Under the lock so that nothing is queued behind the workers' stop sentinels.
        with self._lock:
            if self._closed:
                raise SttClosed("the STT engine is closed")
            self._queue.put((0 if urgent else 1, next(self._order), window))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._queue.put((2, next(self._order), None))
        for thread in self._threads:
            thread.join()
        # Anything queued after the sentinels would wait forever: fail it instead.
        while True:
            try:
                _, _, item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None and item.future.set_running_or_notify_cancel():
                item.future.set_exception(SttClosed("the STT engine is closed"))

    # Worker side

    def _serve(self) -> None:
        while True:
            _, _, first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            others: list[tuple[int, int, _Window | None]] = []
            while len(batch) < self._max_batch:
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
                item = entry[2]
                if item is None:
                    stop = True
                    break
                # Only windows of the same length go together: padding one to another's length changes
                # what the encoder sees, and so what it hears. Utterances under 11 s all have 12 s of
                # context (1200 frames), so a batch is the common case; the same audio gives the same
                # transcript alone or batched.
                if item.features.shape == first.features.shape:
                    batch.append(item)
                else:
                    others.append(entry)
            for entry in others:
                self._queue.put(entry)
            wanted = [w for w in batch if w.still_wanted()]
            if len(wanted) < len(batch):
                event(log, "stt_dropped", logging.DEBUG, windows=len(batch) - len(wanted))
            batch = wanted
            if batch:
                try:
                    results = self._generate(batch)
                except Exception as exc:
                    log.exception("stt_batch_failed")
                    for w in batch:
                        w.future.set_exception(exc)
                else:
                    for w, result in zip(batch, results, strict=True):
                        w.future.set_result(result)
            if stop:
                return

    def _generate(self, windows: list[_Window]) -> list[_Decoded]:
        with COMPUTE.running(self.device):  # the LLM steps aside (engines/compute_load.py)
            return self._run(windows)

    def _run(self, windows: list[_Window]) -> list[_Decoded]:
        import ctranslate2

        features = [w.features for w in windows]
        frames = max(f.shape[1] for f in features)
        # Pad with each utterance's own floor value: what its log-mel of silence looks like.
        batch = np.stack(
            [np.pad(f, ((0, 0), (0, frames - f.shape[1])), constant_values=float(f.min())) for f in features]
        )
        started = time.perf_counter()
        # Encoded apart, decoding (and language detection) take the encoder's output as it is.
        if self._encoder is not self._whisper:
            view = self._encode_each(batch)
        else:
            view = ctranslate2.StorageView.from_array(np.ascontiguousarray(batch))
            if self._multilingual and not self._language:
                view = self._whisper.encode(view)
        if not self._multilingual:
            prompts = [[self._sot]] * len(windows)
        else:
            if self._language:
                languages = [f"<|{self._language}|>"] * len(windows)
            else:
                languages = [ranked[0][0] for ranked in self._whisper.detect_language(view)]
            prompts = [[self._sot, self._tokenizer.token_to_id(lang), self._transcribe] for lang in languages]
        longest = max(w.seconds for w in windows)
        weighing = any(w.weigh for w in windows)
        # Speech rarely exceeds 4 tokens a second (plus two timestamps a segment): the bound stops a
        # hallucination loop early without ever cutting real speech.
        max_length = min(224, len(prompts[0]) + 10 + int(8 * longest))
        results = self._whisper.generate(
            view,
            prompts,
            beam_size=1,
            max_length=max_length,
            return_scores=True,
            return_no_speech_prob=True,
            return_logits_vocab=weighing,  # every step's, for the batch: only when a check is in it
            suppress_blank=True,
        )
        out = []
        for window, result in zip(windows, results, strict=True):
            score = float(result.scores[0]) if result.scores else 0.0
            segments = self._tokens.segments(result.sequences_ids[0])
            weighed = self._tokens.first_word_odds(window.weigh, result) if weighing else {}
            out.append(_Decoded(segments, float(result.no_speech_prob), score, weighed))
        event(
            log,
            "stt_batch",
            logging.DEBUG,
            size=len(windows),
            audio_s=round(longest, 2),
            seconds=round(time.perf_counter() - started, 3),
        )
        return out

    def _encode_each(self, batch: np.ndarray) -> Any:
        """The encoder's output for `batch`, one window at a time, stacked for the decoder to take together.

        On this CPU the encoder takes longer over a batch than over its windows one by one (12 s of context
        on two threads: three windows 284 against 236 ms, six 695 against 471 ms, two the same), where the
        decoder gains from one (ten tokens each: one window 107 ms, three 166, six 290). Each window is
        then encoded exactly as it would be alone.
        """
        import ctranslate2

        encoded: list[np.ndarray] = []
        for features in batch:
            with self._encoding:
                view = self._encoder.encode(
                    ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None]))
                )
            if len(batch) == 1:
                return view
            encoded.append(np.asarray(view))
        return ctranslate2.StorageView.from_array(np.ascontiguousarray(np.concatenate(encoded)))


def load_stt(settings: EngineSettings) -> WhisperStt:
    return WhisperStt(
        settings.stt_model,
        device=resolve_device(settings.device),
        language=settings.stt_language,
        workers=settings.stt_workers,
        max_batch=settings.stt_max_batch,
        cache_dir=settings.resolved_cache_dir(),
    )
