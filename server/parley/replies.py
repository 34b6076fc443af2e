"""A call's replies, each from its start to its commit: the one owner of what the agent is saying.

A reply starts when a turn ends (`start`), or at the turn's first pause as a draft (`start_draft`,
pipeline/speculation.py) that the end of the turn adopts (`adopt`) or drops unheard (`cancel_draft`).
Speech over it pauses it (`pause`), a backchannel resumes it (`resume`), a barge-in cuts it (`interrupt`),
a reopened turn supersedes it (`supersede`), the end of the call stops it (`end`). However it ends, the
caller's share of it is committed as heard (`commit`): into the history, the tracker and the events.

The stages ask here whether their work went stale (`is_stale`), hold a reply whose turn may go on
(`hold`), give one up (`abandon`) and apologise for a lost turn; the Outbound asks whether audio may
play (`may_play`) and reports what was heard (`on_segment_started`, `on_response_ended`). A cancel
reaches the stages as a message in their priority lane (pipeline/queues.py), through `ReplyInboxes`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from parley import metrics
from parley.agent.hold_sound import HoldSound
from parley.call_signals import CallSignals
from parley.log import event
from parley.outbound import Outbound
from parley.pipeline.cancel import CancelScope
from parley.pipeline.history import Conversation
from parley.pipeline.messages import EndOfCall, ReplyText, Response, Tag
from parley.pipeline.reopening import ReopenWindow
from parley.pipeline.speculation import SpeculativeReplies
from parley.pipeline.turns import SpeculativeTurnTracker

log = logging.getLogger(__name__)

GREETING_KEY = "greeting"  # the greeting's turn in the history and in events


class ReplyInboxes(Protocol):
    """The stages' inboxes, as the replies reach them."""

    def cancel(self, generation: int) -> None:
        """Tell every reply stage that work before `generation` is stale (their priority lane)."""
        ...

    def speak(self, item: ReplyText) -> None:
        """Hand reply text to the TTS stage."""
        ...

    def speech_waiting(self) -> bool:
        """Whether reply text waits for the TTS stage."""
        ...


class HangUp(Protocol):
    """The part of the call's line the replies use: the agent said goodbye, or cannot go on."""

    def hang_up(self, reason: str) -> None: ...


class TurnPosition(Protocol):
    """Whether the caller is in the middle of a turn (pipeline/turntaking.py's TurnTaker)."""

    @property
    def in_turn(self) -> bool: ...


