"""Turn-taking: from speech probabilities to turns, reopened turns and barge-ins.

Runs on the call's VAD thread, one VAD chunk (32 ms) at a time. It decides; the call acts (through
`TurnControl`). Pause fast, decide carefully:

- speech while nothing is pending starts a turn once it lasted `min_speech_ms` (shorter is a blip);
- `end_of_turn_ms` of silence (counted from where the audio fell quiet: pipeline/speech_level.py)
  closes the turn speculatively: the reply is computed at once, and a reopen grace window opens (the
  reply is held back until it passes); with an end-of-turn model
  (engines/turn_end.py, asked at the turn's first pause), a turn it calls complete closes after
  `turn_complete_ms` instead, with no grace;
- speech inside the grace window, or after it while the caller has heard nothing of the reply
  (pipeline/reopening.py), is a reopen candidate: `min_speech_ms` of it confirms (the new audio joins
  the old utterance as the next revision); less is a blip and the reply goes on untouched;
- speech while the agent talks (or prepares a reply) pauses the agent at the first chunk, then either
  resumes it or confirms a barge-in. Shorter than `min_speech_ms` it is a blip; longer than
  `backchannel_max_ms` it is the caller talking. In between, once `backchannel_ask_ms` of silence
  follows it, the audio goes to the call's backchannel check (Whisper, on another thread) while chunks
  keep coming; its verdict comes back through the VAD queue (`verdict`). A backchannel ("uh", "oh wow",
  a laugh) resumes the agent once the silence is as long as a blip's (a lone "uh" or "um", which often
  opens the caller's turn, once it is `filler_silence_ms`); words confirm the barge-in at
  once, even when more speech followed ("uh, wait"); more speech before a backchannel verdict asks
  again, on all of it. No verdict within `backchannel_wait_ms` confirms the barge-in: the caller spoke,
  and could not be told apart from a filler in time.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from parley import metrics
from parley.audio import PIPELINE_RATE, rms_dbfs
from parley.engines.stt import Transcription
from parley.pipeline.backchannels import is_lone_filler
from parley.pipeline.messages import BargeVerdict, TurnEndVerdict
from parley.pipeline.reopening import ReopenWindow
from parley.pipeline.turn_state import BackchannelCheck, ClosedTurn, Mode, Segment, TurnControl
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.turn_settings import TurnSettings

NEGATIVE_THRESHOLD_GAP = 0.15  # hysteresis: speech ends below threshold - gap (as silero's own iterator)
UNDECIDED_LIMIT_MS = 2000.0  # a candidate stuck between speech and silence is resolved after this


class TurnTaker:
    def __init__(
        self,
        settings: TurnSettings,
        tracker: SpeculativeTurnTracker,
        control: TurnControl,
        chunk_ms: float,
        reopen: ReopenWindow | None = None,
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        # Shared with the call's Outbound gate, which settles a turn when its reply is first heard.
        self.reopen = reopen or ReopenWindow(tracker)
        self.control = control
        self.chunk_ms = chunk_ms
        self.mode = Mode.IDLE
        self._now = 0.0  # when the chunk being taken arrived
        self._threshold = settings.vad_threshold
        self._negative = max(0.01, settings.vad_threshold - NEGATIVE_THRESHOLD_GAP)
        self._preroll: deque[np.ndarray] = deque(maxlen=max(1, int(settings.preroll_ms / chunk_ms)))
        self._segment = Segment()
        self._turn: tuple[str, int] | None = None
        self._turn_audio: list[np.ndarray] = []
        self._closed: ClosedTurn | None = None
        self._candidate: int | None = None
        self._early_sent_for = 0.0
        self._paused = False  # speech_paused was said for the current pause, speech_resumed not yet
        self._early_after_ms = float(settings.early_stt_ms)
        self._complete_at = 0.0  # the pause (its last speech chunk) the end-of-turn model called final
        # This barge-in candidate's backchannel checks, oldest first.
        self._checks: list[BackchannelCheck] = []
        self._requests = itertools.count(1)

    def process(self, chunk: np.ndarray, probability: float, arrived_at: float) -> None:
        """Take one VAD chunk and its speech probability; `arrived_at` is when its last frame arrived."""
        self._now = arrived_at
        is_speech = probability >= self._threshold
        is_silence = probability < self._negative
        closed = self._closed
        if closed is not None and self.mode is Mode.IDLE:
            if self._reopenable(closed, arrived_at):
                closed.tail.append(chunk)
            else:
                self._closed = None  # heard, acted on, or past its time: it can no longer be reopened
        elif closed is not None and self.mode is Mode.REOPEN:
            closed.tail.append(chunk)
        if self.mode is Mode.IDLE:
            if is_speech:
                self._on_onset(chunk, arrived_at)
            else:
                self._preroll.append(chunk)
            return
        level = rms_dbfs(chunk)
        # Silero lags a chunk or two behind the last word (pipeline/speech_level.py): a turn's silence
        # starts where its audio fell quiet.
        quiet = self.mode is Mode.SPEAKING and self._segment.level.is_quiet(level)
        if is_speech and not quiet:
            self._segment.level.heard_speech(level)
        self._segment.account(chunk, self.chunk_ms, is_speech, is_silence, quiet, arrived_at)
        if self.mode is Mode.TENTATIVE:
            self._decide_tentative()
        elif self.mode is Mode.SPEAKING:
            self._decide_speaking()
        elif self.mode is Mode.REOPEN:
            self._decide_reopen()
        elif self.mode is Mode.BARGE:
            self._decide_barge(arrived_at)

    def verdict(self, verdict: BargeVerdict) -> None:
        """The backchannel check's answer (VAD thread, in order with the audio)."""
        check = next((c for c in self._checks if c.request == verdict.request), None)
        if self.mode is not Mode.BARGE or check is None:
            return  # this candidate was decided meanwhile
        if not verdict.backchannel:
            # Words, even in part of what was said: the caller is talking. The transcript stands for the
            # turn's when nothing was said since.
            current = check.speech_ms == self._segment.speech_ms
            self._confirm_barge_in(verdict.heard if current else None)
            return
        check.backchannel = True
        check.heard = verdict.heard
        check.filler = verdict.heard is not None and is_lone_filler(verdict.heard.text)
        self._resume_if_settled()

    def turn_end_verdict(self, verdict: TurnEndVerdict) -> None:
        """The end-of-turn model's answer for a pause (VAD thread, in order with the audio): a turn it
        calls complete ends after `turn_complete_ms` of silence, at once if that much has passed."""
        seg = self._segment
        if self.mode is not Mode.SPEAKING or verdict.speech_end != seg.last_speech_at:
            return  # the caller spoke again since, or the turn has ended
        if verdict.complete:
            self._complete_at = verdict.speech_end
            if self._judged_complete():
                self._close_turn(seg.last_speech_at)

    def _judged_complete(self) -> bool:
        seg = self._segment
        return (
            self._complete_at == seg.last_speech_at != 0.0 and seg.quiet_ms >= self.settings.turn_complete_ms
        )

    def poll(self, now: float) -> None:
        """No audio came for a while (VAD thread; a peer that sends nothing in silence): the gap counts
        as silence for asking the backchannel check, and its time runs out as it would with audio."""
        if self.mode is not Mode.BARGE:
            return
        seg = self._segment
        if self._checks and self._checks[-1].speech_ms == seg.speech_ms:
            if self._check_overdue(self._checks[-1], now):
                self._confirm_barge_in()
        elif seg.speech_ms >= self.settings.min_speech_ms:
            self._ask(now)

    # onset

    def _on_onset(self, chunk: np.ndarray, arrived_at: float) -> None:
        self._segment = Segment(
            audio=[*self._preroll, chunk],
            speech_ms=self.chunk_ms,
            total_ms=self.chunk_ms,
            onset_arrived_at=arrived_at,
            last_speech_at=arrived_at,
        )
        self._segment.level.heard_speech(rms_dbfs(chunk))
        self._preroll.clear()
        closed = self._closed
        if closed is not None:
            if closed.first_onset is None and closed.tail:
                closed.first_onset = len(closed.tail) - 1  # this chunk, taken into the tail already
            unheard = self._unheard_window_left(closed, arrived_at)
            candidate = self.reopen.begin(closed.turn_id, closed.revision, unheard=unheard)
            if candidate is not None:
                self._candidate = candidate
                self.mode = Mode.REOPEN
                return
        if self.control.agent_active():
            self.control.pause_agent()
            self.mode = Mode.BARGE
            return
        self.mode = Mode.TENTATIVE

    def _unheard_window_left(self, closed: ClosedTurn, now: float) -> bool:
        return now - closed.closed_at <= self.settings.reopen_unheard_ms / 1000

    def _reopenable(self, closed: ClosedTurn, now: float) -> bool:
        unheard = self._unheard_window_left(closed, now)
        return self.reopen.is_open(closed.turn_id, closed.revision, unheard=unheard)

    # decisions per mode

    def _decide_tentative(self) -> None:
        seg = self._segment
        if seg.speech_ms >= self.settings.min_speech_ms:
            self._open_turn(self.control.open_turn(), 0, seg.audio)
        elif seg.silence_ms >= self.settings.blip_silence_ms or seg.total_ms >= UNDECIDED_LIMIT_MS:
            self._to_idle()

    def _decide_speaking(self) -> None:
        seg = self._segment
        self._turn_audio.extend(seg.audio)
        seg.audio = []
        if self._turn_samples() >= self.settings.max_turn_s * PIPELINE_RATE:
            # Capped: closed for good. Were it reopenable, speech going on would reopen it as a revision
            # holding all of it, transcribed again each time: work that grows without end.
            self._close_turn(seg.last_speech_at, reopenable=False)
        elif seg.quiet_ms >= self.settings.end_of_turn_ms or self._judged_complete():
            self._close_turn(seg.last_speech_at)
        elif self._paused and self._early_sent_for != seg.last_speech_at and self._turn is not None:
            self._paused = False
            self.control.speech_resumed(*self._turn)
        elif (
            0 < self._early_after_ms <= seg.silence_ms
            and self._early_sent_for != seg.last_speech_at
            and self._turn is not None
        ):
            if self._early_sent_for:
                # The last early transcript was wasted (speech went on): wait longer before the next one,
                # so a speaker with many short pauses costs a few extra transcriptions, not one per pause.
                self._early_after_ms = min(2 * self._early_after_ms, self.settings.end_of_turn_ms)
            self._early_sent_for = seg.last_speech_at
            self._paused = True
            turn_id, revision = self._turn
            audio = np.concatenate(self._turn_audio)
            self.control.speech_paused(turn_id, revision, audio, seg.last_speech_at)
            self.control.judge_turn_end(seg.last_speech_at, audio)

    def _decide_reopen(self) -> None:
        seg = self._segment
        closed = self._closed
        assert closed is not None and self._candidate is not None
        if seg.speech_ms >= self.settings.min_speech_ms:
            candidate = self._candidate
            self._candidate = None
            if self.tracker.confirm_reopen_candidate(closed.turn_id, closed.revision, candidate):
                metrics.REOPEN_CANDIDATES_TOTAL.labels(outcome="confirmed").inc()
                metrics.TURN_REVISIONS_TOTAL.inc()
                self.control.reopen_confirmed(closed.turn_id, closed.revision, candidate)
                # The tail already holds the new speech: the revision hears the whole utterance once.
                self._open_turn(closed.turn_id, candidate, closed.resumed_audio(self._preroll.maxlen or 1))
                return
            # Too late to reopen (committed meanwhile): this speech is a turn of its own.
            metrics.REOPEN_CANDIDATES_TOTAL.labels(outcome="timeout").inc()
            self._closed = None
            self.mode = Mode.TENTATIVE
            self._decide_tentative()
        elif seg.silence_ms >= self.settings.blip_silence_ms or seg.total_ms >= UNDECIDED_LIMIT_MS:
            self.tracker.cancel_reopen_candidate(closed.turn_id, self._candidate)
            self._candidate = None
            metrics.REOPEN_CANDIDATES_TOTAL.labels(outcome="cancelled").inc()
            self._to_idle()

    def _decide_barge(self, arrived_at: float) -> None:
        seg = self._segment
        ended = seg.silence_ms >= self.settings.blip_silence_ms or seg.total_ms >= UNDECIDED_LIMIT_MS
        if seg.speech_ms >= self.settings.backchannel_max_ms:
            self._confirm_barge_in()
        elif seg.speech_ms < self.settings.min_speech_ms:
            if ended:
                self._resume(None)  # too short for a word: a blip
        elif not self._checks or self._checks[-1].speech_ms != seg.speech_ms:
            # Asked after a little silence, not once the silence says the speech ended: Whisper's verdict
            # is then in about when the blip silence is over. Not at the first silent chunk: that may be
            # the closure of a final "p" whose release is still to come ("stop" over 8 kHz, asked at its
            # first silent chunk, was heard as "uh"; a chunk later, as a word), or the one inside "okay".
            if seg.silence_ms >= self.settings.backchannel_ask_ms or seg.total_ms >= UNDECIDED_LIMIT_MS:
                self._ask(arrived_at)
        elif self._check_overdue(self._checks[-1], arrived_at):
            self._confirm_barge_in()
        else:
            self._resume_if_settled()

    def _ask(self, now: float) -> None:
        request = next(self._requests)
        self._checks.append(BackchannelCheck(request, self._segment.speech_ms, now))
        self.control.check_backchannel(request, self._segment.samples(), self._segment.speech_ms)

    def _check_overdue(self, check: BackchannelCheck, now: float) -> bool:
        return check.backchannel is None and now - check.asked_at >= self.settings.backchannel_wait_ms / 1000

    def _resume_if_settled(self) -> None:
        """Resume once the newest check said "backchannel" for all that was said, and it has ended: after a
        blip's silence, or a longer one after a lone "uh" (the caller may be about to speak)."""
        seg = self._segment
        check = self._checks[-1] if self._checks else None
        if check is None or not check.backchannel or check.speech_ms != seg.speech_ms:
            return
        needed = self.settings.filler_silence_ms if check.filler else self.settings.blip_silence_ms
        if seg.silence_ms >= needed:
            self._resume(check.heard)

    # transitions

    def _resume(self, heard: Transcription | None) -> None:
        metrics.FALSE_INTERRUPTIONS_TOTAL.inc()
        self.control.resume_agent(heard.text if heard is not None else "")
        self._to_idle()

    def _confirm_barge_in(self, heard: Transcription | None = None) -> None:
        seg = self._segment
        self.control.interrupt_agent(seg.onset_arrived_at)
        self._closed = None
        self._checks = []
        self._open_turn(self.control.open_turn(), 0, seg.audio)
        if heard is not None and self._turn is not None:
            # The check already transcribed this speech: the turn uses that transcript if it ends here.
            turn_id, revision = self._turn
            self._early_sent_for = seg.last_speech_at
            self._paused = True
            audio = np.concatenate(self._turn_audio)
            self.control.speech_paused(turn_id, revision, audio, seg.last_speech_at, heard)
        self._decide_speaking()

    def _open_turn(self, turn_id: str, revision: int, audio: list[np.ndarray]) -> None:
        self.tracker.observe(turn_id, revision)
        self._turn = (turn_id, revision)
        self._turn_audio = list(audio)
        self._early_sent_for = 0.0
        self._paused = False
        self._early_after_ms = float(self.settings.early_stt_ms)
        self._complete_at = 0.0
        self._segment.audio = []
        self.mode = Mode.SPEAKING
        if revision == 0:
            self.control.user_started_speaking()

    def _turn_samples(self) -> int:
        return sum(part.size for part in self._turn_audio)

    def _close_turn(self, speech_end: float, *, reopenable: bool = True) -> None:
        assert self._turn is not None
        turn_id, revision = self._turn
        audio = np.concatenate(self._turn_audio) if self._turn_audio else np.zeros(0, dtype=np.int16)
        # The grace first: once the turn has ended, a reply started ahead of it (pipeline/speculation.py)
        # may play the moment the Outbound's gate is asked, and the gate must already see the grace.
        # A turn the end-of-turn model called complete is not held: a caller who goes on anyway still
        # reopens it while nothing of its reply has been heard (pipeline/reopening.py).
        if reopenable and not self._judged_complete():
            self.tracker.start_reopen_grace(turn_id, revision, self.settings.reopen_grace_ms / 1000)
        self.control.turn_ended(turn_id, revision, audio, speech_end)
        self._closed = ClosedTurn(turn_id, revision, audio, self._now) if reopenable else None
        self._turn = None
        self._turn_audio = []
        self._to_idle()

    def _to_idle(self) -> None:
        self.mode = Mode.IDLE
        self._segment = Segment()
        self._preroll.clear()
        self._checks = []

    def forget_audio(self) -> None:
        """Drop every buffer of caller audio (the call has ended)."""
        self._to_idle()
        self._turn = None
        self._turn_audio = []
        self._closed = None

    @property
    def in_turn(self) -> bool:
        return self.mode is Mode.SPEAKING
