"""Small pieces of the data path: audio conversion, queues, reply segmentation, the conversation."""

from __future__ import annotations

import numpy as np

from parley.audio import FrameSplitter, StreamResampler, first_channel, resample, rms_dbfs
from parley.pipeline.history import Conversation, whole_sentences
from parley.pipeline.queues import QueueClosed, StageQueue
from parley.pipeline.segmenter import ReplySegmenter, clean_for_speech, split_sentences


def test_stereo_48k_frames_become_16k_mono_without_losing_time() -> None:
    tone = (np.sin(2 * np.pi * 300 * np.arange(48000) / 48000) * 10000).astype(np.int16)
    stereo = np.repeat(tone, 2)
    resampler = StreamResampler(48000, 16000)
    out = np.concatenate(
        [resampler.process(first_channel(stereo[i : i + 1920], 2)) for i in range(0, stereo.size, 1920)]
    )
    assert abs(out.size - 16000) <= 200  # the stream holds back a few ms of filter delay
    assert abs(rms_dbfs(out[2000:]) - rms_dbfs(tone)) < 1.0


def test_a_phone_lines_8k_frames_come_out_doubled_at_once_with_the_band_kept() -> None:
    # SIP and carrier audio: each 20 ms frame gives its 16 kHz frame at once (soxr's streams held three
    # to six frames back), the speech band kept whole and nothing mirrored above it.
    def level_at(pcm: np.ndarray, hz: float) -> float:
        window = np.hanning(pcm.size)
        spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64) * window))
        return float(spectrum[round(hz * pcm.size / 16000)] / (window.sum() / 2))

    for hz in (1000, 3000):
        tone = (np.sin(2 * np.pi * hz * np.arange(8000) / 8000) * 10000).astype(np.int16)
        resampler = StreamResampler(8000, 16000)
        frames = [resampler.process(tone[i : i + 160]) for i in range(0, tone.size, 160)]
        assert {f.size for f in frames} == {320}
        out = np.concatenate(frames)[1600:]
        assert abs(20 * np.log10(level_at(out, hz) / 10000)) < 0.5  # the tone, at its level
        assert level_at(out, 8000 - hz) < 10000 * 10 ** (-50 / 20)  # its image, under -50 dB
    click = np.zeros(1600, dtype=np.int16)
    click[800] = 20000
    resampler = StreamResampler(8000, 16000)
    out = np.concatenate([resampler.process(click[i : i + 160]) for i in range(0, click.size, 160)])
    assert 0 <= int(np.argmax(out)) - 1600 < 32  # under 2 ms late


def test_a_sentence_resampled_in_stretches_is_the_sentence_resampled_whole() -> None:
    # How the TTS stage resamples a sentence that Piper hands over a stretch at a time, cut mid-word.
    tone = (np.sin(2 * np.pi * 230 * np.arange(22050) / 22050) * 9000).astype(np.int16)
    for rate in (8000, 16000, 48000):
        resampler = StreamResampler(22050, rate, quality="HQ")
        parts = [resampler.process(tone[a:b]) for a, b in ((0, 6144), (6144, 18432), (18432, 22050))]
        stream = np.concatenate([*parts, resampler.process(np.zeros(0, dtype=np.int16), last=True)])
        whole = resample(tone, 22050, rate)
        assert stream.size == whole.size
        assert int(np.max(np.abs(stream.astype(np.int32) - whole))) <= 4  # no click at the edges


def test_resample_whole_chunks_and_split_into_frames() -> None:
    pcm = np.ones(22050, dtype=np.int16)
    assert resample(pcm, 22050, 48000).size == 48000
    splitter = FrameSplitter(320)
    frames = splitter.push(np.zeros(500, dtype=np.int16)) + splitter.push(np.zeros(500, dtype=np.int16))
    assert [f.size for f in frames] == [320, 320, 320]


