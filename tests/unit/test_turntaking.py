"""Turn-taking decisions from speech probabilities (32 ms chunks), with the real turn tracker."""

from __future__ import annotations

import time

import numpy as np
import pytest

from parley.config import Settings
from parley.engines.stt import Transcription
from parley.pipeline.messages import BargeVerdict
from parley.pipeline.turn_state import Mode
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.pipeline.turntaking import TurnTaker
from tests.unit.test_speech_level import tone

CHUNK_MS = 32.0
CHUNK = np.zeros(512, dtype=np.int16)


class Control:
    def __init__(self) -> None:
        self.active = False
        self.log: list[str] = []
        self.ended: list[tuple[str, int, int]] = []
        self.checks: list[tuple[int, int]] = []  # (request, audio samples) asked of the backchannel check
        self.ahead: list[Transcription] = []
        self.judged: list[tuple[float, int]] = []  # (pause, audio samples) asked of the end-of-turn model
        self.turns = 0

    def agent_active(self) -> bool:
        return self.active

    def pause_agent(self) -> float:
        self.log.append("pause")
        return time.monotonic()

    def resume_agent(self, heard: str) -> None:
        self.log.append("resume")

    def interrupt_agent(self, onset_arrived_at: float) -> None:
        self.log.append("interrupt")
        self.active = False

    def open_turn(self) -> str:
        self.turns += 1
        return f"turn-{self.turns}"

    def user_started_speaking(self) -> None:
        self.log.append("speaking")

    def turn_ended(self, turn_id: str, revision: int, audio: np.ndarray, speech_end: float) -> None:
        self.ended.append((turn_id, revision, audio.size))

    def speech_paused(
        self,
        turn_id: str,
        revision: int,
        audio: np.ndarray,
        speech_end: float,
        heard: Transcription | None = None,
    ) -> None:
        if heard is not None:
            self.ahead.append(heard)
        else:
            self.log.append("paused")

    def speech_resumed(self, turn_id: str, revision: int) -> None:
        self.log.append("resumed")

    def reopen_confirmed(self, turn_id: str, base: int, candidate: int) -> None:
        self.log.append(f"reopen {turn_id} {base}->{candidate}")

    def check_backchannel(self, request: int, audio: np.ndarray, speech_ms: float) -> None:
        self.log.append("check")
        self.checks.append((request, audio.size))

    def judge_turn_end(self, speech_end: float, audio: np.ndarray) -> None:
        self.judged.append((speech_end, audio.size))


@pytest.fixture
def setup() -> tuple[TurnTaker, Control, SpeculativeTurnTracker]:
    settings = Settings(
        min_speech_ms=200,
        end_of_turn_ms=300,
        reopen_grace_ms=600,
        blip_silence_ms=160,
        backchannel_max_ms=700,
        backchannel_wait_ms=1000,
    )
    tracker = SpeculativeTurnTracker()
    control = Control()
    return TurnTaker(settings, tracker, control, CHUNK_MS), control, tracker


class Clock:
    """When each chunk arrived: chunks arrive 32 ms apart, however fast a test feeds them."""

    now = time.monotonic()


def feed(taker: TurnTaker, probability: float, ms: float) -> None:
    for _ in range(round(ms / CHUNK_MS)):
        Clock.now += CHUNK_MS / 1000
        taker.process(CHUNK, probability, Clock.now)


