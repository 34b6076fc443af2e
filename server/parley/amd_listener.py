"""Answering-machine detection on a stream of caller audio: the call's answering stage and `parley bench
amd` both feed one of these, so that the benchmark measures what calls run.

The audio (16 kHz int16, any lengths) is cut into VAD chunks; each gives the classifier (amd.py) its
speech and tone items, and when the classifier asks, Whisper's words for the speech so far. Time is the
audio's own (chunks counted since the answer), so a verdict is the same however fast the audio is fed;
the Whisper time spent on the way is counted apart (`stt_s`), for what the verdict costs in real time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from parley.amd import AmdTiming, Classifier, Verdict
from parley.amd_audio import SpeechTracker, ToneTracker
from parley.audio import PIPELINE_RATE, FrameSplitter
from parley.engines.stt import SttEngine
from parley.engines.vad import VadEngine

log = logging.getLogger(__name__)

KEPT_AUDIO_S = 12.0  # what is transcribed at most: a verdict comes well before
LEAD_S = 0.2  # audio before the first speech chunk: the VAD hears a word's start late

Transcribed = Callable[[str, float], None]  # the words, and the audio seconds they cover


class AmdListener:
    """One call's answering-machine detection. Not thread-safe: one thread feeds it."""

    def __init__(
        self,
        vad: VadEngine,
        stt: SttEngine,
        timing: AmdTiming | None = None,
        *,
        on_words: Transcribed | None = None,
    ) -> None:
        self.vad = vad
        self.stt = stt
        self.classifier = Classifier(timing)
        self.on_words = on_words
        self.chunk_s = vad.chunk_samples / PIPELINE_RATE
        self.now_s = 0.0  # audio heard so far
        self.stt_s = 0.0  # Whisper time spent deciding
        self._splitter = FrameSplitter(vad.chunk_samples)
        self._stream = vad.new_stream()
        self._tones = ToneTracker(PIPELINE_RATE)
        self._speech = SpeechTracker(self.chunk_s)
        self._kept: list[np.ndarray] = []  # the audio since the answer, while words may still decide
        self._speech_from: float | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self.classifier.verdict

    def hear(self, pcm: np.ndarray) -> None:
        for chunk in self._splitter.push(pcm):
            self._chunk(chunk)

    def _chunk(self, chunk: np.ndarray) -> None:
        start_s = self.now_s
        self.now_s += self.chunk_s
        classifier = self.classifier
        if classifier.verdict is None and self.now_s <= KEPT_AUDIO_S:
            self._kept.append(chunk)
        elif self._kept:
            self._kept = []  # decided: the words no longer matter
        probability = self.vad.probabilities([(self._stream, chunk)])[0]
        speech = self._speech.push(probability, start_s)
        if speech is not None:
            kind, at_s = speech
            if kind == "began":
                classifier.speech_began(at_s)
                if self._speech_from is None:
                    self._speech_from = at_s
            else:
                classifier.speech_ended(at_s)
        tone = self._tones.push(chunk, start_s)
        if tone is not None:
            kind, at_s = tone
            if kind == "tone":
                classifier.tone(at_s, self.now_s)
            else:
                classifier.tone_ended(at_s)
        if classifier.transcript_due(self.now_s) and self._kept:
            self._transcribe()
        classifier.decide(self.now_s)

    def _transcribe(self) -> None:
        first = max(0, int(((self._speech_from or 0.0) - LEAD_S) / self.chunk_s))
        audio = np.concatenate(self._kept[first:])
        started = time.perf_counter()
        try:
            # Urgent: a person who said "Hello?" is waiting for this verdict.
            text = self.stt.transcribe(audio, urgent=True).text
        except Exception:
            # The timing still decides; the words are not asked for again until there is more speech.
            log.warning("amd_transcription_failed", exc_info=True)
            text = ""
        self.stt_s += time.perf_counter() - started
        self.classifier.heard(text, self.now_s)
        if self.on_words is not None:
            self.on_words(text, self.now_s)

    def message_due(self) -> str | None:
        """After a machine verdict: whether the message may start now, and why (beep, quiet, cap)."""
        return self.classifier.message_due(self.now_s)