def test_a_full_inbound_queue_drops_the_oldest_and_close_wakes_the_reader() -> None:
    q: StageQueue[int] = StageQueue("vad", maxsize=2)
    for i in range(3):
        q.put(i)
    assert q.get(0) == 1 and q.get(0) == 2 and q.get(0.01) is None
    q.put(5)
    q.close()
    assert q.put(6) is False
    try:
        q.get(0)
        raise AssertionError("a closed queue must raise")
    except QueueClosed:
        pass


def test_flush_keeps_control_items_in_front_in_order() -> None:
    q: StageQueue[str] = StageQueue("tts")
    for item in ("audio1", "END1", "audio2", "END2"):
        q.put(item)
    assert q.flush(keep=lambda item: item.startswith("END")) == 2
    q.put("audio3")
    assert [q.get(0) for _ in range(3)] == ["END1", "END2", "audio3"]


def test_first_piece_is_an_early_clause_then_whole_sentences() -> None:
    segmenter = ReplySegmenter()
    pieces: list[str] = []
    reply = "Sure, the weather in **Paris** is mild today. Take a jacket! Bye"
    for word in reply.split(" "):
        pieces += segmenter.push(word + " ")
    pieces += segmenter.flush()
    assert pieces == ["Sure,", "the weather in Paris is mild today.", "Take a jacket!", "Bye"]
    # With no clause boundary, the first piece ends before a phrase opener once four words are in.
    segmenter = ReplySegmenter()
    reply = "The capital of France is Paris."
    pieces = [piece for word in reply.split(" ") for piece in segmenter.push(word + " ")]
    assert pieces + segmenter.flush() == ["The capital of France", "is Paris."]
    segmenter = ReplySegmenter()
    reply = "I'm sorry, but I do not know the weather there."
    pieces = [piece for word in reply.split(" ") for piece in segmenter.push(word + " ")]
    assert pieces + segmenter.flush() == ["I'm sorry,", "but I do not know the weather there."]
    assert clean_for_speech("# Title with `code` and [a link](http://x)") == "Title with code and a link"


def test_prompt_holds_earlier_turns_as_heard_and_a_newer_revision_replaces_the_text() -> None:
    conversation = Conversation("Be brief.")
    conversation.commit_agent("greeting", "Hello!", interrupted=False)
    conversation.set_user_text("t1", 0, "tell me a story")
    conversation.commit_agent("t1", "Once upon a time there was a dragon. It lived", interrupted=True)
    conversation.set_user_text("t2", 0, "what time")
    conversation.set_user_text("t2", 1, "what time is it in london")
    conversation.set_user_text("t2", 0, "stale")
    assert conversation.messages_for("t2") == [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "tell me a story"},
        {"role": "assistant", "content": "Once upon a time there was a dragon."},  # the whole sentences
        {"role": "user", "content": "what time is it in london"},
    ]
    # the record keeps every word that was heard
    assert conversation.snapshot()[1]["agent"] == "Once upon a time there was a dragon. It lived"
    states = {t["turn_id"]: t["agent_state"] for t in conversation.snapshot()}
    assert states == {"greeting": "committed", "t1": "interrupted", "t2": "pending"}


def test_a_reply_cut_in_its_first_sentence_is_left_out_of_the_prompt() -> None:
    # "A ship last time to see" of a story asked for as "Tell me a story about a ship last time to see."
    # reads like the caller's words said back; a few of those taught the model to parrot every turn.
    conversation = Conversation("Be brief.")
    conversation.set_user_text("t1", 0, "Tell me a story about a ship last time to see.")
    conversation.commit_agent("t1", "A ship last time to see", interrupted=True)
    conversation.set_user_text("t2", 0, "Wave")
    assert conversation.messages_for("t2") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me a story about a ship last time to see."},
        {"role": "user", "content": "Wave"},
    ]
    assert whole_sentences("It was dark! The sea was") == "It was dark!"
    assert whole_sentences("Sure.") == "Sure." and whole_sentences("") == ""