def test_speech_then_silence_makes_one_turn(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    feed(taker, 0.9, 800)
    assert control.log == ["speaking"] and not control.ended
    feed(taker, 0.0, 400)
    assert [(t, r) for t, r, _ in control.ended] == [("turn-1", 0)]
    assert taker.mode is Mode.IDLE


def test_a_blip_is_not_a_turn(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    feed(taker, 0.9, 96)
    feed(taker, 0.0, 600)
    assert control.ended == [] and control.turns == 0


def test_speech_inside_grace_reopens_the_turn_as_next_revision(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, tracker = setup
    feed(taker, 0.9, 800)
    feed(taker, 0.0, 320)
    assert tracker.has_pending_reopen_or_grace("turn-1", 0)
    feed(taker, 0.9, 64)
    assert taker.mode is Mode.REOPEN and tracker.has_pending_reopen("turn-1", 0)
    feed(taker, 0.9, 200)
    assert "reopen turn-1 0->1" in control.log
    assert not tracker.is_latest("turn-1", 0) and tracker.is_latest("turn-1", 1)
    feed(taker, 0.9, 300)
    feed(taker, 0.0, 400)
    (_, _, first_size), (turn, revision, second_size) = control.ended
    assert (turn, revision) == ("turn-1", 1)
    assert second_size > first_size  # the old utterance and the new speech, together


def test_a_blip_inside_grace_cancels_the_candidate_and_the_reply_goes_on(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, tracker = setup
    feed(taker, 0.9, 800)
    feed(taker, 0.0, 320)
    feed(taker, 0.9, 64)
    feed(taker, 0.0, 200)
    assert not tracker.has_pending_reopen("turn-1", 0)
    assert tracker.is_latest("turn-1", 0)
    assert len(control.ended) == 1


def test_speech_over_the_agent_pauses_then_a_blip_resumes(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    control.active = True
    feed(taker, 0.9, 96)
    assert control.log == ["pause"]
    feed(taker, 0.0, 200)
    assert control.log == ["pause", "resume"]


def test_long_speech_over_the_agent_interrupts_and_starts_a_turn(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    control.active = True
    feed(taker, 0.9, 800)
    assert control.log[:2] == ["pause", "interrupt"]
    assert taker.mode is Mode.SPEAKING
    feed(taker, 0.0, 400)
    assert [(t, r) for t, r, _ in control.ended] == [("turn-1", 0)]


def checked_over_the_agent(taker: TurnTaker, control: Control, speech_ms: float = 320) -> None:
    """Speech over the talking agent, then the silence after which the backchannel check is asked."""
    control.active = True
    feed(taker, 0.9, speech_ms)
    feed(taker, 0.0, 64)


def answer(taker: TurnTaker, control: Control, backchannel: bool, text: str, *, which: int = -1) -> None:
    """The backchannel check's verdict on a request it was asked, as the VAD queue delivers it."""
    request = control.checks[which][0]
    heard = Transcription(text, no_speech_prob=0.1, seconds=0.2, avg_logprob=-0.5)
    taker.verdict(BargeVerdict(request, backchannel, "test", heard))


def test_short_speech_over_the_agent_is_checked_without_waiting_and_chunks_keep_flowing(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    control.active = True
    feed(taker, 0.9, 320)
    assert control.log == ["pause"]  # the agent is paused at once; nothing asked while speech goes on
    feed(taker, 0.0, 32)
    assert control.log == ["pause"]  # one silent chunk may be the closure of a final "p" or "t"
    feed(taker, 0.0, 32)
    assert control.log == ["pause", "check"]  # asked after 64 ms of silence, long before the blip's 160
    feed(taker, 0.0, 600)
    assert control.log == ["pause", "check"]  # still paused: neither resumed nor cut without a verdict
    assert taker.mode is Mode.BARGE


def test_a_backchannel_resumes_the_agent_once_its_silence_is_a_blips(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    checked_over_the_agent(taker, control)
    answer(taker, control, True, "Oh wow.")
    assert "resume" not in control.log  # 64 ms of silence: the caller may go on
    feed(taker, 0.0, 128)
    assert control.log == ["pause", "check", "resume"]
    assert taker.mode is Mode.IDLE and control.turns == 0


def test_words_over_the_agent_interrupt_as_soon_as_the_verdict_is_in(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    control.active = True
    feed(taker, 0.9, 320)
    feed(taker, 0.0, 320)
    answer(taker, control, False, "No.")
    assert control.log[:3] == ["pause", "check", "interrupt"]
    assert [(t, r) for t, r, _ in control.ended] == [("turn-1", 0)]  # 320 ms of silence: the turn is over
    assert [h.text for h in control.ahead] == ["No."]  # and the check's transcript stands for the turn's


def test_a_filler_then_words_interrupts(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    control.active = True
    feed(taker, 0.9, 256)  # "uh,"
    feed(taker, 0.0, 64)
    feed(taker, 0.9, 256)  # "wait"
    answer(taker, control, True, "Uh.", which=0)  # the verdict on "uh" alone comes too late to matter
    assert "resume" not in control.log
    feed(taker, 0.0, 64)
    assert len(control.checks) == 2 and control.checks[1][1] > control.checks[0][1]  # asked again, on all
    answer(taker, control, False, "Uh, wait.")
    assert "interrupt" in control.log and "resume" not in control.log


def test_words_in_an_older_check_interrupt_even_while_the_caller_goes_on(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    control.active = True
    feed(taker, 0.9, 256)  # "no"
    feed(taker, 0.0, 64)
    feed(taker, 0.9, 96)  # "no, ..."
    answer(taker, control, False, "No.", which=0)
    assert "interrupt" in control.log and taker.mode is Mode.SPEAKING
    assert control.ahead == []  # the transcript of a part is not the turn's


def test_no_verdict_in_time_lets_the_caller_have_the_turn(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    control.active = True
    feed(taker, 0.9, 320)
    feed(taker, 0.0, 1100)
    assert control.log[:3] == ["pause", "check", "interrupt"]


def test_after_a_lone_uh_the_agent_waits_longer_before_resuming(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    checked_over_the_agent(taker, control)
    answer(taker, control, True, "Uh...")
    feed(taker, 0.0, 288)  # past a blip's silence: an "okay" would have resumed it by now
    assert "resume" not in control.log
    feed(taker, 0.0, 64)  # 416 ms of silence in all
    assert control.log == ["pause", "check", "resume"]


def test_words_after_a_lone_uh_cut_the_agent_without_resuming_it_first(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    checked_over_the_agent(taker, control)  # "uh,"
    answer(taker, control, True, "Uh...")
    feed(taker, 0.0, 160)  # the comma's pause
    feed(taker, 0.9, 320)  # "wait"
    feed(taker, 0.0, 64)
    assert control.log == ["pause", "check", "check"]  # asked again, on all of it; never resumed
    answer(taker, control, False, "Uh, wait.")
    assert control.log[:4] == ["pause", "check", "check", "interrupt"] and "resume" not in control.log


def test_a_verdict_for_a_decided_candidate_changes_nothing(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    checked_over_the_agent(taker, control)
    feed(taker, 0.9, 800)  # long speech: a barge-in without waiting for the check
    assert control.log.count("interrupt") == 1
    answer(taker, control, True, "Uh.", which=0)
    answer(taker, control, False, "Uh.", which=0)
    assert control.log.count("interrupt") == 1 and "resume" not in control.log


def test_a_short_pause_transcribes_the_turn_ahead_once() -> None:
    control = Control()
    taker = TurnTaker(
        Settings(early_stt_ms=120, end_of_turn_ms=300), SpeculativeTurnTracker(), control, CHUNK_MS
    )
    feed(taker, 0.9, 600)
    feed(taker, 0.0, 160)
    assert control.log == ["speaking", "paused"]
    feed(taker, 0.0, 64)
    assert control.log.count("paused") == 1
    feed(taker, 0.0, 200)
    assert len(control.ended) == 1


def test_a_speaker_with_many_short_pauses_gets_few_early_transcriptions() -> None:
    control = Control()
    taker = TurnTaker(
        Settings(early_stt_ms=32, end_of_turn_ms=300), SpeculativeTurnTracker(), control, CHUNK_MS
    )
    for _ in range(8):
        feed(taker, 0.9, 300)
        feed(taker, 0.0, 100)  # a short pause: each used to cost a transcription
    assert 1 <= control.log.count("paused") <= 4
    assert control.ended == []


def short_grace(**settings: int) -> tuple[TurnTaker, Control, SpeculativeTurnTracker]:
    """A turn-taker whose grace (real time, the tracker's) is over after a short sleep."""
    tracker = SpeculativeTurnTracker()
    control = Control()
    config = Settings(min_speech_ms=200, end_of_turn_ms=300, reopen_grace_ms=50, **settings)  # type: ignore[arg-type]
    return TurnTaker(config, tracker, control, CHUNK_MS), control, tracker


def close_a_turn_and_outlive_its_grace(taker: TurnTaker, tracker: SpeculativeTurnTracker) -> None:
    feed(taker, 0.9, 800)
    feed(taker, 0.0, 320)
    time.sleep(0.1)
    assert not tracker.has_pending_reopen_or_grace("turn-1", 0)


def test_after_the_grace_speech_still_reopens_the_turn_while_its_reply_is_unheard() -> None:
    taker, control, tracker = short_grace()
    close_a_turn_and_outlive_its_grace(taker, tracker)
    feed(taker, 0.0, 640)  # the reply is still being computed: nothing of it has been heard
    feed(taker, 0.9, 300)
    assert "reopen turn-1 0->1" in control.log and control.turns == 1
    feed(taker, 0.0, 400)
    assert [(t, r) for t, r, _ in control.ended] == [("turn-1", 0), ("turn-1", 1)]


def test_once_the_reply_is_heard_speech_is_a_barge_in_not_a_reopen() -> None:
    taker, control, tracker = short_grace()
    close_a_turn_and_outlive_its_grace(taker, tracker)
    assert taker.reopen.try_settle("turn-1", 0) is True  # the gate let the reply's first audio through
    control.active = True
    feed(taker, 0.9, 64)
    assert taker.mode is Mode.BARGE and control.log[-1] == "pause"
    assert not tracker.has_pending_reopen("turn-1", 0)


def test_a_reply_is_held_while_a_reopen_candidate_is_pending_and_goes_on_after_a_blip() -> None:
    taker, control, tracker = short_grace()
    close_a_turn_and_outlive_its_grace(taker, tracker)
    feed(taker, 0.9, 64)
    assert taker.mode is Mode.REOPEN
    assert taker.reopen.try_settle("turn-1", 0) is None  # the gate holds the reply back
    feed(taker, 0.0, 200)  # a blip
    assert taker.reopen.try_settle("turn-1", 0) is True
    assert control.ended == [("turn-1", 0, control.ended[0][2])] and "reopen" not in " ".join(control.log)


def test_speech_long_after_an_unheard_reply_is_a_turn_of_its_own() -> None:
    taker, control, tracker = short_grace(reopen_unheard_ms=500)
    close_a_turn_and_outlive_its_grace(taker, tracker)
    feed(taker, 0.0, 640)
    feed(taker, 0.9, 300)
    assert control.turns == 2 and not any(entry.startswith("reopen") for entry in control.log)


def test_without_the_unheard_window_only_the_grace_reopens() -> None:
    taker, control, tracker = short_grace(reopen_unheard_ms=0)
    close_a_turn_and_outlive_its_grace(taker, tracker)
    feed(taker, 0.9, 300)
    assert control.turns == 2 and not any(entry.startswith("reopen") for entry in control.log)


def feed_chunk(taker: TurnTaker, chunk: np.ndarray, probability: float, ms: float) -> None:
    for _ in range(round(ms / CHUNK_MS)):
        Clock.now += CHUNK_MS / 1000
        taker.process(chunk, probability, Clock.now)


def test_silence_counts_from_where_the_audio_fell_quiet_not_from_the_vads_lagging_verdict(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    feed_chunk(taker, tone(-20), 0.9, 800)
    # Silero still says speech for two chunks after the last word, then one in its hysteresis band
    # (neither speech nor silence to it); the audio is 60 dB under the speech from the first of them.
    feed_chunk(taker, tone(-80), 0.9, 64)
    feed_chunk(taker, tone(-80), 0.4, 32)
    feed_chunk(taker, tone(-80), 0.0, 224)
    # 320 ms of quiet against an end of turn of 300 ms; the VAD's verdict alone would count 224.
    assert [(t, r) for t, r, _ in control.ended] == [("turn-1", 0)]


def test_a_noisy_line_leaves_the_end_of_turn_to_the_vad(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    feed_chunk(taker, tone(-20), 0.9, 800)
    # Line noise 20 dB under the speech: what Silero calls speech there is not taken for silence.
    feed_chunk(taker, tone(-40), 0.9, 640)
    assert control.ended == [] and taker.mode is Mode.SPEAKING
    feed_chunk(taker, tone(-40), 0.0, 320)
    assert [(t, r) for t, r, _ in control.ended] == [("turn-1", 0)]


def test_a_quiet_gap_between_words_does_not_end_the_turn(setup) -> None:  # type: ignore[no-untyped-def]
    taker, control, _ = setup
    for _ in range(4):
        feed_chunk(taker, tone(-20), 0.9, 320)
        feed_chunk(taker, tone(-80), 0.9, 96)  # a stop's closure, a breath between words
    assert control.ended == [] and taker.mode is Mode.SPEAKING


SAMPLES_PER_MS = CHUNK.size / CHUNK_MS


def test_a_long_pause_inside_a_reopened_turn_is_shortened_to_a_preroll_for_whisper() -> None:
    # Whisper wrote a 900 ms pause inside "four seven ... one two" as "47. 1,2," and went on counting.
    taker, control, tracker = short_grace()
    close_a_turn_and_outlive_its_grace(taker, tracker)
    feed(taker, 0.0, 960)  # the pause: nothing in it is speech
    feed(taker, 0.9, 320)
    feed(taker, 0.0, 320)
    (_, _, first), (_, revision, second) = control.ended
    assert revision == 1
    added_ms = (second - first) / SAMPLES_PER_MS
    preroll_ms = Settings().preroll_ms
    assert 320 + 320 <= added_ms <= preroll_ms + 320 + 320 + CHUNK_MS  # not the 960 ms pause


def test_what_was_heard_in_the_pause_stays_in_the_reopened_turn() -> None:
    # A blip too short to reopen the turn ("one", said softly) may be a word: from the first speech heard
    # after the turn closed, nothing is dropped.
    taker, control, tracker = short_grace()
    close_a_turn_and_outlive_its_grace(taker, tracker)
    feed(taker, 0.0, 640)
    feed(taker, 0.9, 96)
    feed(taker, 0.0, 320)  # a blip: the candidate is cancelled
    feed(taker, 0.9, 320)
    feed(taker, 0.0, 320)
    (_, _, first), (_, revision, second) = control.ended
    assert revision == 1
    assert (second - first) / SAMPLES_PER_MS >= 96 + 320 + 320 + 320
