"""The end-of-turn model: asked at a turn's first pause, a "complete" verdict ends the turn early and
lets its reply play without the reopen grace; "incomplete" leaves the turn to the silence."""

from __future__ import annotations

import time

import numpy as np
import pytest

from parley import metrics
from parley.bench.speech import piper, trim
from parley.call import Call
from parley.config import Settings
from parley.engines.turn_end import LogMel, SmartTurn
from parley.pipeline.messages import TurnEndVerdict
from parley.pipeline.turn_state import Mode
from parley.pipeline.turns import SpeculativeTurnTracker
from parley.pipeline.turntaking import TurnTaker
from tests.doubles import FixedTurnEnd, ScriptedLlm, ScriptedStt, loud, make_engines, quiet
from tests.unit.test_call import RATE, Line
from tests.unit.test_turntaking import CHUNK_MS, Control, feed

SETTINGS = {"min_speech_ms": 200, "end_of_turn_ms": 600, "reopen_grace_ms": 800, "turn_complete_ms": 160}


def taker() -> tuple[TurnTaker, Control, SpeculativeTurnTracker]:
    tracker, control = SpeculativeTurnTracker(), Control()
    return TurnTaker(Settings(**SETTINGS), tracker, control, CHUNK_MS), control, tracker  # type: ignore[arg-type]


def pause_and_judge(turns: TurnTaker, control: Control, complete: bool) -> float:
    feed(turns, 0.9, 800)
    feed(turns, 0.0, 32)
    (speech_end, samples), *_ = control.judged
    assert samples > 0.8 * 16000  # the turn so far
    turns.turn_end_verdict(TurnEndVerdict(speech_end, complete, 0.95 if complete else 0.1))
    return speech_end


def test_a_turn_judged_complete_ends_after_the_shorter_silence_and_its_reply_is_not_held() -> None:
    turns, control, tracker = taker()
    pause_and_judge(turns, control, complete=True)
    assert control.ended == []
    feed(turns, 0.0, 128)  # 160 ms of silence in all
    assert [(t, r) for t, r, _ in control.ended] == [("turn-1", 0)]
    assert not tracker.has_pending_reopen_or_grace("turn-1", 0)  # its reply may play at once


def test_a_turn_judged_incomplete_waits_for_the_silence_and_the_grace() -> None:
    turns, control, tracker = taker()
    pause_and_judge(turns, control, complete=False)
    feed(turns, 0.0, 400)
    assert control.ended == []
    feed(turns, 0.0, 200)
    assert len(control.ended) == 1 and tracker.has_pending_reopen_or_grace("turn-1", 0)


def test_a_late_verdict_ends_the_turn_at_once_and_a_stale_one_changes_nothing() -> None:
    turns, control, _ = taker()
    feed(turns, 0.9, 800)
    feed(turns, 0.0, 224)
    (speech_end, _), *_ = control.judged
    turns.turn_end_verdict(TurnEndVerdict(speech_end, True, 0.95))  # 224 ms of silence already
    assert len(control.ended) == 1 and turns.mode is Mode.IDLE

    turns, control, _ = taker()
    feed(turns, 0.9, 800)
    feed(turns, 0.0, 64)
    (speech_end, _), *_ = control.judged
    feed(turns, 0.9, 400)  # the caller went on: that pause is moot
    turns.turn_end_verdict(TurnEndVerdict(speech_end, True, 0.95))
    feed(turns, 0.0, 320)
    assert control.ended == [] and turns.mode is Mode.SPEAKING
    assert len(control.judged) == 2  # the new pause is asked about in turn


def first_sound_after(line: Line, when: float) -> float:
    return next(t for t, sound in line.heard if sound and t > when) - when


@pytest.mark.parametrize(("probability", "soon"), [(0.97, True), (0.2, False)])
def test_a_call_answers_a_complete_turn_without_waiting_out_the_grace(probability: float, soon: bool) -> None:
    settings = Settings(greeting="", end_of_turn_ms=400, reopen_grace_ms=1500, turn_complete_ms=160)
    engines = make_engines(
        llm=ScriptedLlm(token_s=0.01), stt=ScriptedStt(), turn_end=FixedTurnEnd(probability)
    )
    call = Call("c-turn-end", "test", settings, engines, outbound_rate=RATE)
    line = Line(call)
    verdict = "complete" if soon else "incomplete"
    before = metrics.TURN_END_VERDICTS_TOTAL.labels(outcome=verdict)._value.get()
    call.start()
    line.start()
    try:
        line.say(loud(800))
        spoke_until = time.monotonic()
        line.say(quiet(2500))
        line.wait(lambda: line.event("agent_done") is not None)
        waited = first_sound_after(line, spoke_until)
        if soon:
            assert waited < 1.0, waited  # the grace (1.5 s) was not waited out
        else:
            assert waited > 0.4 + 1.5 - 0.1, waited  # the silence, then the grace
        assert metrics.TURN_END_VERDICTS_TOTAL.labels(outcome=verdict)._value.get() == before + 1
    finally:
        line.stop()
        call.end("test_over")
        assert call.join(5.0)


def test_the_features_are_the_last_8_seconds_padded_at_the_front() -> None:
    features = LogMel()
    one_second = loud(1000)
    f = features(one_second)
    assert f.shape == (80, 800) and f.dtype == np.float32
    assert np.ptp(f[:, :650]) == 0  # 7 s of padding look alike
    assert np.ptp(f[:, -90:]) > 0.5  # the speech does not
    longer = np.concatenate([quiet(5000), loud(7000), one_second])
    assert np.array_equal(features(longer), features(longer[-8 * 16000 :]))


def spoken(text: str) -> np.ndarray:
    """`text` in Piper's voice with its noise at 0, so the model hears the same audio in every run (with
    its noise, Piper drew the prosody at random, and one run in several heard a whole question at 0.6)."""
    return np.concatenate([trim(piper(text, steady=True)), quiet(100)])  # as asked: at the first silent chunk


def whole_and_half(model: SmartTurn, text: str) -> tuple[float, float]:
    """The model's verdicts on `text` and on its first half."""
    whole = spoken(text)
    complete, cut = model.complete([whole, np.concatenate([whole[: whole.size // 2], quiet(100)])])
    return complete, cut


def test_smart_turn_hears_a_finished_sentence_from_one_cut_in_the_middle() -> None:
    model = SmartTurn()
    complete, cut = whole_and_half(model, "What is the weather like in Paris today?")
    assert complete >= 0.9 and cut < 0.5, (complete, cut)  # 0.98; "What is the wea-": 0.02
    complete, cut = whole_and_half(model, "I would like to book a table for two people tonight.")
    assert complete >= 0.9 and cut < 0.5, (complete, cut)  # 0.97 and 0.02
