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