def test_for_a_server_that_caches_prefixes_each_prompt_begins_with_the_previous_one() -> None:
    sliding, stable = Conversation("Be brief.", max_turns_in_prompt=3), Conversation("Be brief.", 3)
    previous: dict[bool, list[dict[str, str]]] = {}
    kept_whole = {False: 0, True: 0}
    for conversation in (sliding, stable):
        conversation.commit_agent("greeting", "Hello!", interrupted=False)
    for n in range(1, 13):
        for is_stable, conversation in ((False, sliding), (True, stable)):
            conversation.set_user_text(f"t{n}", 0, f"question {n}")
            prompt = conversation.messages_for(f"t{n}", stable_prefix=is_stable)
            earlier_turns = sum(m["role"] == "assistant" for m in prompt)
            if is_stable:
                assert 3 <= earlier_turns <= 5 or n < 3, (n, prompt)
            else:
                assert earlier_turns == min(n, 3)
            assert prompt[-1] == {"role": "user", "content": f"question {n}"}
            last = previous.get(is_stable)
            if last is not None and prompt[: len(last)] == last:
                kept_whole[is_stable] += 1
            previous[is_stable] = prompt
            conversation.commit_agent(f"t{n}", f"answer {n}", interrupted=False)
    # 11 prompts after the first: the stable window moves every third turn; the sliding one every turn
    # once it is full.
    assert kept_whole == {False: 2, True: 8}


def test_a_first_sentence_without_a_comma_is_spoken_from_its_first_phrase_break() -> None:
    def pieces_of(reply: str) -> list[str]:
        segmenter = ReplySegmenter()
        pieces: list[str] = []
        for word in reply.split(" "):
            pieces += segmenter.push(word + " ")
        return pieces + segmenter.flush()

    assert pieces_of("The capital of France is Paris. It is lovely.") == [
        "The capital of France",
        "is Paris.",
        "It is lovely.",
    ]
    assert pieces_of("Water boils at 100 degrees Celsius.") == ["Water boils at 100 degrees Celsius."]
    assert pieces_of("The inside of the island is green.") == ["The inside of the island", "is green."]


def test_a_first_piece_ends_on_its_mark_without_waiting_for_the_next_token() -> None:
    def first_piece_after(tokens: list[str]) -> tuple[int, list[str]]:
        """How many tokens the model wrote before the first piece went to TTS, and that piece."""
        segmenter = ReplySegmenter()
        for count, token in enumerate(tokens, 1):
            pieces = segmenter.push(token)
            if pieces:
                return count, pieces
        return len(tokens), segmenter.flush()

    assert first_piece_after(["Sure", ",", " I", " can"]) == (2, ["Sure,"])
    assert first_piece_after(["I", "'m", " Par", "ley", ",", " a"]) == (5, ["I'm Parley,"])
    assert first_piece_after(["A", " spider", " has", " eight", " legs", ".", " They"]) == (
        6,
        ["A spider has eight legs."],
    )
    assert first_piece_after(["Yes", "!", " It"]) == (2, ["Yes!"])
    # After a number, the mark may be the inside of a word: the next token decides. A title's or an
    # initial's full stop ends nothing.
    assert first_piece_after(["It", " is", " 1", ",", "0", "0", "0", " miles", "."]) == (
        9,
        ["It is 1,000 miles."],
    )
    assert first_piece_after(["Ask", " Dr", ".", " Lee", "."]) == (5, ["Ask Dr. Lee."])
    assert first_piece_after(["Try", " e", ".g", ".", " tea", "."]) == (6, ["Try e.g. tea."])
    # The rest of an ellipsis whose first full stop closed the piece is not spoken on its own.
    segmenter = ReplySegmenter()
    pieces = [p for token in ["Well", ".", "..", " maybe", "."] for p in segmenter.push(token)]
    assert pieces + segmenter.flush() == ["Well.", "maybe."]


