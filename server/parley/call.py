"""Call: one conversation, whatever transport carries it.

A transport hands caller audio to `push_audio` (mono int16 at the transport's rate, any length, never
blocks), keypad digits to `dtmf_received`, and pulls 20 ms frames from `outbound` at its own pace; the
call tells it about events and flushed audio through `attach`. The call is built once, with its parts,
and starts, ends and reports them:

- its signals (call_signals.py): its state, and the events its transport and watchers hear;
- its stages and their inboxes (pipeline/stage_set.py): VAD -> STT -> LLM -> TTS;
- its turn-taker (pipeline/turntaking.py) and the decisions it makes the call act on (turn_decisions.py);
- its replies (replies.py): each reply from its start to its commit as heard, and the Outbound;
- what the agent may do to its line (agent_actions.py), and who the call is between (call_origin.py).

`end()` stops everything it started; `join()` waits for the threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from parley import metrics
from parley.agent.agentfile import Agent, default_agent
from parley.agent.tools import ToolRunner
from parley.agent.variables import Variables, spoken, system_prompt
from parley.agent_actions import AgentActions, Line
from parley.answering import AnsweringCheck
from parley.audio import PIPELINE_RATE, ToRate
from parley.call_origin import CallContext, Origin
from parley.call_signals import CallListener, CallSignals, CallState
from parley.config import Settings
from parley.engines import Engines
from parley.log import event
from parley.pipeline.history import CALLER_TURN, Conversation
from parley.pipeline.messages import InboundFrame, KeypadDigit
from parley.pipeline.replying import AgentContext
from parley.pipeline.stage_set import StageInboxes, StageThreads, build_stages
from parley.pipeline.stages import StageContext, StageRunner
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.pipeline.turntaking import TurnTaker
from parley.recording import NOT_RECORDED, Recorder
from parley.replies import Replies
from parley.turn_decisions import TurnDecisions

log = logging.getLogger(__name__)

__all__ = ["Call", "CallListener", "CallState"]

Publish = Callable[[str, dict[str, Any]], None]


class Call:
    def __init__(
        self,
        call_id: str,
        transport: str,
        settings: Settings,
        engines: Engines,
        outbound_rate: int,
        agent: Agent | None = None,
        *,
        origin: Origin | None = None,
        line: Line | None = None,
        tool_runner: ToolRunner | None = None,
        publish: Publish | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.call_id = call_id
        self.transport = transport
        self.settings = settings
        self.engines = engines
        self.started_at = time.time()
        self.end_reason: str | None = None
        self.agent = agent or default_agent(settings.system_prompt, settings.greeting)
        self.origin = CallContext(call_id, transport, self.agent, origin or Origin())
        self.line = line
        self.tool_runner = tool_runner  # the process's tool workers
        # Where the call's events for the team's backend go (tool.called, call.transferred).
        self.publish: Publish = publish or (lambda kind, data: None)
        self.signals = CallSignals(call_id)
        self.tracker = SpeculativeTurnTracker()
        self.conversation = Conversation(
            settings.system_prompt, settings.history_turns, manners=settings.phone_manners
        )
        self.inboxes = StageInboxes(
            engines.vad.chunk_samples,
            turn_end=engines.turn_end is not None,
            denoise=engines.denoiser is not None,
        )
        self.replies = Replies(
            call_id,
            self.signals,
            self.inboxes,
            self.tracker,
            self.conversation,
            outbound_rate,
            line=line,
            apology=settings.apology,
            max_lost_turns=settings.max_engine_failures,
        )
        self.outbound = self.replies.outbound
        self.recording = recorder.record(call_id, self.agent, self.outbound) if recorder else NOT_RECORDED
        self._ended = threading.Event()
        self.actions = AgentActions(call_id, line, self.replies, self.publish, self._ended.is_set)
        self.answering = AnsweringCheck(
            self.agent.voicemail, self.origin, engines, self.signals, self.replies, self.actions, self.greet
        )
        self.decisions = TurnDecisions(
            call_id,
            self.replies,
            self.inboxes,
            self.signals,
            self.tracker,
            self.conversation,
            speculative=settings.speculative_replies,
            floor=self.answering,
        )
        chunk_ms = 1000 * engines.vad.chunk_samples / engines.vad.sample_rate
        self.turns = TurnTaker(settings, self.tracker, self.decisions, chunk_ms, self.replies.reopen)
        self.replies.follow(self.turns)
        self.threads = StageThreads(
            call_id,
            build_stages(
                StageContext(call_id, settings, self.conversation, self.replies, self.signals.emit),
                AgentContext(self.agent, self.actions, self.origin.variables, tool_runner, self.publish),
                self.inboxes,
                engines,
                self.turns,
                self.outbound,
                settings,
                self.decisions.keys_entered,
            )
            + self.answering.stages(),
        )
        self._to_pipeline = ToRate(PIPELINE_RATE)
        self._lock = threading.Lock()
        self._started = False
        self._greeted = False

    # lifecycle

    def start(self, *, greet: bool = True) -> None:
        """Start the stage threads; `greet=False` when the media connects later (WebRTC): the transport
        calls `greet()` then, so that an offer that never connects costs no synthesis."""
        self._started = True
        metrics.CALLS_ACTIVE.labels(transport=self.transport).inc()
        self.threads.start()
        event(log, "call_started", call_id=self.call_id, transport=self.transport)
        self.signals.emit({"type": "call", "call_id": self.call_id, "agent": self.agent.name})
        self.conversation.system_prompt = system_prompt(self.agent.system_prompt, self.variables())
        if greet and not self.answering.on:  # a checked call greets once a person is known to be there
            self.greet()

    def greet(self) -> None:
        """Say the agent's greeting (once; from any thread), or start listening when it has none."""
        with self._lock:
            if self._greeted or not self._started or self._ended.is_set():
                return
            self._greeted = True
        greeting = spoken(self.recording.opening(self.agent.greeting), self.variables())
        if greeting:
            self.replies.say(greeting)
        else:
            self.signals.set_state("listening")

    def end(self, reason: str = "hangup") -> bool:
        """Stop the call (idempotent, never blocks); True the first time."""
        with self._lock:
            if self._ended.is_set():
                return False
            self._ended.set()
            self.end_reason = reason
        self.inboxes.close()  # the end of the call jumps every stage's queue
        self.replies.end(reason)
        self.signals.set_state("ended")
        duration = time.time() - self.started_at
        metrics.CALLS_TOTAL.labels(transport=self.transport, outcome=reason).inc()
        if self._started:  # a call that failed to connect (busy, cancelled) was never active
            metrics.CALLS_ACTIVE.labels(transport=self.transport).dec()
            metrics.CALL_DURATION.observe(duration)
        event(log, "call_ended", call_id=self.call_id, reason=reason, duration_s=round(duration, 2))
        return True

    def join(self, timeout: float = 5.0) -> bool:
        """Wait for the stage threads (blocking: from asyncio, run it in a thread). True if all ended."""
        return self.threads.join(timeout)

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def stuck_threads(self) -> list[StageRunner]:
        """Stage threads still running after `join` gave up on them."""
        return self.threads.stuck()

    def release(self) -> None:
        """Drop what an ended call no longer needs (its transport and what it holds: the peer connection;
        audio; the stages and their model state), keeping what `details()` reports. After `join`."""
        self.signals.clear()
        self.line = None
        self.actions.line = None
        self.publish = lambda kind, data: None
        self.replies.release()
        self.turns.forget_audio()
        self.threads.forget_ended()

    def threads_alive(self) -> int:
        return len(self.threads.stuck())

    # the transport's side

    @property
    def state(self) -> CallState:
        return self.signals.state

    def set_state(self, state: CallState) -> None:
        """A transport's word on the call while it sets it up (dialing, ringing); the turns and replies
        set the rest (call_signals.py checks every transition)."""
        self.signals.set_state(state)

    def attach(self, listener: CallListener) -> None:
        """The transport that hears this call's events and flushes (set before `start`)."""
        self.signals.attach(listener)

    def watch(self, watcher: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Also hear this call's events (e.g. an operator's event stream); returns how to stop."""
        return self.signals.watch(watcher)

    def push_audio(self, pcm: np.ndarray, rate: int = PIPELINE_RATE) -> None:
        """Caller audio (mono int16 at `rate`), converted here, once, to the pipeline's 16 kHz."""
        if self._ended.is_set():
            return
        pcm = self._to_pipeline.convert(pcm, rate)
        if not pcm.size:
            return
        self.recording.caller(pcm)
        self.answering.hear(pcm)  # as received: a cleaner could take a beep for noise
        self.inboxes.caller_audio(InboundFrame(pcm))  # cleaned off this thread first with --denoise

    def dtmf_received(self, digit: str) -> None:
        """A keypad digit from the transport (already de-duplicated); never blocks."""
        if self._ended.is_set():
            return
        metrics.DTMF_DIGITS_TOTAL.labels(transport=self.transport).inc()
        event(log, "dtmf", call_id=self.call_id, digit=digit)
        self.signals.emit({"type": "dtmf", "digit": digit})
        self.inboxes.vad.put(KeypadDigit(digit))

    # reporting

    def variables(self) -> Variables:
        """What the agent's templates and tools know of the call, each value with its source."""
        return self.origin.variables()

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "transport": self.transport,
            "agent": self.agent.name,
            "caller": self.origin.caller,
            "called": self.origin.called,
            "started": self.started_at,
            "state": self.state,
            "turns": sum(CALLER_TURN in t["turn_id"] for t in self.conversation.snapshot()),
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
            "context": self.origin.values,
            **self.answering.report(),
            "ended_reason": self.end_reason,
            "recording": self.recording.describe(),
            "transcript": self.conversation.snapshot(),
        }
