"""The TTS stage: a reply's text, sentence by sentence, becomes audio in the Outbound, each piece
computed when it will soon be heard and skipped once its reply went stale."""

from __future__ import annotations

import time

import numpy as np

from parley import metrics
from parley.audio import StreamResampler
from parley.engines.tts import TtsEngine
from parley.outbound import Outbound
from parley.pipeline.messages import AudioChunk, EndOfResponse, ReplyText, Response
from parley.pipeline.pacing import wait_for_playout
from parley.pipeline.queues import StageQueue
from parley.pipeline.segmenter import split_sentences
from parley.pipeline.stages import Stage, StageContext


class TtsStage(Stage[ReplyText]):
    stage_name = "tts"
    engine_name = "tts"

    def __init__(self, ctx: StageContext, inbox: StageQueue[ReplyText], tts: TtsEngine, outbound: Outbound):
        super().__init__(ctx, inbox)
        self.tts = tts
        self.outbound = outbound

    def handle(self, item: ReplyText) -> None:
        response = item.response
        if item.text:
            try:
                if not self.ctx.replies.is_stale(response.tag):
                    self._speak(response, item.text)
            finally:
                response.pieces_spoken += 1
        if item.final:
            # The marker goes out even for a stale reply: the sender uses it to close the books on it.
            self.outbound.push(EndOfResponse(response))

    def _speak(self, response: Response, text: str) -> None:
        response.mark("tts_start")
        try:
            # Sentence by sentence, so that each clip carries the words it speaks: what the caller heard
            # of a reply cut in its second sentence is then known to the sentence.
            for sentence in split_sentences(text):
                if self.ctx.replies.is_stale(response.tag):
                    return
                self._synthesise(response, sentence)
        finally:
            response.audio_ready.set()  # even when nothing came out: the LLM must not wait for it

    def _synthesise(self, response: Response, text: str) -> None:
        started = time.monotonic()
        unsaid = text  # the sentence's text goes with its first chunk of audio
        # A sentence comes in stretches cut mid-word: resampled as one stream, so no edge clicks.
        resampler = StreamResampler(self.tts.sample_rate, self.outbound.rate, quality="HQ")
        stretches = iter(self.tts.synthesize(text))
        while True:
            # The next stretch is computed when it will soon be heard (pipeline/pacing.py).
            self._pace(response)
            if self.ctx.replies.is_stale(response.tag):
                return
            pcm = next(stretches, None)
            if pcm is None:
                break
            if self.ctx.replies.is_stale(response.tag):
                return
            if response.tts_first_audio_s is None:
                response.mark("first_audio_ready")
                response.audio_ready.set()
                response.tts_first_audio_s = time.monotonic() - started
                metrics.STAGE_LATENCY.labels(stage="tts_first_audio").observe(response.tts_first_audio_s)
            if self._send(response, resampler.process(pcm), unsaid):
                unsaid = ""
        if not self.ctx.replies.is_stale(response.tag):
            self._send(response, resampler.process(np.zeros(0, dtype=np.int16), last=True), unsaid)

    def _pace(self, response: Response) -> None:
        lead_s = self.ctx.settings.speak_ahead_ms / 1000
        wait_for_playout(response, lead_s, lambda: self.ctx.replies.is_stale(response.tag))

    def _send(self, response: Response, audio: np.ndarray, text: str) -> bool:
        """Push `audio` with `text`, if there is any audio; whether it was pushed."""
        if not audio.size:
            return False
        response.audio_s += audio.size / self.outbound.rate
        self.outbound.push(AudioChunk(response, audio, text))
        return True

    def recover(self, item: ReplyText) -> None:
        if item.final:
            self.outbound.push(EndOfResponse(item.response))
