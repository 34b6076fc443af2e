"""The in-process llama.cpp LLM: the packaged Qwen2.5-0.5B GGUF, conversations kept between turns, replies of
several calls decoded together."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley import metrics
from parley.agent.opening import default_opening
from parley.config import DEFAULT_GREETING, DEFAULT_SYSTEM_PROMPT, Settings
from parley.engines.cache import CacheError, llm_gguf, verify_folder
from parley.engines.compute_load import COMPUTE
from parley.engines.device import cpu_threads
from parley.engines.llamacpp_schedule import HOLD_AHEAD, Request, most_urgent
from parley.engines.llm import LlmError, Message
from parley.engines.llm_llamacpp import LlamaCppLlm
from parley.engines.llm_loading import load_llm
from parley.engines.urgency import HELD, URGENCY, never_due
from parley.settings_sources import SettingsError, validate
from tests.unit.test_engines_llm import BOOK, HELLO, looks_english, never, replies_asked_together

ROME: list[Message] = [
    {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
    {"role": "user", "content": "Tell me about the history of Rome."},
]


@pytest.fixture(scope="module")
def llm() -> Iterator[LlamaCppLlm]:
    settings = Settings(llm_runtime="llamacpp", llm_max_tokens=24)
    engine = load_llm(settings, opening=default_opening(settings))
    assert isinstance(engine, LlamaCppLlm)
    yield engine
    engine.close()


def kept_and_read() -> tuple[float, float]:
    sample = metrics.REGISTRY.get_sample_value
    kept = sample("parley_llm_prompt_tokens_total", {"outcome": "kept"}) or 0.0
    read = sample("parley_llm_prompt_tokens_total", {"outcome": "read"}) or 0.0
    return kept, read


def test_the_packaged_model_answers_and_the_next_turn_reads_only_what_is_new(llm: LlamaCppLlm) -> None:
    conversation = [*BOOK]
    first = "".join(llm.stream(conversation, never))
    conversation += [{"role": "assistant", "content": first}, {"role": "user", "content": "Why that one?"}]
    first_prompt = len(llm._chat.prompt_ids(BOOK))
    kept_before, read_before = kept_and_read()

    second = "".join(llm.stream(conversation, never))

    kept, read = kept_and_read()
    assert looks_english(first), first
    assert second.strip(), second
    # Everything up to the first reply stayed in the model's memory; only the new turn was read.
    assert kept - kept_before >= first_prompt
    assert read - read_before < 30


def settled(llm: LlamaCppLlm) -> None:
    """Wait until the engine has nothing left to read or say."""
    deadline = time.monotonic() + 10
    while llm._waiting or llm._active:
        assert time.monotonic() < deadline, "the engine did not settle"
        time.sleep(0.01)


def test_after_a_reply_that_ended_by_itself_the_next_turns_opening_is_read_before_the_caller_speaks(
    llm: LlamaCppLlm,
) -> None:
    conversation: list[Message] = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "Say only the word yes."},
    ]
    reply = "".join(llm.stream(conversation, never))
    settled(llm)
    question = "And now say no."
    conversation += [{"role": "assistant", "content": reply}, {"role": "user", "content": question}]
    prompt = llm._chat.prompt_ids(conversation)
    opening = llm._chat.next_turn_opening()
    asked = llm._chat.tokenizer.encode(question, add_special_tokens=False)
    # The prompt holds, after the reply, the template's opening of the caller's turn, then the question.
    at = next(i for i in range(len(prompt)) if prompt[i : i + len(asked)] == asked)
    assert opening and prompt[at - len(opening) : at] == opening
    # Everything before the question is in the model's memory already: the turn reads only the question.
    assert any(sequence.tokens == prompt[:at] for sequence in llm._sequences)
    assert "".join(llm.stream(conversation, never)).strip()


def test_a_reply_cut_short_reads_nothing_ahead(llm: LlamaCppLlm) -> None:
    prompt = llm._chat.prompt_ids(ROME)
    assert "".join(llm.stream(ROME, never)).strip()  # a long answer, cut at 24 tokens
    settled(llm)
    held = next(s.tokens for s in llm._sequences if s.tokens[: len(prompt)] == prompt)
    assert len(held) == len(prompt) + llm.max_tokens - 1  # the reply's last token is not even read


def test_when_the_window_lets_the_oldest_turn_go_the_rest_is_kept_not_read_again(llm: LlamaCppLlm) -> None:
    system = BOOK[0]
    turns: list[Message] = []
    for question, answer in (
        ("What time does the bank open?", "Most banks open at nine in the morning."),
        ("And when does it close?", "Usually at five in the afternoon."),
        ("Is it open on Sundays?", "Most banks are closed on Sundays."),
    ):
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    first = [system, *turns, {"role": "user", "content": "Can I open an account online?"}]
    reply = "".join(llm.stream(first, never))
    # The next prompt, as a three-turn window makes it: the oldest turn gone, the last one added.
    second = [system, *turns[2:], first[-1], {"role": "assistant", "content": reply}]
    second.append({"role": "user", "content": "What do I need for that?"})
    dropped = len(llm._chat.prompt_ids([system, *turns[:2]], reply=False))
    dropped -= len(llm._chat.prompt_ids([system], reply=False))
    kept_before, read_before = kept_and_read()

    answer = "".join(llm.stream(second, never))

    kept, read = kept_and_read()
    assert looks_english(answer), answer
    assert read - read_before < 30  # the new question, not the conversation again
    assert kept - kept_before >= len(llm._chat.prompt_ids(first)) - dropped


def test_replies_decoded_together_say_what_each_says_alone(llm: LlamaCppLlm) -> None:
    prompts = [HELLO, ROME, BOOK]
    alone = ["".join(llm.stream(p, never)) for p in prompts]
    together = replies_asked_together(llm, prompts)

    # llama.cpp's matrix kernels differ with the batch's size, so a near tie between two tokens can go
    # the other way far into a reply ("20 miles" / "40 miles"): the same reply, not the same bits.
    for alone_text, together_text in zip(alone, together, strict=True):
        assert looks_english(together_text), together_text
        assert together_text.split()[:4] == alone_text.split()[:4], (together_text, alone_text)


def test_a_reply_writing_a_tool_call_and_one_speaking_beside_it_are_each_held_to_their_own(
    llm: LlamaCppLlm,
) -> None:
    from parley.bench.tools import SYSTEM_PROMPT, TOOLS
    from parley.engines.toolcalls import ToolCall

    order: list[Message] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Please cancel my order 445566."},
    ]
    spoken_alone = "".join(llm.stream(ROME, never))
    out: dict[str, list[str | ToolCall]] = {}
    barrier = threading.Barrier(2)

    def ask(name: str, messages: list[Message], tools: list[dict[str, object]] | None) -> None:
        barrier.wait()
        out[name] = list(llm.stream(messages, never, tools=tools))

    threads = [
        threading.Thread(target=ask, args=("call", order, TOOLS)),
        threading.Thread(target=ask, args=("spoken", ROME, None)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    calls = [d for d in out["call"] if isinstance(d, ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [("cancel_order", '{"number": "445566"}')]
    spoken = "".join(d for d in out["spoken"] if isinstance(d, str))
    assert spoken.split()[:4] == spoken_alone.split()[:4], (spoken, spoken_alone)


def test_a_new_conversation_copies_the_shared_system_prompt_from_a_reply_being_decoded(
    llm: LlamaCppLlm,
) -> None:
    alone = "".join(llm.stream(HELLO, never))
    gguf, tokenizer = llm_gguf(Settings().resolved_cache_dir(), "qwen2.5-0.5b")
    engine = LlamaCppLlm(gguf, tokenizer, threads=2, sequences=2, max_tokens=24)
    try:
        system_tokens = len(engine._chat.prompt_ids(HELLO[:1], reply=False))
        started = threading.Event()

        def speaking() -> None:
            for _ in engine.stream(ROME, never):  # in the first sequence; the second is empty
                started.set()

        thread = threading.Thread(target=speaking)
        thread.start()
        assert started.wait(30)
        kept_before, _ = kept_and_read()
        copied = "".join(engine.stream(HELLO, never))
        kept, _ = kept_and_read()
        thread.join()
    finally:
        engine.close()

    assert kept - kept_before >= system_tokens >= 32
    assert copied == alone  # the copied cells are the ones reading the system prompt would have made


def test_stopping_stops_the_model_within_a_token(llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm, "max_tokens", 80)
    steps = 0
    real = llm._model.decode

    def counting(entries: list[tuple[int, int, int, bool]]) -> int:
        nonlocal steps
        steps += 1
        return real(entries)

    monkeypatch.setattr(llm._model, "decode", counting)
    stop = threading.Event()
    deltas = []
    for delta in llm.stream(ROME, stop.is_set):
        deltas.append(delta)
        if len(deltas) == 3:
            stop.set()
            at_stop = steps
    time.sleep(0.3)

    assert len(deltas) == 3
    assert steps - at_stop <= 2


def test_a_caller_that_waits_pauses_its_own_reply_and_no_other(llm: LlamaCppLlm) -> None:
    waiting_reply = llm.stream(ROME, never)
    first = next(waiting_reply)  # then this caller stops reading for a while
    other = "".join(llm.stream(BOOK, never))
    held = [len(r.said) for r in llm._active]
    rest = "".join(waiting_reply)

    assert looks_english(other), other
    assert held and max(held) <= 1 + HOLD_AHEAD + 1  # its reply went no further while the other spoke
    assert looks_english(first + rest), first + rest


def test_a_reply_due_sooner_goes_ahead_of_one_already_speaking(
    llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller still waiting for their first words is due before a reply whose speech has a while to run
    # (engines/urgency.py): that reply sits the steps out until the other has said its piece.
    monkeypatch.setattr(llm, "max_tokens", 60)
    speaking = threading.Event()
    late: list[str] = []

    def speak_late() -> None:
        URGENCY.set(lambda: time.monotonic() + 100)  # this thread's own context
        for delta in llm.stream(ROME, never):
            late.append(delta)
            if len(late) == 2:
                speaking.set()

    thread = threading.Thread(target=speak_late)
    thread.start()
    assert speaking.wait(30)
    request = next(r for r in llm._active if r.limit > 0)
    token = URGENCY.set(time.monotonic)
    try:
        before = len(request.said)
        soon = "".join(llm.stream(HELLO, never))
        after = len(request.said)
    finally:
        URGENCY.reset(token)
    thread.join()

    assert looks_english(soon), soon
    assert after - before <= 1, f"the later reply went {after - before} tokens on meanwhile"
    assert len(request.said) > after and looks_english("".join(late)), late  # and went on after


def test_a_step_is_for_the_replies_due_first() -> None:
    def request(due: float) -> Request:
        return Request([1], 10, due=lambda: due)

    soon, as_soon, later = request(100.1), request(100.12), request(101)
    assert most_urgent([later, soon]) == [soon]
    assert most_urgent([later, as_soon, soon]) == [as_soon, soon]  # due together: they share it


def test_work_of_no_live_call_waits_while_a_call_s_reply_is_in_flight_and_goes_on_after(
    llm: LlamaCppLlm,
) -> None:
    # A post-call analysis (engines/urgency.py: due NEVER) is writing when a caller's reply is asked for.
    done = threading.Event()
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    asked: list[Message] = [{"role": "user", "content": "Tell me a long story about Rome, as JSON."}]
    written: list[str] = []

    def analysis() -> None:
        token = URGENCY.set(never_due)
        try:
            written.append(llm.json_reply(asked, schema, done.is_set, max_tokens=200))
        finally:
            URGENCY.reset(token)

    thread = threading.Thread(target=analysis)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (background := [r for r in list(llm._active) if r.background and len(r.said) >= 3]):
            assert time.monotonic() < deadline, "the analysis did not start"
            time.sleep(0.01)
        before = len(background[0].said)
        reply = "".join(llm.stream(HELLO, never))
        after = len(background[0].said)
        deadline = time.monotonic() + 30
        while len(background[0].said) <= after + 1:  # once the reply is done, the analysis goes on
            assert time.monotonic() < deadline, "the analysis did not go on after the reply"
            time.sleep(0.01)
    finally:
        done.set()
        thread.join()
        deadline = time.monotonic() + 10  # the engine lets the analysis go at its next step
        while any(r.background for r in (*llm._waiting, *llm._active)):
            assert time.monotonic() < deadline, "the stopped analysis stayed in the engine"
            time.sleep(0.01)

    assert looks_english(reply), reply
    assert after - before <= 1, f"the analysis went {after - before} tokens on during the reply"
    assert written and written[0].lstrip().startswith("{") and '"story": "' in written[0], written  # its JSON


def test_a_caller_waiting_while_it_decides_whether_to_stop_holds_its_reply_at_once(llm: LlamaCppLlm) -> None:
    # The LLM stage waits for its first audio there: the model must not decode ahead meanwhile.
    waiting = threading.Event()
    taken = 0

    def should_stop() -> bool:
        nonlocal taken
        request = llm._active[0] if llm._active else None
        if request is not None and not waiting.is_set():
            taken = len(request.said) - request.steps.qsize()  # the tokens its caller has read
            if taken >= 3:
                waiting.set()
                time.sleep(0.5)  # a dozen steps' time
        return False

    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(llm.stream(ROME, should_stop)))
    reader.start()
    assert waiting.wait(30)
    time.sleep(0.3)
    held = [len(r.said) for r in llm._active]
    reader.join()

    assert held == [held[0]] and held[0] <= taken + 1  # at most the step under way when it began to wait
    assert looks_english("".join(said)), said


def test_a_reply_its_caller_holds_sits_out_the_steps_even_while_its_caller_reads_on(llm: LlamaCppLlm) -> None:
    # The LLM stage holds its reply while the first piece is voiced (engines/urgency.py, HELD): the engine
    # asks before each step, so the hold takes even when the caller's thread comes back late.
    hold, release = threading.Event(), threading.Event()
    said: list[str] = []

    def read() -> None:
        token = HELD.set(lambda: hold.is_set() and not release.is_set())
        try:
            for delta in llm.stream(ROME, never):
                said.append(str(delta))
                if len(said) == 3:
                    hold.set()
        finally:
            HELD.reset(token)

    reader = threading.Thread(target=read)
    reader.start()
    assert hold.wait(30)
    time.sleep(0.3)  # the step under way, and what was queued, are read
    decoded = [len(r.said) for r in llm._active]
    time.sleep(0.3)  # a dozen steps' time
    still = [len(r.said) for r in llm._active]
    release.set()
    reader.join(30)

    assert decoded and still == decoded  # nothing decoded while held
    assert looks_english("".join(said)), said


@pytest.mark.skipif(cpu_threads() < 2, reason="one core: every step runs on it")
def test_it_decodes_on_every_core_and_steps_aside_to_one_while_another_engine_computes(
    llm: LlamaCppLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen: list[int] = []
    set_threads = llm._model.set_threads

    def recording(threads: int) -> None:
        chosen.append(threads)
        set_threads(threads)

    monkeypatch.setattr(llm._model, "set_threads", recording)
    replies = replies_asked_together(llm, [HELLO, BOOK, ROME])  # several conversations, one batch
    assert all(looks_english(reply) for reply in replies), replies
    assert 1 not in chosen and llm._threads_now == cpu_threads()

    chosen.clear()
    with COMPUTE.running():  # Whisper or Piper is computing: every step takes one thread
        "".join(llm.stream([*ROME, {"role": "user", "content": "And of Athens?"}], never))
    assert chosen == [1] and llm._threads_now == 1
    "".join(llm.stream(HELLO, never))
    assert chosen == [1, cpu_threads()]


def test_a_prompt_longer_than_a_conversation_can_hold_is_refused(llm: LlamaCppLlm) -> None:
    huge: list[Message] = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(LlmError, match="does not fit"):
        "".join(llm.stream(huge, never))
    assert looks_english("".join(llm.stream(HELLO, never)))  # the engine serves the next reply


def test_the_system_prompt_is_read_at_load_and_the_engine_closes_cleanly() -> None:
    settings = Settings(llm_runtime="llamacpp", llm_model="smollm2-135m", llm_max_tokens=8)
    engine = load_llm(settings, opening=default_opening(settings))
    assert isinstance(engine, LlamaCppLlm)
    system_tokens = len(engine._chat.prompt_ids(HELLO[:1], reply=False))
    kept_before, _ = kept_and_read()
    assert "".join(engine.stream(HELLO, never)).strip()
    kept, _ = kept_and_read()
    assert kept - kept_before >= system_tokens  # the first call's first reply read only its question
    engine.close()
    assert not engine._thread.is_alive()
    with pytest.raises(LlmError, match="closed"):
        "".join(engine.stream(HELLO, never))


# Hashes the packaged model's folder (~8 s): make test-all, for the default suite's 12 minutes.
@pytest.mark.slow
def test_llama_cpp_takes_packaged_models_and_local_gguf_files_only(tmp_path: Path) -> None:
    cache = Settings().resolved_cache_dir()
    gguf, tokenizer = llm_gguf(cache, "smollm2-135m")
    assert gguf.suffix == ".gguf" and (tokenizer / "tokenizer.json").is_file()
    assert verify_folder(llm_gguf(cache, "qwen2.5-0.5b")[1])
    local, local_tokenizer = llm_gguf(tmp_path, str(gguf))
    assert local == gguf.resolve() and (local_tokenizer / "tokenizer.json").is_file()
    with pytest.raises(CacheError, match="needs a GGUF file"):
        llm_gguf(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    validate(Settings(llm_runtime="llamacpp"))
    with pytest.raises(SettingsError, match="llm_runtime"):
        validate(Settings(llm_runtime="vllm"))
    with pytest.raises(SettingsError, match="llm_threads"):
        validate(Settings(llm_threads=-1))


def test_a_llama_cpp_built_with_amx_kernels_loads_the_model_without_them() -> None:
    # Those kernels crash in the first decode of the packaged model (a Xeon with AMX-INT8); the Makefile
    # builds without them, and a build that has them loads every weight into the plain CPU buffer.
    from parley.engines.llamacpp_model import _has_amx_kernels

    class Built:
        def __init__(self, info: bytes) -> None:
            self.info = info

        def llama_print_system_info(self) -> bytes:
            return self.info

    assert _has_amx_kernels(Built(b"CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | "))
    assert not _has_amx_kernels(Built(b"CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 | "))


def test_replies_on_scattered_sequences_are_decoded_in_sequence_order_and_gaps_leave_nothing() -> None:
    # llama.cpp decodes a run of sequence ids rising by one in a single pass over the weights and starts a
    # new pass at every break: the calls' rows go in sequence order, and a sequence missing between two
    # gets a throwaway token that is dropped after the step.
    from parley.engines.llamacpp_model import LlamaCppModel

    gguf, _ = llm_gguf(Settings().resolved_cache_dir(), "qwen2.5-0.5b")
    model = LlamaCppModel(gguf, sequences=6, threads=1)
    lc = model.lc
    try:
        prompts = {seq: [9707 + seq, 11, 1879, 374] for seq in range(6)}
        for seq, prompt in prompts.items():
            assert model.decode([(t, i, seq, False) for i, t in enumerate(prompt)]) == 0
        alone = {}
        for seq in (4, 1, 3):
            assert model.decode([(13, 4, seq, True)]) == 0
            alone[seq] = model.logits(0).copy()
            model.drop(seq, 4)

        assert model.decode([(13, 4, 4, True), (13, 4, 1, True), (13, 4, 3, True)]) == 0

        batch = model.batch
        assert [batch.seq_id[i][0] for i in range(batch.n_tokens)] == [1, 2, 3, 4]
        for index, seq in enumerate((4, 1, 3)):
            together = model.logits(index)
            assert int(together.argmax()) == int(alone[seq].argmax())
            assert abs(together - alone[seq]).max() < 0.05 * abs(alone[seq]).max()
        # The filler's cell is gone: sequence 2 holds its prompt only; the others took their token.
        assert lc.llama_memory_seq_pos_max(model.memory, 2) == 3
        assert [lc.llama_memory_seq_pos_max(model.memory, s) for s in (1, 3, 4)] == [4, 4, 4]
    finally:
        model.close()


def test_a_reply_does_not_copy_the_earlier_replies_of_its_conversation(llm: LlamaCppLlm) -> None:
    # Two misheard questions answered alike; greedily, Qwen2.5-0.5B then said that reply word for word to
    # every later question (over SIP, 2026-12-02). Now it writes a reply of its own (engines/repeats.py),
    # though not always a better one: this small model may still decline.
    sorry = "I'm sorry, but I don't have enough information to answer that question. Could you please provide"
    messages: list[Message] = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}]
    for heard in ("What is my winner like in Paris to me?", "Can you recommend a God both to read?"):
        messages += [{"role": "user", "content": heard}, {"role": "assistant", "content": sorry}]
    messages.append({"role": "user", "content": "How do I make a cup of tea?"})
    reply = "".join(str(piece) for piece in llm.stream(messages, never))
    assert reply and not sorry.startswith(reply[:40]), reply


def test_after_introducing_itself_once_it_does_not_introduce_itself_again(llm: LlamaCppLlm) -> None:
    # After a garbled first question Qwen2.5-0.5B introduced itself, then gave each of nine later questions
    # the same introduction, dodging DRY's usual penalty (0.8) with "voiceassistant" (SIP, 2026-12-03).
    intro = "I'm Parley, a friendly voice assistant. How can I assist you today?"
    messages: list[Message] = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "assistant", "content": DEFAULT_GREETING},
        {"role": "user", "content": "What is my whener like in Paris to me?"},
        {"role": "assistant", "content": intro},
        {"role": "user", "content": "Can you recommend a God-Bot 3?"},
    ]
    reply = "".join(str(piece) for piece in llm.stream(messages, never))
    assert reply and "parley" not in reply.lower(), reply


def test_two_replies_that_opened_alike_do_not_set_how_the_next_one_opens(llm: LlamaCppLlm) -> None:
    # Over SIP (2026-12-06) every reply after these two began "As a voice assistant ...", even to
    # "How do I make a cup of tea?", and most refused a plain question.
    messages: list[Message] = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "assistant", "content": DEFAULT_GREETING},
        {"role": "user", "content": "What is my mother like in Paris to me?"},
        {
            "role": "assistant",
            "content": "As a voice assistant, I don't have personal experiences or emotions.",
        },
        {"role": "user", "content": "Can you recommend a Godbook to read?"},
        {
            "role": "assistant",
            "content": "As a voice assistant and AI, I do not have personal preferences or emotions.",
        },
        {"role": "user", "content": "How do I make a cup of tea?"},
    ]
    reply = "".join(str(piece) for piece in llm.stream(messages, never))
    assert not reply.startswith("As a"), reply
    assert "tea" in reply.lower(), reply


def test_a_reply_may_end_its_sentence_where_an_earlier_reply_ended_one(llm: LlamaCppLlm) -> None:
    messages: list[Message] = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "How many legs does a spider have?"},
        {"role": "assistant", "content": "A spider has four legs."},
        {"role": "user", "content": "How many legs does a dog have?"},
    ]
    reply = "".join(str(piece) for piece in llm.stream(messages, never))
    # penalised like a word, the full stop gave way to ", but it is not a mammal."
    assert reply.strip() == "A dog has four legs.", reply


# gguf's reader parses the whole vocabulary (~9 s): make test-all, for the default suite's 12 minutes.
@pytest.mark.slow
def test_the_packaged_qwen_runs_on_q4_0_layers_and_output_beside_its_own_embeddings() -> None:
    # llama.cpp repacks Q4_0 rows for the CPU's vector units; the packaged file's Q5_0, Q8_0 and K-quants
    # stay plain. The token embeddings, only looked up, keep the packaged file's own type.
    from gguf import GGUFReader

    gguf, _ = llm_gguf(Settings().resolved_cache_dir(), "qwen2.5-0.5b")
    types = {t.name: t.tensor_type.name for t in GGUFReader(gguf).tensors}
    layers = {kind for name, kind in types.items() if name.startswith("blk.") and "norm" not in name}
    assert layers - {"F32"} == {"Q4_0"}  # the biases stay F32
    assert (types["output.weight"], types["token_embd.weight"]) == ("Q4_0", "Q5_0")
