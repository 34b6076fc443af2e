"""Call: one conversation, whatever transport carries it.

A transport hands caller audio to `push_audio` (mono int16 at the transport's rate, any length, never
blocks), keypad digits to `dtmf_received`, and pulls 20 ms frames from `outbound` at its own pace; the
call tells it about events and flushed audio through `attach`. The call owns its stage threads and
queues, its turn tracker, cancel scope and history, and acts on the turn-taker's decisions: pause,
resume, interrupt, reopen. `end()` stops everything it started; `join()` waits for the threads.
Beside it: the turn-taker's decisions (call_turns.py), what the caller hears of each reply and its commit
(call_replies.py), and what the agent does to its line (call_actions.py).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import numpy as np

from parley import metrics
from parley.agent.agentfile import Agent, default_agent
from parley.agent.tools import ToolRunner
from parley.agent.variables import CALLER, SERVICE_NAMES, TOKEN, Source, Variables, spoken, system_prompt
from parley.audio import PIPELINE_RATE, StreamResampler
from parley.call_actions import AgentActions, Line
from parley.call_replies import GREETING_KEY, HeardReplies
from parley.call_turns import TurnDecisions
from parley.config import Settings
from parley.engines import Engines
from parley.log import event
from parley.outbound import Outbound
from parley.pipeline.backchannels import BackchannelJudge
from parley.pipeline.cancel import CancelScope
from parley.pipeline.history import Conversation
from parley.pipeline.messages import (
    BackchannelQuery,
    EarlyUtterance,
    EndOfCall,
    InboundFrame,
    KeypadDigit,
    ReplyText,
    Response,
    Tag,
    Transcript,
    TurnEndQuery,
    Utterance,
)
from parley.pipeline.queues import StageQueue
from parley.pipeline.reopening import ReopenWindow
from parley.pipeline.replying import LlmStage
from parley.pipeline.speculation import SpeculativeReplies
from parley.pipeline.stages import BackchannelStage, StageRunner, SttStage, TurnEndStage
from parley.pipeline.tts_stage import TtsStage
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.pipeline.turntaking import TurnTaker
from parley.pipeline.vad_stage import VadInbox, VadStage

log = logging.getLogger(__name__)

# What the caller's page and /api/calls show of a call. A transport sets the first ones (dialing,
# ringing) before the call starts; the turns and replies set the rest; "ended" is for good.
CallState = Literal[
    "starting", "dialing", "ringing", "listening", "user_speaking", "thinking", "agent_speaking", "ended"
]


class CallListener(Protocol):
    """What a call tells its transport; called from any thread, must not block."""

    def deliver_event(self, payload: dict[str, Any]) -> None: ...

    def audio_flushed(self) -> None: ...


INBOUND_QUEUE_FRAMES = 250  # 5 s of audio: beyond that the VAD is hopelessly behind; drop the oldest


class Call:
    def __init__(
        self,
        call_id: str,
        transport: str,
        settings: Settings,
        engines: Engines,
        outbound_rate: int,
        agent: Agent | None = None,
    ) -> None:
        self.call_id = call_id
        self.transport = transport
        self.settings = settings
        self.engines = engines
        self.started_at = time.time()
        self.state: CallState = "starting"
        self.end_reason: str | None = None
        self.caller = ""  # who calls (a SIP From URI, a phone number), when the transport knows
        self.called = ""  # who was called (the SIP request-URI / To, the number dialled)
        # Variables a token or the caller set (take_context): what the agent file lets a call set.
        self.context: dict[str, str] = {}
        self._context_sources: dict[str, Source] = {}
        self.tracker = SpeculativeTurnTracker()
        self.reopen = ReopenWindow(self.tracker)  # a turn can be reopened until its reply is heard
        self.scope = CancelScope()
        self.speculation = SpeculativeReplies()  # the reply started at a pause, before its turn ended
        self.conversation = Conversation(
            settings.system_prompt, settings.history_turns, manners=settings.phone_manners
        )
        self.replies = HeardReplies(self)  # what the caller hears of each reply, and its commit
        self.outbound = Outbound(outbound_rate, gate=self._may_play, listener=self.replies)
        self._listener: CallListener | None = None
        self.agent = agent or default_agent(settings.system_prompt, settings.greeting)
        # Where the call's events for the team's backend go (tool.called, call.transferred); set by the
        # events outbox when --events-url is set.
        self.publish: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
        self.line: Line | None = None
        self.tool_runner: ToolRunner | None = None  # the process's tool workers, once the call is opened
        self.actions = AgentActions(self)  # what the agent may do to its line, once a transport has it
        self._watchers: list[Callable[[dict[str, Any]], None]] = []
        self._resampler: StreamResampler | None = None
        self._lock = threading.Lock()
        self._active: Response | None = None
        self._ended = threading.Event()
        self._started = False
        self._greeted = False
        self._lost_turns = 0  # turns an engine failed on (apologised for)

        self.vad_in = VadInbox(engines.vad.chunk_samples, maxsize=INBOUND_QUEUE_FRAMES)
        self.backchannel_in: StageQueue[BackchannelQuery] = StageQueue("backchannel")
        # Asked at each pause when the process has an end-of-turn model (engines/turn_end.py).
        self.turn_end_in: StageQueue[TurnEndQuery] | None = (
            StageQueue("turn_end") if engines.turn_end is not None else None
        )
        self.stt_in: StageQueue[Utterance | EarlyUtterance] = StageQueue("stt")
        self.llm_in: StageQueue[Transcript] = StageQueue("llm")
        self.tts_in: StageQueue[ReplyText] = StageQueue("tts")
        chunk_ms = 1000 * engines.vad.chunk_samples / engines.vad.sample_rate
        self.decisions = TurnDecisions(self)
        self.turns = TurnTaker(settings, self.tracker, self.decisions, chunk_ms, self.reopen)
        self._threads: list[StageRunner] = [
            VadStage(
                call_id,
                self.vad_in,
                engines.vad_worker,
                self.turns,
                settings.keypad_timeout_ms / 1000,
                self.decisions.keys_entered,
            ),
            SttStage(self, self.stt_in, engines.stt, self.llm_in),
            BackchannelStage(
                self,
                self.backchannel_in,
                engines.stt,
                BackchannelJudge.for_settings(settings),
                self.vad_in,
            ),
            LlmStage(self, self.llm_in, engines.llm, self.tts_in),
            TtsStage(self, self.tts_in, engines.tts, self.outbound),
        ]
        if engines.turn_end is not None and self.turn_end_in is not None:
            self._threads.append(
                TurnEndStage(
                    self, self.turn_end_in, engines.turn_end, settings.turn_complete_threshold, self.vad_in
                )
            )

    # lifecycle

    def start(self, *, greet: bool = True) -> None:
        """Start the stage threads; `greet=False` when the media connects later (WebRTC): the transport
        calls `greet()` then, so that an offer that never connects costs no synthesis."""
        self._started = True
        metrics.CALLS_ACTIVE.labels(transport=self.transport).inc()
        for thread in self._threads:
            thread.start()
        event(log, "call_started", call_id=self.call_id, transport=self.transport)
        self.emit({"type": "call", "call_id": self.call_id, "agent": self.agent.name})
        self.conversation.system_prompt = system_prompt(self.agent.system_prompt, self.variables())
        if greet:
            self.greet()

    def greet(self) -> None:
        """Say the agent's greeting (once; from any thread), or start listening when it has none."""
        with self._lock:
            if self._greeted or not self._started or self._ended.is_set():
                return
            self._greeted = True
        greeting = spoken(self.agent.greeting, self.variables())
        if greeting:
            self._say(greeting)
        else:
            self._set_state("listening")

    def apologise(self) -> None:
        """A model failed on the caller's turn (raised, or timed out): the caller hears a short apology and
        may say it again. After `max_engine_failures` lost turns the call ends ("engine_error"): talking
        on to an agent that cannot answer helps no one."""
        with self._lock:
            self._lost_turns += 1
            lost = self._lost_turns
        if self._ended.is_set():
            return
        event(log, "turn_lost", logging.WARNING, call_id=self.call_id, lost_turns=lost)
        limit = self.settings.max_engine_failures
        if limit and lost >= limit and self.line is not None:
            self.line.hang_up("engine_error")
        elif self.settings.apology:
            self._say(self.settings.apology)

    def agent_speaking(self) -> bool:
        """Whether the agent has words on their way to the caller (being synthesised, queued, playing)."""
        active = self._active
        synthesising = (
            active is not None and "first_piece" in active.marks and not active.audio_ready.is_set()
        )
        return synthesising or bool(self.tts_in.pending()) or self.outbound.has_audio()

    def take_context(self, values: Mapping[str, str], source: Source) -> None:
        """Variables for this call from a call token's claims (`TOKEN`) or from the caller (`CALLER`: the
        offer's context, a carrier's parameters, SIP headers). A caller sets only what the agent file
        declares, and never what a token set; nobody sets the service's own names. Before `start`."""
        dropped = []
        for name, value in values.items():
            if name in SERVICE_NAMES:
                continue  # a carrier's parameters name the parties too: the call has them already
            bound = self._context_sources.get(name) == TOKEN
            if source == CALLER and (bound or not self.agent.caller_may_set(name)):
                dropped.append(name)
                continue
            self.context[name] = value
            self._context_sources[name] = source
        if dropped:
            metrics.VARIABLES_DROPPED_TOTAL.labels(transport=self.transport).inc(len(dropped))
            event(
                log, "variables_dropped", logging.DEBUG, call_id=self.call_id, names=",".join(dropped)[:200]
            )

    def variables(self) -> Variables:
        """What the agent's templates and tools know of the call, each value with its source: the
        context, and what the service knows itself (the parties as the peer named them are the caller's
        word)."""
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        values = {
            **self.context,
            "call_id": self.call_id,
            "transport": self.transport,
            "caller": self.caller,
            "called": self.called,
            "now": now,
        }
        sources: dict[str, Source] = {**self._context_sources, "caller": CALLER, "called": CALLER}
        return Variables(values, sources)

    def end(self, reason: str = "hangup") -> bool:
        """Stop the call (idempotent, never blocks); True the first time."""
        with self._lock:
            if self._ended.is_set():
                return False
            self._ended.set()
            self.end_reason = reason
        self.scope.cancel()
        for q in (self.vad_in, self.backchannel_in, self.turn_end_in, self.stt_in, self.llm_in, self.tts_in):
            if q is not None:
                q.close()
        # A hang-up cuts a reply as speech over it does: it is kept as far as the caller heard it.
        for response in self.cut_replies(with_draft=True):
            self.replies.commit(response, interrupted=True)
        self.outbound.push(EndOfCall(reason))
        self._set_state("ended")
        duration = time.time() - self.started_at
        metrics.CALLS_TOTAL.labels(transport=self.transport, outcome=reason).inc()
        if self._started:  # a call that failed to connect (busy, cancelled) was never active
            metrics.CALLS_ACTIVE.labels(transport=self.transport).dec()
            metrics.CALL_DURATION.observe(duration)
        event(log, "call_ended", call_id=self.call_id, reason=reason, duration_s=round(duration, 2))
        return True

    def join(self, timeout: float = 5.0) -> bool:
        """Wait for the stage threads (blocking: from asyncio, run it in a thread). True if all ended."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("threads_still_running", extra={"call_id": self.call_id, "threads": ",".join(alive)})
        return not alive

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def stuck_threads(self) -> list[StageRunner]:
        """Stage threads still running after `join` gave up on them."""
        return [t for t in self._threads if t.is_alive()]

    def release(self) -> None:
        """Drop what an ended call no longer needs (its transport and what it holds: the peer connection;
        audio; the stages and their model state), keeping what `details()` reports. After `join`."""
        self._listener = None
        self._watchers = []
        self.line = None
        self.publish = lambda kind, data: None
        self.take_active()
        self.outbound.flush()
        self.turns.forget_audio()
        self._threads = [t for t in self._threads if t.is_alive()]

    def threads_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    # the transport's side

    def attach(self, listener: CallListener) -> None:
        """The transport that hears this call's events and flushes (set before `start`)."""
        self._listener = listener

    def push_audio(self, pcm: np.ndarray, rate: int = PIPELINE_RATE) -> None:
        """Caller audio (mono int16 at `rate`), converted here, once, to the pipeline's 16 kHz."""
        if self._ended.is_set():
            return
        if rate != PIPELINE_RATE:
            if self._resampler is None or self._resampler.rate_in != rate:
                self._resampler = StreamResampler(rate, PIPELINE_RATE)
            pcm = self._resampler.process(pcm)
            if not pcm.size:
                return
        self.vad_in.put(InboundFrame(pcm))

    def dtmf_received(self, digit: str) -> None:
        """A keypad digit from the transport (already de-duplicated); never blocks."""
        if self._ended.is_set():
            return
        metrics.DTMF_DIGITS_TOTAL.labels(transport=self.transport).inc()
        event(log, "dtmf", call_id=self.call_id, digit=digit)
        self.emit({"type": "dtmf", "digit": digit})
        self.vad_in.put(KeypadDigit(digit))

    def watch(self, watcher: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Also hear this call's events (e.g. an operator's event stream); returns how to stop."""
        self._watchers = [*self._watchers, watcher]

        def unwatch() -> None:
            self._watchers = [w for w in self._watchers if w is not watcher]

        return unwatch

    def audio_flushed(self) -> None:
        """Tell the transport that the audio queued for the caller was dropped (a carrier clears its own)."""
        listener = self._listener
        if listener is not None:
            try:
                listener.audio_flushed()
            except Exception:
                log.exception("flush_notice_failed", extra={"call_id": self.call_id})

    def emit(self, payload: dict[str, Any]) -> None:
        for deliver in (self._listener.deliver_event if self._listener else None, *self._watchers):
            if deliver is None:
                continue
            try:
                deliver(payload)
            except Exception:
                log.exception("event_delivery_failed", extra={"call_id": self.call_id})

    def set_state(self, state: CallState) -> None:
        """The call's state as its turns, its replies or its transport (before it starts) see it."""
        self._set_state(state)

    def _set_state(self, state: CallState) -> None:
        if self.state != state and (state == "ended" or self.state != "ended"):
            self.state = state
            self.emit({"type": "state", "state": state})

    # stage context

    def is_stale(self, tag: Tag) -> bool:
        return self.scope.is_stale(tag.generation) or not self.tracker.is_latest(tag.turn_id, tag.revision)

    def reply_abandoned(self, response: Response) -> None:
        """Nothing will be said for this response (no words heard, or a stage failed)."""
        self.drop_active(response)
        self.tts_in.put(ReplyText(response, "", final=True))

    def emit_for_reply(self, response: Response, payload: dict[str, Any]) -> None:
        if not self.speculation.hold_event(response, payload):
            self.emit(payload)

    def hold_reply(self, response: Response, until: float) -> None:
        tag = response.tag
        if tag.turn_id is None or tag.revision is None:
            return
        self.reopen.hold(tag.turn_id, tag.revision, until)
        if self.is_stale(tag):  # cancelled meanwhile: the hold must not hold this revision's next reply
            self.reopen.release(tag.turn_id, tag.revision)

    def _may_play(self, tag: Tag) -> bool | None:
        """The Outbound's gate: None holds audio back (its turn has not ended, its grace is left, or a
        reopen candidate is pending), False drops it. True settles the turn: once the caller hears its
        reply, speech is a barge-in, no longer a reopen (pipeline/reopening.py)."""
        if self.scope.should_drop(tag.generation):
            return False
        if self.speculation.holds(tag):
            return None
        return self.reopen.try_settle(tag.turn_id, tag.revision)

    def wait_turn_ended(self, tag: Tag) -> bool:
        """Block until the turn `tag` answers has ended (its speculative reply adopted); False when that
        reply was cancelled instead, or the call ended."""
        while not self.speculation.wait(tag, 0.05):
            if self.is_stale(tag) or self._ended.is_set():
                return False
        return not self.is_stale(tag)

    # what the stages and the turn decisions share

    def make_active(self, response: Response) -> None:
        """`response` is the reply on its way now (the one a barge-in cuts)."""
        with self._lock:
            self._active = response

    def cut_replies(self, *, with_draft: bool = False) -> list[Response]:
        """Stop every reply on its way to the caller (its audio flushed, the active one taken): those cut,
        each knowing what of it was heard. A draft for a turn still being spoken is left out (nothing of
        it was heard, and the turn goes on) unless `with_draft` (the call is over)."""
        draft = self.speculation.take()
        cut = [r for r in self.outbound.flush() if r is not draft]
        active = self.take_active()
        for response in (active, draft if with_draft else None):
            if response is not None and response not in cut and (with_draft or response is not draft):
                cut.append(response)
        return cut

    def take_active(self) -> Response | None:
        with self._lock:
            active, self._active = self._active, None
        return active

    def drop_active(self, response: Response) -> None:
        """`response` is no longer on its way (if it still was)."""
        with self._lock:
            if self._active is response:
                self._active = None

    def agent_active(self) -> bool:
        return self._active is not None or self.outbound.has_audio()

    def flush_stage_queues(self) -> None:
        for q in (self.stt_in, self.llm_in, self.tts_in):
            q.flush()

    def _say(self, text: str) -> None:
        response = Response(Tag(None, None, self.scope.generation))
        self.make_active(response)
        self.tts_in.put(ReplyText(response, text))
        self.tts_in.put(ReplyText(response, "", final=True))

    # reporting

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "transport": self.transport,
            "agent": self.agent.name,
            "caller": self.caller,
            "called": self.called,
            "started": self.started_at,
            "state": self.state,
            "turns": sum(1 for t in self.conversation.snapshot() if t["turn_id"] != GREETING_KEY),
        }

    def record(self) -> dict[str, Any]:
        """The call as a team's backend gets it at its end: the transcript as heard, the outcome, the
        tool calls and the latencies."""
        transcript = self.conversation.snapshot()
        return {
            **self.details(),
            "agent": self.agent.name,
            "outcome": self.end_reason,
            "ended": time.time() if self.ended else None,
            "tool_calls": self.conversation.tool_calls(),
            "response_s": [t["response_s"] for t in transcript if t.get("response_s") is not None],
        }

    def details(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "context": self.context,
            "ended_reason": self.end_reason,
            "transcript": self.conversation.snapshot(),
        }
