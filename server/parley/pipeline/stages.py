"""The stage threads of a call: STT, the backchannel check and the turn-end check, each reading its own
queue, and the base every stage thread shares (the VAD stage, which the process's VAD worker runs, is in
vad_stage.py; the LLM stage in replying.py; the TTS stage in tts_stage.py).

A stage never waits on another stage: it reads its queue, does its work on the shared engine, and
puts the result on the next queue (or into the Outbound). Work whose revision or generation went
stale is skipped, and long work (generation, synthesis) checks staleness between tokens and chunks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import soundfile

from parley import metrics
from parley.agent.hold_sound import HoldSound
from parley.audio import PIPELINE_RATE
from parley.config import Settings
from parley.engines.stt import SttCancelled, SttEngine, Transcription
from parley.engines.turn_end import SmartTurn
from parley.engines.urgency import HELD, URGENCY
from parley.log import event
from parley.pipeline.backchannels import COMMAND_WORDS, BackchannelJudge
from parley.pipeline.history import Conversation
from parley.pipeline.messages import (
    BackchannelQuery,
    BargeVerdict,
    Cancel,
    EarlyUtterance,
    Response,
    Tag,
    Transcript,
    TurnEndQuery,
    TurnEndVerdict,
    Utterance,
)
from parley.pipeline.queues import QueueClosed, StageQueue
from parley.pipeline.unfinished import hold_until
from parley.pipeline.vad_stage import VadItem

log = logging.getLogger(__name__)

# A turn this short (preroll and trailing silence included) may be a "stop" that Whisper wrote as "Uh...":
# its first word is weighed (pipeline/backchannels.py).
WEIGHED_TURN_S = 2.5

Item = TypeVar("Item")


class ReplyControl(Protocol):
    """What stages ask of their call's replies (replies.py)."""

    def is_stale(self, tag: Tag) -> bool: ...

    def abandon(self, response: Response) -> None:
        """Nothing will be said for `response` (no words heard, or a stage failed)."""
        ...

    def emit_for(self, response: Response, payload: dict[str, Any]) -> None:
        """An event about `response`'s turn: held back while it is a speculative reply whose turn has not
        ended (pipeline/speculation.py), so a caller never sees the transcript of half a turn."""
        ...

    def apologise(self) -> None:
        """A model failed on the caller's turn: tell the caller (or end the call after too many)."""
        ...

    def hold(self, response: Response, until: float) -> None:
        """Let nothing of `response` be heard before `until` (time.monotonic()); its turn stays open to a
        reopen meanwhile (pipeline/unfinished.py)."""
        ...

    def wait_turn_ended(self, tag: Tag) -> bool:
        """Blocks while `tag` is a speculative reply whose turn is still being spoken; False when it was
        cancelled instead of adopted."""
        ...

    def settle(self, tag: Tag) -> bool:
        """Blocks until the turn `tag` answers can no longer be reopened; whether it is still the newest."""
        ...

    def loop_sound(self, tag: Tag, sound: HoldSound) -> None:
        """Play `sound` over and over under the reply `tag` while none of its audio waits."""
        ...

    def stop_sound(self) -> None:
        """Stop the looped sound at once."""
        ...


@dataclass(frozen=True)
class StageContext:
    """What stages need from their call: who it is, its settings and history, its replies, its events."""

    call_id: str
    settings: Settings
    conversation: Conversation
    replies: ReplyControl
    emit: Callable[[dict[str, Any]], None]


class StageRunner(Protocol):
    """What a call starts, joins and reports of a stage: its thread (a Stage), or the VAD stage, which the
    process's VAD worker runs."""

    name: str

    @property
    def ident(self) -> int | None: ...

    def start(self) -> None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...


class Stage(threading.Thread, Generic[Item]):
    """A thread that handles the items of one queue until the queue closes."""

    stage_name = "stage"
    engine_name = ""
    idle_timeout_s: float | None = None

    def __init__(self, ctx: StageContext, inbox: StageQueue[Item]) -> None:
        super().__init__(name=f"{ctx.call_id}:{self.stage_name}", daemon=True)
        self.ctx = ctx
        self.inbox = inbox

    def run(self) -> None:
        while True:
            try:
                item = self.inbox.get(self.idle_timeout_s)
            except QueueClosed:
                return
            if item is None:
                self.idle()
                continue
            if isinstance(item, Cancel):
                self.inbox.drop_stale(item)  # a barge-in: what waits of the cancelled reply goes unheard
                continue
            # Engines shared by many calls serve the most urgent work first, and hold what should wait
            # (engines/urgency.py).
            urgency = URGENCY.set(self.due(item))
            held = HELD.set(self.held(item))
            try:
                self.handle(item)
            except Exception:
                metrics.ENGINE_ERRORS_TOTAL.labels(engine=self.engine_name or self.stage_name).inc()
                log.exception("stage_failed", extra={"call_id": self.ctx.call_id, "stage": self.stage_name})
                self.recover(item)
            finally:
                HELD.reset(held)
                URGENCY.reset(urgency)

    def due(self, item: Item) -> Callable[[], float] | None:
        """When the engine work for `item` is due (engines/urgency.py); None: when it is asked for."""
        return None

    def held(self, item: Item) -> Callable[[], bool] | None:
        """Whether the engine work for `item` should wait now (engines/urgency.py); None: never."""
        return None

    def handle(self, item: Item) -> None:
        raise NotImplementedError

    def idle(self) -> None:
        """Called when `idle_timeout_s` passed without an item (by default, nothing to do)."""

    def recover(self, item: Item) -> None:
        """After a failure on `item`: leave the call consistent (by default, nothing to do)."""


