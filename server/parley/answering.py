"""Who answered a call the agent dialled, and what its agent file says to do about it (`[voicemail]`:
agent/voicemail.py).

On an outbound call whose agent has `detect = true`, the agent says nothing at first: this check hears
the callee's audio on a thread of its own (amd_listener.py) and, while it decides, is the call's `Floor`
(turn_decisions.py) saying it is not listening, so no turn starts a reply. Then:

- `human` (and `ivr` or `unknown` with "talk", the default): the floor opens and the agent greets, as on
  any call. A person who said "Hello?" hears the greeting about a second later: the pause a person
  waits to be sure they were heard, plus the greeting's first audio; nobody speaking, after
  `silence_s` of silence;
- `machine` with "leave_message": the floor stays shut (the greeting is nobody's turn and cannot cut the
  agent); once the beep has ended (or the greeting went quiet, or at the cap) the agent says the message
  and the call ends as `voicemail` once it was played; with "hang_up", the call ends as `machine` at once.

The verdict goes out as the call's `{"type": "amd", "amd": {...}}` event, a `call.amd` event for the
team's backend, `parley_amd_total{result}`, the call's details (so `call.ended`), and its stored record
(`AmdRecords`, a registry observer).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from parley import metrics
from parley.agent.variables import Variables, spoken
from parley.agent.voicemail import Voicemail
from parley.amd import AmdTiming, Verdict
from parley.amd_listener import AmdListener
from parley.audio import PIPELINE_RATE
from parley.call_signals import CallSignals
from parley.engines.stt import SttEngine
from parley.engines.vad import VadEngine
from parley.log import CALL_ID, event
from parley.pipeline.queues import QueueClosed, StageQueue
from parley.pipeline.stages import StageRunner

log = logging.getLogger(__name__)

POLL_S = 0.05  # the stage looks at the time this often when no audio comes
# No audio for this long is silence (a phone that sends nothing while its user is quiet): the detector
# hears it as such, so that "Hello?" and then nothing is a person waiting, and the caps come on time.
GAP_S = 0.2
INBOX_FRAMES = 500  # 10 s of 20 ms frames: room for the audio that arrives while Whisper works

Publish = Callable[[str, dict[str, Any]], None]


class Models(Protocol):
    """The process's engines this check uses (engines/__init__.py's Engines)."""

    @property
    def vad(self) -> VadEngine: ...

    @property
    def stt(self) -> SttEngine: ...


class Speaker(Protocol):
    """What the check asks of the call's replies (replies.py)."""

    def say(self, text: str, *, key: str | None = None, then_hang_up: str = "") -> None: ...


class LineActions(Protocol):
    """What the check does to the line (agent_actions.py's AgentActions): hang up, tell the backend."""

    publish: Publish

    def hang_up(self, reason: str) -> None: ...


class Origin(Protocol):
    """Who the call is between (call_origin.py's CallContext): whether the agent dialled, and the
    variables the message is rendered with."""

    call_id: str
    outbound: bool

    def variables(self) -> Variables: ...


