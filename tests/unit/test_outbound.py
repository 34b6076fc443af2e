"""Outbound: what the transport pulls, frame by frame, through pauses, flushes and held revisions."""

from __future__ import annotations

import numpy as np

from parley.outbound import Outbound
from parley.pipeline.messages import AudioChunk, EndOfCall, EndOfResponse, Response, Tag

RATE = 8000
FRAME = RATE // 50


class Listener:
    def __init__(self) -> None:
        self.segments: list[str] = []
        self.ended: list[tuple[Response, bool]] = []
        self.end_of_call: list[str] = []
        self.flushes = 0

    def on_segment_started(self, response: Response, text: str, first: bool) -> None:
        self.segments.append(text)

    def on_response_ended(self, response: Response, latest: bool) -> None:
        self.ended.append((response, latest))

    def on_end_of_call(self, reason: str) -> None:
        self.end_of_call.append(reason)

    def on_flushed(self) -> None:
        self.flushes += 1


def make(gate=lambda tag: True):  # type: ignore[no-untyped-def]
    listener = Listener()
    return Outbound(RATE, gate=gate, listener=listener), listener


def chunk(response: Response, frames: float, value: int, text: str = "") -> AudioChunk:
    return AudioChunk(response, np.full(int(FRAME * frames), value, dtype=np.int16), text)


def reply(turn: str | None = "t1", gen: int = 0) -> Response:
    return Response(Tag(turn, 0 if turn else None, gen))


def test_pulls_silence_when_nothing_is_queued() -> None:
    out, _ = make()
    frame = out.pull_frame()
    assert frame.shape == (FRAME,) and not frame.any()