class SttStage(Stage[Utterance | EarlyUtterance]):
    """Transcribes turns. At a short pause it transcribes the turn so far; if the turn then ends with no
    more speech, that transcript is used and the end of the turn no longer waits for Whisper. When the
    pause started a speculative reply, its transcript goes on to the LLM at once."""

    stage_name = "stt"
    engine_name = "stt"

    def __init__(
        self,
        ctx: StageContext,
        inbox: StageQueue[Utterance | EarlyUtterance],
        stt: SttEngine,
        outbox: StageQueue[Transcript],
    ):
        super().__init__(ctx, inbox)
        self.stt = stt
        self.outbox = outbox
        self._early: tuple[EarlyUtterance, Transcription] | None = None

    def handle(self, item: Utterance | EarlyUtterance) -> None:
        if isinstance(item, EarlyUtterance):
            self._transcribe_ahead(item)
            return
        response = item.response
        if self.ctx.replies.is_stale(response.tag):
            return
        if self.ctx.settings.debug_audio_dir:
            self._keep_audio(item)
        response.mark("stt_start")
        result = self._transcript_ahead(item) or self.stt.transcribe(
            item.audio, weigh=self._weigh(item.audio)
        )
        self._early = None
        self._answer(response, result)

    def _transcribe_ahead(self, item: EarlyUtterance) -> None:
        draft = item.draft
        if draft is not None and self.ctx.replies.is_stale(draft.tag):
            return  # the caller went on: the speculative reply was cancelled while it waited here
        if item.heard is not None:
            result = item.heard
        elif draft is None and self.inbox.any(lambda queued: isinstance(queued, Utterance | EarlyUtterance)):
            return  # only the newest pause matters: an utterance or a later pause queued behind this wins
        else:
            if draft is not None:
                draft.mark("stt_start")
            try:
                # A draft cancelled while its audio waits for Whisper (the caller went on) is dropped
                # there: under load, most pauses inside a question would otherwise cost a transcription.
                result = self.stt.transcribe(
                    item.audio, wanted=self._wanted(draft), weigh=self._weigh(item.audio)
                )
            except SttCancelled:
                return
        self._early = (item, result)
        if draft is not None:
            self._answer(draft, result)

    def _weigh(self, audio: np.ndarray) -> tuple[str, ...]:
        """A turn as short as a "stop" is asked whether it began with one, whatever Whisper wrote."""
        if audio.size > WEIGHED_TURN_S * PIPELINE_RATE or self.ctx.settings.backchannel_command_odds <= 0:
            return ()
        return COMMAND_WORDS

    def _wanted(self, draft: Response | None) -> Callable[[], bool] | None:
        if draft is None:
            return None  # transcribed ahead for the utterance that may follow: wanted until it comes
        return lambda: not self.ctx.replies.is_stale(draft.tag)

    def _answer(self, response: Response, result: Transcription) -> None:
        response.mark("transcript")
        response.stt_s = result.seconds
        metrics.STAGE_LATENCY.labels(stage="stt").observe(result.seconds)
        if self.ctx.replies.is_stale(response.tag):
            return
        tag = response.tag
        assert tag.turn_id is not None and tag.revision is not None
        response.user_text = result.text
        self.ctx.conversation.set_user_text(tag.turn_id, tag.revision, result.text)
        event(
            log,
            "user_said",
            call_id=self.ctx.call_id,
            turn_id=tag.turn_id,
            revision=tag.revision,
            text=result.text,
            stt_s=round(result.seconds, 3),
        )
        if not result.text:
            self.ctx.replies.abandon(response)
            return
        self._hold_if_unfinished(response, result.text)
        self.ctx.replies.emit_for(
            response,
            {
                "type": "user_transcript",
                "turn_id": tag.turn_id,
                "revision": tag.revision,
                "text": result.text,
            },
        )
        self.outbox.put(Transcript(response, result.text, result.odds_of(COMMAND_WORDS)))

    def _hold_if_unfinished(self, response: Response, text: str) -> None:
        """A transcript that stops mid-sentence ("... a table for") holds its reply longer: the caller
        has likely only paused (pipeline/unfinished.py)."""
        if response.speech_end is None:
            return
        until = hold_until(text, response.speech_end, self.ctx.settings)
        if until > time.monotonic():
            response.mark("held_unfinished")
            metrics.UNFINISHED_HOLDS_TOTAL.inc()
            self.ctx.replies.hold(response, until)

    def _transcript_ahead(self, item: Utterance) -> Transcription | None:
        if self._early is None:
            return None
        early, result = self._early
        tag = item.response.tag
        same_speech = (early.turn_id, early.revision, early.speech_end) == (
            tag.turn_id,
            tag.revision,
            item.response.speech_end,
        )
        return result if same_speech else None

    def recover(self, item: Utterance | EarlyUtterance) -> None:
        if isinstance(item, EarlyUtterance) and item.draft is not None:
            item.draft.mark("stt_failed")  # not adopted: the end of the turn transcribes it again
        if isinstance(item, Utterance):
            self.ctx.replies.abandon(item.response)
            if not self.ctx.replies.is_stale(item.response.tag):
                self.ctx.replies.apologise()

    def _keep_audio(self, item: Utterance) -> None:
        tag = item.response.tag
        folder = Path(self.ctx.settings.debug_audio_dir)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{tag.turn_id}.r{tag.revision}.wav".replace(":", "_")
        soundfile.write(str(folder / name), item.audio, PIPELINE_RATE, subtype="PCM_16")