class Replies:
    """One per call. Thread-safe: the VAD thread starts, cuts and adopts replies; the stage threads ask
    about them; the transport's puller reports what was heard."""

    def __init__(
        self,
        call_id: str,
        signals: CallSignals,
        inboxes: ReplyInboxes,
        tracker: SpeculativeTurnTracker,
        conversation: Conversation,
        outbound_rate: int,
        *,
        line: HangUp | None = None,
        apology: str = "",
        max_lost_turns: int = 0,
    ) -> None:
        self.call_id = call_id
        self.signals = signals
        self.inboxes = inboxes
        self.tracker = tracker
        self.conversation = conversation
        self.line = line
        self.apology = apology
        self.max_lost_turns = max_lost_turns
        self.scope = CancelScope()
        self.reopen = ReopenWindow(tracker)  # a turn can be reopened until its reply is heard
        self.speculation = SpeculativeReplies()  # the reply started at a pause, before its turn ended
        self.outbound = Outbound(outbound_rate, gate=self.may_play, listener=self)
        self.turns: TurnPosition | None = None
        self._lock = threading.Lock()
        self._active: Response | None = None  # the reply on its way now: the one a barge-in cuts
        self._hang_up_due = False  # the agent said goodbye: hang up once the caller heard it
        self._last_line: tuple[Response, str] | None = None  # a line said, then the hang-up's reason
        self._lost_turns = 0  # turns an engine failed on (apologised for)
        self._ended = threading.Event()

    def follow(self, turns: TurnPosition) -> None:
        """The call's turn-taker, asked whether the caller is mid-turn when a reply ends (made after this,
        since it acts through the turn decisions, which act through this)."""
        self.turns = turns

    # starting replies

    def start(self, turn_id: str, revision: int, speech_end: float, user_text: str = "") -> Response:
        """The reply to a turn that has ended: on its way now."""
        self.scope.new_response()
        response = Response(Tag(turn_id, revision, self.scope.generation), speech_end, user_text)
        self._make_active(response)
        return response

    def start_draft(self, turn_id: str, revision: int, speech_end: float) -> Response:
        """A reply to the turn so far, at its pause, held until the turn ends (replacing any draft)."""
        self.cancel_draft()
        self.scope.new_response()
        draft = Response(Tag(turn_id, revision, self.scope.generation), speech_end=speech_end)
        self.speculation.start(draft)
        self._make_active(draft)
        return draft

    def adopt(self, turn_id: str, revision: int, speech_end: float) -> list[dict[str, Any]] | None:
        """The turn ended: the draft made for exactly this speech is its reply. Returns the events held
        back for it, or None when there is no such draft (a draft whose transcription failed is dropped:
        the turn is transcribed again)."""
        draft = self.speculation.draft()
        if draft is not None and "stt_failed" in draft.marks:
            self.cancel_draft()
        adopted = self.speculation.adopt(turn_id, revision, speech_end)
        return None if adopted is None else adopted[1]

    def cancel_draft(self) -> None:
        """The caller went on past the pause: the draft goes, unheard (its audio was held at the gate)."""
        draft = self.speculation.take()
        if draft is None:
            return
        self._cancel()
        if draft.tag.turn_id is not None and draft.tag.revision is not None:
            self.reopen.release(draft.tag.turn_id, draft.tag.revision)  # held for speech that went on
        self._drop_active(draft)
        event(log, "speculation_wasted", logging.DEBUG, call_id=self.call_id, turn_id=draft.tag.turn_id)

    def say(self, text: str, *, key: str | None = None, then_hang_up: str = "") -> None:
        """Speak `text` outside any turn (the greeting, an apology, an idle prompt), kept in the history
        under `key` (the greeting's when None). `then_hang_up`: once the caller has heard all of it, the
        call ends with that reason; a line the caller cuts by speaking leaves the call up."""
        response = Response(Tag(key, None, self.scope.generation))
        if then_hang_up:
            self._last_line = (response, then_hang_up)
        self._make_active(response)
        self.inboxes.speak(ReplyText(response, text))
        self.inboxes.speak(ReplyText(response, "", final=True))

    # speech over the agent

    def pause(self) -> float:
        return self.outbound.pause()

    def resume(self) -> None:
        self.outbound.resume()

    def interrupt(self) -> list[Response]:
        """A barge-in: every reply on its way stops, kept as far as the caller heard it. Returns those cut."""
        self._cancel()
        cut = self._cut()
        for response in cut:
            self.commit(response, interrupted=True)
        return cut

    def supersede(self) -> bool:
        """The caller reopened the turn before hearing its reply: the reply goes, unheard. Whether one was
        on its way."""
        self._cancel()
        self.outbound.flush()
        superseded = self._take_active() is not None
        if superseded:
            metrics.COMMITS_TOTAL.labels(outcome="superseded").inc()
        return superseded

    def end(self, reason: str) -> None:
        """The call ended: a reply cut by the hang-up is kept as far as the caller heard it, as one cut by
        speech is; the end goes out after it."""
        self._ended.set()
        self.scope.cancel()  # the stages' inboxes close with the call: no message needed
        for response in self._cut(with_draft=True):
            self.commit(response, interrupted=True)
        self.outbound.push(EndOfCall(reason))

    # the agent's side

    def loop_sound(self, tag: Tag, sound: HoldSound) -> None:
        """Play `sound` over and over under the reply `tag` while none of its audio waits (a tool runs
        long), until `stop_sound` or the reply is cut; no words of the reply are heard in it."""
        self.outbound.loop(tag, sound.at(self.outbound.rate))

    def stop_sound(self) -> None:
        """The looped sound stops at once, mid-clip (the tool's result came)."""
        self.outbound.stop_loop()

    def hang_up_after_reply(self) -> None:
        """The agent said goodbye (end_call): the call hangs up once the caller has heard the reply."""
        self._hang_up_due = True

    def apologise(self) -> None:
        """A model failed on the caller's turn (raised, or timed out): the caller hears a short apology and
        may say it again. After `max_lost_turns` the call ends ("engine_error"): talking on to an agent
        that cannot answer helps no one."""
        with self._lock:
            self._lost_turns += 1
            lost = self._lost_turns
        if self._ended.is_set():
            return
        event(log, "turn_lost", logging.WARNING, call_id=self.call_id, lost_turns=lost)
        if self.max_lost_turns and lost >= self.max_lost_turns and self.line is not None:
            self.line.hang_up("engine_error")
        elif self.apology:
            self.say(self.apology)

    # what the stages ask

    @property
    def generation(self) -> int:
        return self.scope.generation

    def is_stale(self, tag: Tag) -> bool:
        return self.scope.is_stale(tag.generation) or not self.tracker.is_latest(tag.turn_id, tag.revision)

    def abandon(self, response: Response) -> None:
        """Nothing will be said for this response (no words heard, or a stage failed)."""
        self._drop_active(response)
        self.inboxes.speak(ReplyText(response, "", final=True))

    def emit_for(self, response: Response, payload: dict[str, Any]) -> None:
        """An event about `response`'s turn: held back while it is a draft whose turn has not ended, so a
        caller never sees the transcript of half a turn."""
        if not self.speculation.hold_event(response, payload):
            self.signals.emit(payload)

    def hold(self, response: Response, until: float) -> None:
        """Let nothing of `response` be heard before `until` (time.monotonic()); its turn stays open to a
        reopen meanwhile (pipeline/unfinished.py)."""
        tag = response.tag
        if tag.turn_id is None or tag.revision is None:
            return
        self.reopen.hold(tag.turn_id, tag.revision, until)
        if self.is_stale(tag):  # cancelled meanwhile: the hold must not hold this revision's next reply
            self.reopen.release(tag.turn_id, tag.revision)

    def wait_turn_ended(self, tag: Tag) -> bool:
        """Block until the turn `tag` answers has ended (its draft adopted); False when that reply was
        cancelled instead, or the call ended."""
        while not self.speculation.wait(tag, 0.05):
            if self.is_stale(tag) or self._ended.is_set():
                return False
        return not self.is_stale(tag)

    def settle(self, tag: Tag) -> bool:
        """Wait until the turn `tag` answers can no longer be reopened; whether it is still the newest."""
        assert tag.turn_id is not None and tag.revision is not None
        return self.reopen.settle(tag.turn_id, tag.revision) and not self.is_stale(tag)

    def active(self) -> bool:
        """Whether a reply is on its way or audio is still queued for the caller."""
        return self._active is not None or self.outbound.has_audio()

    def speaking(self) -> bool:
        """Whether the agent has words on their way to the caller (being synthesised, queued, playing)."""
        active = self._active
        synthesising = (
            active is not None and "first_piece" in active.marks and not active.audio_ready.is_set()
        )
        return synthesising or self.inboxes.speech_waiting() or self.outbound.has_audio()

    # the Outbound's gate and listener

    def may_play(self, tag: Tag) -> bool | None:
        """None holds audio back (its turn has not ended, its grace is left, or a reopen candidate is
        pending), False drops it. True settles the turn: once the caller hears its reply, speech is a
        barge-in, no longer a reopen (pipeline/reopening.py)."""
        if self.scope.should_drop(tag.generation):
            return False
        if self.speculation.holds(tag):
            return None
        return self.reopen.try_settle(tag.turn_id, tag.revision)

    def on_segment_started(self, response: Response, text: str, first: bool) -> None:
        key = turn_key(response)
        if first:
            self.signals.set_state("agent_speaking")
            latency = response.response_s
            if latency is not None:
                metrics.RESPONSE_LATENCY.observe(latency)
            self.signals.emit(
                {
                    "type": "latency",
                    "turn_id": key,
                    "response_s": _round(latency),
                    "stt_s": _round(response.stt_s),
                    "llm_first_token_s": _round(response.llm_first_token_s),
                    "tts_first_audio_s": _round(response.tts_first_audio_s),
                    "timeline": response.timeline(),
                }
            )
            event(log, "reply_started", call_id=self.call_id, turn_id=key, response_s=_round(latency))
        if text:
            self.signals.emit({"type": "agent_text", "turn_id": key, "text": text})

    def on_response_ended(self, response: Response, latest: bool) -> None:
        self.scope.response_done(response.tag.generation)
        self._drop_active(response)
        if latest and not self.scope.is_stale(response.tag.generation):
            self.commit(response, interrupted=False)
            last_line = self._last_line
            if last_line is not None and last_line[0] is response and self.line is not None:
                self.line.hang_up(last_line[1])  # the caller has now heard all of the closing line
            elif self._hang_up_due and self.line is not None:
                self.line.hang_up("agent_hangup")  # the caller has now heard all of the goodbye
        if not self.active() and not (self.turns is not None and self.turns.in_turn):
            self.signals.set_state("listening")

    def on_end_of_call(self, reason: str) -> None:
        self.signals.set_state("ended")

    def on_flushed(self) -> None:
        self.signals.audio_flushed()

    def commit(self, response: Response, *, interrupted: bool) -> None:
        """The reply enters the history as far as the caller heard it."""
        tag = response.tag
        key = turn_key(response)
        heard = response.heard_text()
        if tag.turn_id is not None and tag.revision is not None:
            self.tracker.commit(tag.turn_id, tag.revision)
        self.conversation.commit_agent(key, heard, interrupted=interrupted, response_s=response.response_s)
        outcome = "interrupted" if interrupted else "committed"
        metrics.COMMITS_TOTAL.labels(outcome=outcome).inc()
        self.signals.emit({"type": "agent_done", "turn_id": key, "text": heard, "interrupted": interrupted})
        event(log, "reply_committed", call_id=self.call_id, turn_id=key, outcome=outcome, text=heard)

    def release(self) -> None:
        """After the call: drop the audio and the reply it held."""
        self.line = None
        self._take_active()
        self.outbound.flush()

    # the one way work is cancelled

    def _cancel(self) -> None:
        """Everything started before now is stale: each stage drops it at its next token, chunk or item."""
        self.scope.cancel()
        self.inboxes.cancel(self.scope.generation)

    def _cut(self, *, with_draft: bool = False) -> list[Response]:
        """Stop every reply on its way to the caller (its audio flushed, the active one taken): those cut,
        each knowing what of it was heard. A draft for a turn still being spoken is left out (nothing of
        it was heard, and the turn goes on) unless `with_draft` (the call is over)."""
        draft = self.speculation.take()
        cut = [r for r in self.outbound.flush() if r is not draft]
        active = self._take_active()
        for response in (active, draft if with_draft else None):
            if response is not None and response not in cut and (with_draft or response is not draft):
                cut.append(response)
        return cut

    def _make_active(self, response: Response) -> None:
        with self._lock:
            self._active = response

    def _take_active(self) -> Response | None:
        with self._lock:
            active, self._active = self._active, None
        return active

    def _drop_active(self, response: Response) -> None:
        with self._lock:
            if self._active is response:
                self._active = None


def turn_key(response: Response) -> str:
    """The response's turn in the history and in events (the greeting has no turn of its own)."""
    return response.tag.turn_id or GREETING_KEY


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