def test_plays_chunks_in_order_across_frame_edges() -> None:
    out, listener = make()
    r = reply()
    out.push(chunk(r, 1.5, 1, "one two"))
    out.push(chunk(r, 1.5, 2, "three"))
    frames = [out.pull_frame() for _ in range(4)]
    assert (frames[0] == 1).all()
    assert (frames[1][: FRAME // 2] == 1).all() and (frames[1][FRAME // 2 :] == 2).all()
    assert (frames[2] == 2).all()
    assert not frames[3].any()
    assert listener.segments == ["one two", "three"]
    assert r.heard_text() == "one two three"


def test_pause_holds_audio_and_resume_continues_where_it_stopped() -> None:
    out, _ = make()
    r = reply()
    out.push(chunk(r, 1, 1))
    out.push(chunk(r, 1, 2))
    assert (out.pull_frame() == 1).all()
    out.pause()
    assert not out.pull_frame().any()
    assert not out.pull_frame().any()
    out.resume()
    assert (out.pull_frame() == 2).all()


def test_flush_silences_next_frame_and_keeps_markers_in_order_ahead_of_later_items() -> None:
    out, listener = make()
    r1, r2 = reply("t1"), reply("t2")
    out.push(chunk(r1, 3, 1, "a b c d"))
    out.push(EndOfResponse(r1))
    out.push(chunk(r2, 2, 2))
    out.push(EndOfCall("bye"))
    out.pull_frame()
    cut = out.flush()
    assert listener.flushes == 1  # a carrier learns of it, to clear what it buffered
    assert cut == [r1, r2]
    assert r1.heard_text() == "a"  # one of three frames played: a quarter of the words, rounded
    out.push(chunk(reply("t3"), 1, 3))
    assert (out.pull_frame() == 3).all()  # no flushed audio plays; what came after the flush does...
    assert [latest for _, latest in listener.ended] == [True]  # ...after the markers that survived
    assert listener.end_of_call == ["bye"]


def test_next_frame_after_a_flush_is_silence() -> None:
    out, _ = make()
    out.push(chunk(reply(), 5, 1))
    out.pull_frame()
    out.flush()
    assert not out.pull_frame().any()


def test_gate_none_holds_back_and_false_drops() -> None:
    verdicts: dict[str | None, bool | None] = {"held": None, "stale": False, "ok": True}
    out, listener = make(gate=lambda tag: verdicts[tag.turn_id])
    held = reply("held")
    out.push(chunk(held, 1, 7))
    assert not out.pull_frame().any()
    assert out.has_audio()
    verdicts["held"] = False
    out.push(chunk(reply("ok"), 1, 5))
    assert (out.pull_frame() == 5).all()
    assert listener.segments == [""]


def test_first_audio_time_is_recorded_once_per_response() -> None:
    out, _ = make()
    r = Response(Tag("t", 0, 0), speech_end=0.0)
    out.push(chunk(r, 1, 1))
    out.push(chunk(r, 1, 1))
    out.pull_frame()
    first = r.first_audio_at
    out.pull_frame()
    assert first is not None and r.first_audio_at == first and r.response_s is not None


# A carrier's media stream: audio counts as heard only when the carrier echoes the mark that follows it.


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_carrier(gate=lambda tag: True):  # type: ignore[no-untyped-def]
    listener, clock = Listener(), Clock()
    out = Outbound(RATE, gate=gate, listener=listener, clock=clock)
    out.confirm_by_marks()
    return out, listener, clock


def test_a_chunk_sent_to_a_carrier_is_heard_only_when_its_mark_comes_back() -> None:
    out, listener, _ = make_carrier()
    r = reply()
    out.push(chunk(r, 1, 1, "one two"))
    out.push(chunk(r, 1.5, 2, "three"))
    out.push(EndOfResponse(r))
    out.pull_frame()
    assert out.take_marks() == ["m1"]  # sent right after the frame that ends the first chunk
    out.pull_frame()
    assert out.take_marks() == []
    out.pull_frame()
    assert out.take_marks() == ["m2"]
    out.pull_frame()
    assert r.heard_text() == "" and listener.ended == []  # sent is not played
    assert out.has_audio()  # still in the carrier's buffer: the agent is still talking
    assert out.mark_played("m1")
    assert r.heard_text() == "one two" and listener.ended == []
    assert out.mark_played("m2")
    assert r.heard_text() == "one two three"
    assert listener.ended == [(r, True)]  # the reply ends when its last audio has played
    assert not out.has_audio()


def test_marks_echoed_after_a_clear_count_for_nothing() -> None:
    out, _, clock = make_carrier()
    r = reply()
    out.push(chunk(r, 1, 1, "a b"))
    out.push(chunk(r, 1, 2, "c d"))
    out.pull_frame()
    out.pull_frame()
    clock.now += 0.01  # the carrier began the first chunk 10 ms ago, well short of its 20 ms
    assert out.flush() == [r]
    assert r.heard_text() == "a"
    assert not out.mark_played("m1") and not out.mark_played("m2")  # a carrier echoes them after a clear
    assert r.heard_text() == "a" and out.take_marks() == []


def test_a_cut_is_estimated_from_when_the_carrier_began_playing_the_chunk() -> None:
    out, _, clock = make_carrier()
    r = reply()
    out.push(chunk(r, 1, 1, "first"))
    out.push(chunk(r, 10, 2, "one two three four five six seven eight nine ten"))
    for _ in range(6):
        out.pull_frame()
        clock.now += 0.02
    assert out.mark_played("m1")  # the carrier began the second chunk now
    clock.now += 0.06  # it has played 3 of the 5 frames sent so far
    out.flush()
    assert r.heard_text() == "first one two three"


def test_no_more_of_a_chunk_is_heard_than_was_sent() -> None:
    out, _, clock = make_carrier()
    r = reply()
    out.push(chunk(r, 10, 1, "one two three four five six seven eight nine ten"))
    out.pull_frame()
    out.pause()  # a barge-in candidate: nothing more is sent while the carrier plays out its buffer
    clock.now += 1.0
    out.flush()
    assert r.heard_text() == "one"


def test_a_reply_waiting_for_its_marks_is_cut_and_its_end_still_closes_the_books() -> None:
    verdicts = {"t1": True}
    out, listener, _ = make_carrier(gate=lambda tag: verdicts[tag.turn_id])
    r = reply("t1")
    out.push(chunk(r, 1, 1, "all of it"))
    out.push(EndOfResponse(r))
    out.pull_frame()
    out.pull_frame()
    assert listener.ended == []  # its audio is still in the carrier's buffer
    verdicts["t1"] = False  # the barge-in cancelled it
    assert out.flush() == [r]
    out.pull_frame()
    assert listener.ended == [(r, False)]  # the end went back in front and the gate judged it again


def test_a_reply_end_with_nothing_left_to_play_is_reported_at_once() -> None:
    out, listener, _ = make_carrier()
    r = reply()
    out.push(EndOfResponse(r))
    out.pull_frame()
    assert listener.ended == [(r, True)]


def test_marks_a_carrier_never_echoes_expire() -> None:
    out, listener, clock = make_carrier()
    r = reply()
    out.push(chunk(r, 1, 1, "hello"))
    out.push(EndOfResponse(r))
    out.pull_frame()
    out.pull_frame()
    clock.now += 1.0
    assert out.expire_marks(2.0) == []
    clock.now += 2.0
    assert out.expire_marks(2.0) == ["m1"]
    assert r.heard_text() == "hello" and listener.ended == [(r, True)]