class BackchannelStage(Stage[BackchannelQuery]):
    """Judges speech heard over the paused agent off the VAD thread: Whisper (ahead of the utterances
    waiting for it), then the judge; the verdict goes back into the VAD queue."""

    stage_name = "backchannel"
    engine_name = "stt"

    def __init__(
        self,
        ctx: StageContext,
        inbox: StageQueue[BackchannelQuery],
        stt: SttEngine,
        judge: BackchannelJudge,
        verdicts: StageQueue[VadItem],
    ):
        super().__init__(ctx, inbox)
        self.stt = stt
        self.judge = judge
        self.verdicts = verdicts

    def handle(self, item: BackchannelQuery) -> None:
        if self.inbox.any(lambda _: True):
            return  # a newer query holds all this one's audio and more: the turn-taker waits for that one
        heard = self.stt.transcribe(item.audio, urgent=True, weigh=self.judge.weigh)
        verdict = self.judge.judge(heard, item.speech_ms)
        event(
            log,
            "backchannel_check",
            call_id=self.ctx.call_id,
            backchannel=verdict.backchannel,
            reason=verdict.reason,
            text=heard.text,
            logprob=round(heard.avg_logprob, 2),
            command_odds=round(heard.odds_of(self.judge.weigh), 4),
            stt_s=round(heard.seconds, 3),
        )
        self.verdicts.put(BargeVerdict(item.request, verdict.backchannel, verdict.reason, heard))

    def recover(self, item: BackchannelQuery) -> None:
        # The agent is paused waiting for this: a failed check lets the caller have the turn.
        self.verdicts.put(BargeVerdict(item.request, False, "failed", None))


class TurnEndStage(Stage[TurnEndQuery]):
    """Asks the end-of-turn model whether the caller has finished, off the VAD thread; the verdict goes
    back into the VAD queue."""

    stage_name = "turn_end"
    engine_name = "turn_end"

    def __init__(
        self,
        ctx: StageContext,
        inbox: StageQueue[TurnEndQuery],
        model: SmartTurn,
        threshold: float,
        verdicts: StageQueue[VadItem],
    ):
        super().__init__(ctx, inbox)
        self.model = model
        self.threshold = threshold
        self.verdicts = verdicts

    def handle(self, item: TurnEndQuery) -> None:
        if self.inbox.any(lambda _: True):
            return  # the caller spoke and paused again: only the newest pause can still end the turn
        (probability,) = self.model.complete([item.audio])
        complete = probability >= self.threshold
        metrics.TURN_END_VERDICTS_TOTAL.labels(outcome="complete" if complete else "incomplete").inc()
        event(
            log,
            "turn_end_verdict",
            logging.DEBUG,
            call_id=self.ctx.call_id,
            complete=complete,
            probability=round(probability, 3),
        )
        self.verdicts.put(TurnEndVerdict(item.speech_end, complete, probability))