def test_running_dry_a_later_piece_is_cut_at_its_first_break_or_after_a_few_words() -> None:
    def pieces_of(reply: str, dry_at: int) -> list[str]:
        """Streamed word by word; from word `dry_at` the audio ahead is about to run out, until the next
        piece goes to TTS (whose audio is then ahead)."""
        segmenter = ReplySegmenter()
        pieces: list[str] = []
        for i, word in enumerate(reply.split(" ")):
            hurry = i >= dry_at and len(pieces) == 1
            pieces += segmenter.push(word + " ", hurry=hurry)
        return pieces + segmenter.flush()

    reply = "Sure! To make a cup of tea, boil the water and pour it over the leaves in a warm pot."
    whole = "To make a cup of tea, boil the water and pour it over the leaves in a warm pot."
    assert pieces_of(reply, dry_at=99) == ["Sure!", whole]
    assert pieces_of(reply, dry_at=1) == ["Sure!", "To make a cup of tea,", whole[22:]]
    # No comma: before a phrase opener four words in, as for a first piece.
    assert pieces_of("Sure! The water should be hot when you pour it.", dry_at=1) == [
        "Sure!",
        "The water should be hot",
        "when you pour it.",
    ]
    # No break at all: once six words are in, before the last phrase opener, or else at the last word.
    assert pieces_of("Sure! One two three four five six seven.", dry_at=1) == [
        "Sure!",
        "One two three four five six",
        "seven.",
    ]
    assert pieces_of("Sure! One two three and five six seven.", dry_at=1) == [
        "Sure!",
        "One two three",
        "and five six seven.",
    ]


def test_an_initial_or_a_title_does_not_end_a_sentence() -> None:
    # Qwen2.5-Coder-1.5B's recommendation was cut at "by F." by the two-sentence limit.
    reply = (
        'Sure! I recommend "The Great Gatsby" by F. Scott Fitzgerald. Ask Dr. Seuss, e.g. tomorrow. '
        "I said no. So do I."
    )
    assert split_sentences(reply) == [
        "Sure!",
        'I recommend "The Great Gatsby" by F. Scott Fitzgerald.',
        "Ask Dr. Seuss, e.g. tomorrow.",
        "I said no.",
        "So do I.",
    ]
    segmenter = ReplySegmenter()
    pieces = [p for token in reply.split(" ") for p in segmenter.push(token + " ")] + segmenter.flush()
    assert pieces[1:3] == [
        'I recommend "The Great Gatsby" by F. Scott Fitzgerald.',
        "Ask Dr. Seuss, e.g. tomorrow.",
    ]


def test_a_lookup_made_from_half_a_sentence_is_not_in_the_whole_sentences_prompt() -> None:
    # `parley test examples/scenarios/`: "my order number is four seven [pause] one two" looked up order
    # 47 while the caller paused, and the model, shown that result for the whole question, told the
    # caller order 47's status as 4712's. The call's record keeps both revisions' calls.
    def lookup(call_id: str, number: str) -> dict[str, str]:
        arguments = f'{{"number": "{number}"}}'
        return {"tool_call_id": call_id, "name": "lookup_order", "arguments": arguments, "result": "{}"}

    conversation = Conversation("Be brief.")
    conversation.set_user_text("t1", 0, "my order number is 47")
    conversation.add_tool_result("t1", 0, lookup("call_1", "47"))
    assert [m["role"] for m in conversation.messages_for("t1")] == ["system", "user", "assistant", "tool"]
    conversation.set_user_text("t1", 1, "my order number is 4712")
    assert [m["role"] for m in conversation.messages_for("t1")] == ["system", "user"]
    conversation.add_tool_result("t1", 1, lookup("call_2", "4712"))
    prompt = conversation.messages_for("t1")
    assert [m.get("tool_call_id") for m in prompt if m["role"] == "tool"] == ["call_2"]
    assert [t["tool_call_id"] for t in conversation.snapshot()[0]["tools"]] == ["call_1", "call_2"]