class AnsweringCheck:
    """One call's check; off (every method a no-op, the floor always open) unless the call is outbound
    and its agent asks for it. Thread-safe for its use: the transport pushes audio, the VAD thread asks
    the floor, the check's own stage decides and acts."""

    def __init__(
        self,
        policy: Voicemail,
        origin: Origin,
        models: Models,
        signals: CallSignals,
        replies: Speaker,
        actions: LineActions,
        greet: Callable[[], None],
        timing: AmdTiming | None = None,
    ) -> None:
        self.call_id = origin.call_id
        self.on = origin.outbound and policy.detect
        self.policy = policy
        self.origin = origin
        self.signals = signals
        self.replies = replies
        self.actions = actions
        self.greet = greet
        self.timing = timing or AmdTiming()
        self.action = ""  # what was done on the verdict: talk, leave_message, hang_up
        self.message_s: float | None = None  # when the message started (seconds since the answer)
        self._listening = not self.on
        self._ended = False
        self._listener: AmdListener | None = None
        self._inbox: StageQueue[np.ndarray] | None = None
        self._stage: AnsweringStage | None = None
        if self.on:
            self._listener = AmdListener(models.vad, models.stt, self.timing)
            self._inbox = StageQueue("amd", maxsize=INBOX_FRAMES)
            self._stage = AnsweringStage(self)
            signals.watch(self._call_event)

    # the call's side

    def listening(self) -> bool:
        """The call's Floor: whether the callee's speech is answered (once a person is known to be there)."""
        return self._listening

    def stages(self) -> list[StageRunner]:
        """The thread the call starts and joins with its stages (none when the check is off)."""
        return [self._stage] if self._stage is not None else []

    def hear(self, pcm: np.ndarray) -> None:
        """The callee's audio (16 kHz int16, as the pipeline gets it; never blocks)."""
        inbox = self._inbox
        if inbox is not None:
            inbox.put(pcm)

    def report(self) -> dict[str, Any]:
        """`{"amd": {...}}` for the call's details and record (`{}` when the check is off)."""
        listener = self._listener
        if listener is None:
            return {}
        verdict = listener.verdict
        if verdict is None and self._ended:
            verdict = Verdict("unknown", round(listener.now_s, 3), "ended")
        return {
            "amd": {
                "result": verdict.result if verdict else None,
                "decided_s": verdict.decided_s if verdict else None,
                "reason": verdict.reason if verdict else None,
                "beep_s": _round(listener.classifier.beep_s),
                "action": self.action or None,
                "message_s": _round(self.message_s),
            }
        }

    def _call_event(self, payload: dict[str, Any]) -> None:
        if payload.get("type") == "state" and payload.get("state") == "ended":
            self._ended = True
            if self._inbox is not None:
                self._inbox.close()  # the stage ends with its call

    # the stage's side (its thread)

    def run(self) -> None:
        listener, inbox = self._listener, self._inbox
        assert listener is not None and inbox is not None
        # Answered, and the agent working out who it is: not `listening`, which would start the idle
        # prompts' and the watchdog's silence clocks (idle.py, watchdog.py) on a greeting nobody answers.
        self.signals.set_state("thinking")
        heard_at = time.monotonic()
        try:
            while True:
                try:
                    item = inbox.get(POLL_S)
                except QueueClosed:
                    break
                now = time.monotonic()
                if isinstance(item, np.ndarray):
                    listener.hear(item)
                    heard_at = now
                elif now - heard_at >= GAP_S:
                    listener.hear(np.zeros(int(PIPELINE_RATE * (now - heard_at)), np.int16))
                    heard_at = now
                if not self._step(listener):
                    break
        finally:
            inbox.close()  # nothing more to hear: the transport's frames stop here
            if self.action == "":
                self._act(listener.classifier.give_up(listener.now_s))

    def _step(self, listener: AmdListener) -> bool:
        """Act on what was heard so far; False once nothing more needs hearing."""
        if self.action == "":
            verdict = listener.verdict
            return True if verdict is None else self._act(verdict)
        why = listener.message_due()
        if why is None:
            return True
        self._leave_message(listener, why)
        return False

    def _act(self, verdict: Verdict) -> bool:
        """Do what the agent file says for `verdict`; True while the message waits for its moment."""
        result, policy = verdict.result, self.policy
        hang_up = ""
        if result == "machine":
            self.action = policy.on_machine
            hang_up = "machine" if policy.on_machine == "hang_up" else ""
        else:
            choice = {"ivr": policy.on_ivr, "unknown": policy.on_unknown}.get(result, "talk")
            self.action = choice
            hang_up = ("ivr" if result == "ivr" else "amd_unknown") if choice == "hang_up" else ""
        self._announce(verdict)
        if self._ended:
            return False
        if hang_up:
            self.actions.hang_up(hang_up)
        elif self.action == "talk":
            self._listening = True
            self.greet()
        return self.action == "leave_message"

    def _announce(self, verdict: Verdict) -> None:
        metrics.AMD_TOTAL.labels(result=verdict.result).inc()
        if verdict.reason != "ended":
            metrics.AMD_DECISION_SECONDS.observe(verdict.decided_s)
        payload = self.report()["amd"]  # the verdict as the record keeps it (the message still to come)
        # Nested as in the record and call.ended: without transcripts, events lose any "result" field
        # at their top (a tool's result: records/redaction.py).
        self.signals.emit({"type": "amd", "amd": payload})
        self.actions.publish("call.amd", {"amd": payload})
        event(log, "amd_verdict", call_id=self.call_id, **payload)

    def recover(self) -> None:
        """The check failed: the callee is not left in silence. Whoever it is, the agent talks to them, or
        leaves the message it was waiting to leave."""
        listener = self._listener
        if self._ended or listener is None:
            return
        if self.action == "":
            self.action, self._listening = "talk", True
            self.greet()
        elif self.action == "leave_message" and self.message_s is None:
            self._leave_message(listener, "failed")

    def _leave_message(self, listener: AmdListener, why: str) -> None:
        self.message_s = round(listener.now_s, 3)
        beep_s = _round(listener.classifier.beep_s)
        self.signals.emit({"type": "voicemail", "reason": why, "beep_s": beep_s, "message_s": self.message_s})
        event(log, "voicemail_message", call_id=self.call_id, reason=why, beep_s=beep_s)
        # Said as the call's opening line; the call ends as "voicemail" once all of it was played.
        self.replies.say(spoken(self.policy.message, self.origin.variables()), then_hang_up="voicemail")


class AnsweringStage(threading.Thread):
    """The check's thread, started, joined and reported with the call's stages (a StageRunner)."""

    def __init__(self, check: AnsweringCheck) -> None:
        super().__init__(name=f"{check.call_id}:amd", daemon=True)
        self.check = check

    def run(self) -> None:
        token = CALL_ID.set(self.check.call_id)
        try:
            self.check.run()
        except Exception:
            # A failure here must not leave the callee unanswered: talk to whoever it is.
            log.exception("stage_failed", extra={"call_id": self.check.call_id, "stage": "amd"})
            metrics.ENGINE_ERRORS_TOTAL.labels(engine="amd").inc()
            self.check.recover()
        finally:
            CALL_ID.reset(token)


class _Answered(Protocol):
    """A call, as `AmdRecords` reads it (call.py's Call)."""

    @property
    def call_id(self) -> str: ...

    @property
    def answering(self) -> AnsweringCheck: ...


class AmdRecords:
    """A registry observer that keeps each checked call's verdict with its record (`keep(call_id, amd)`:
    the runtime's, to `CallRecords.keep_after(call_id, "amd", ...)`)."""

    def __init__(self, keep: Callable[[str, dict[str, Any]], None]) -> None:
        self.keep = keep

    def call_added(self, call: _Answered) -> None:
        pass

    def call_ended(self, call: _Answered) -> None:
        report = call.answering.report()
        if report:
            self.keep(call.call_id, report["amd"])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
