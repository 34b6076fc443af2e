"""One call's stages and the inboxes between them: VAD -> STT -> LLM -> TTS, with the backchannel and
end-of-turn checks beside them, built together so that each stage reads one inbox and writes the next."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from parley.config import Settings
from parley.engines import Engines
from parley.outbound import Outbound
from parley.pipeline.backchannels import BackchannelJudge
from parley.pipeline.denoise_stage import DenoiseInbox, DenoiseStage
from parley.pipeline.messages import (
    BackchannelQuery,
    EarlyUtterance,
    InboundFrame,
    ReplyText,
    Transcript,
    TurnEndQuery,
    Utterance,
)
from parley.pipeline.queues import StageQueue
from parley.pipeline.replying import AgentContext, LlmStage
from parley.pipeline.stages import BackchannelStage, StageContext, StageRunner, SttStage, TurnEndStage
from parley.pipeline.tts_stage import TtsStage
from parley.pipeline.turntaking import TurnTaker
from parley.pipeline.vad_stage import VadInbox, VadStage

log = logging.getLogger(__name__)

INBOUND_QUEUE_FRAMES = 250  # 5 s of audio: beyond that the VAD is hopelessly behind; drop the oldest


class StageInboxes:
    """A call's stage queues. The turn decisions put the caller's turns and questions here, the replies
    their text and cancels (a cancel goes to each reply stage's priority lane: pipeline/queues.py)."""

    def __init__(self, vad_chunk_samples: int, *, turn_end: bool, denoise: bool = False) -> None:
        self.vad = VadInbox(vad_chunk_samples, maxsize=INBOUND_QUEUE_FRAMES)
        # The caller's audio goes through here first when the process cleans it (--denoise).
        self.denoise = DenoiseInbox(maxsize=INBOUND_QUEUE_FRAMES) if denoise else None
        self.backchannel: StageQueue[BackchannelQuery] = StageQueue("backchannel")
        # Asked at each pause when the process has an end-of-turn model (engines/turn_end.py).
        self.turn_end: StageQueue[TurnEndQuery] | None = StageQueue("turn_end") if turn_end else None
        self.stt: StageQueue[Utterance | EarlyUtterance] = StageQueue("stt")
        self.llm: StageQueue[Transcript] = StageQueue("llm")
        self.tts: StageQueue[ReplyText] = StageQueue("tts")

    def caller_audio(self, frame: InboundFrame) -> None:
        """A frame of the caller's audio: to be cleaned first, or straight to the VAD."""
        (self.denoise or self.vad).put(frame)

    def hear(self, item: Utterance | EarlyUtterance) -> None:
        self.stt.put(item)

    def answer(self, item: Transcript) -> None:
        self.llm.put(item)

    def speak(self, item: ReplyText) -> None:
        self.tts.put(item)

    def ask_backchannel(self, query: BackchannelQuery) -> None:
        self.backchannel.put(query)

    def ask_turn_end(self, query: TurnEndQuery) -> None:
        if self.turn_end is not None:
            self.turn_end.put(query)

    def cancel(self, generation: int) -> None:
        for inbox in (self.stt, self.llm, self.tts):
            inbox.cancel(generation)

    def speech_waiting(self) -> bool:
        return bool(self.tts.pending())

    def close(self) -> None:
        for inbox in (self.denoise, self.vad, self.backchannel, self.turn_end, self.stt, self.llm, self.tts):
            if inbox is not None:
                inbox.close()


def build_stages(
    ctx: StageContext,
    agent: AgentContext,
    inboxes: StageInboxes,
    engines: Engines,
    turns: TurnTaker,
    outbound: Outbound,
    settings: Settings,
    on_keys: Callable[[str], None],
) -> list[StageRunner]:
    """The call's stages, not started."""
    stages: list[StageRunner] = [
        VadStage(
            ctx.call_id, inboxes.vad, engines.vad_worker, turns, settings.keypad_timeout_ms / 1000, on_keys
        ),
        SttStage(ctx, inboxes.stt, engines.stt, inboxes.llm),
        BackchannelStage(
            ctx, inboxes.backchannel, engines.stt, BackchannelJudge.for_settings(settings), inboxes.vad
        ),
        LlmStage(ctx, agent, inboxes.llm, engines.llm, inboxes.tts),
        TtsStage(ctx, inboxes.tts, engines.tts, outbound),
    ]
    workers, denoiser = engines.denoise_workers, engines.denoiser
    if workers is not None and denoiser is not None and inboxes.denoise is not None:
        stages.insert(0, DenoiseStage(ctx.call_id, inboxes.denoise, workers, denoiser, inboxes.vad))
    if engines.turn_end is not None and inboxes.turn_end is not None:
        threshold = settings.turn_complete_threshold
        stages.append(TurnEndStage(ctx, inboxes.turn_end, engines.turn_end, threshold, inboxes.vad))
    return stages


class StageThreads:
    """A call's stage threads: started with it, joined at its end, and followed if one never stops."""

    def __init__(self, call_id: str, threads: list[StageRunner]) -> None:
        self.call_id = call_id
        self.threads = threads

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float) -> bool:
        """Wait for every thread (blocking); True if all ended."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            log.warning("threads_still_running", extra={"call_id": self.call_id, "threads": ",".join(alive)})
        return not alive

    def stuck(self) -> list[StageRunner]:
        """Threads still running after `join` gave up on them."""
        return [t for t in self.threads if t.is_alive()]

    def forget_ended(self) -> None:
        """Let go of the threads that ended (and the stages and model state they hold)."""
        self.threads = self.stuck()
