"""LLM engines: the packaged default through CTranslate2, SmolLM2 through transformers, and an OpenAI-style
endpoint."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from parley.config import DEFAULT_SYSTEM_PROMPT, Settings
from parley.engines.cache import llm_hf_source
from parley.engines.endpoint import OpenAiLlm
from parley.engines.llm import (
    IncrementalDecoder,
    LlmEngine,
    LlmError,
    Message,
)
from parley.engines.llm_batching import BatchedCt2Llm
from parley.engines.llm_ct2 import MAX_STATIC_PROMPTS, Ct2Llm
from parley.engines.llm_loading import load_llm
from parley.engines.llm_transformers import TransformersLlm
from tests.unit.test_engines_speech import normalise

HELLO: list[Message] = [
    {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
    {"role": "user", "content": "Hello, who are you?"},
]
BOOK: list[Message] = [
    {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
    {"role": "user", "content": "Can you recommend a good book to read?"},
]
ROME: list[Message] = [{"role": "user", "content": "Tell me about the history of Rome."}]
ENGLISH = {
    "i",
    "am",
    "a",
    "the",
    "you",
    "to",
    "and",
    "is",
    "with",
    "can",
    "help",
    "what",
    "my",
    "i'm",
    "im",
    "m",
}


def never() -> bool:
    return False


def looks_english(text: str) -> bool:
    words = normalise(text).split()
    return text.isascii() and len(words) >= 4 and len(ENGLISH.intersection(words)) >= 2


def replies_asked_together(llm: LlmEngine, prompts: list[list[Message]]) -> list[str]:
    """Each prompt's whole reply, all asked at the same instant from threads of their own."""
    together = [""] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        barrier.wait()
        together[i] = "".join(llm.stream(prompts[i], never))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return together


@pytest.fixture(scope="module")
def llm() -> Ct2Llm:
    engine = load_llm(Settings(llm_runtime="ctranslate2"))
    assert isinstance(engine, Ct2Llm)
    return engine


class CountingGenerator:
    """Wraps the CTranslate2 generator to count the tokens the model really computes."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.tokens = 0
        self.batches: list[int] = []  # the size of each generate_batch

    def generate_tokens(self, prompt: list[str], **options: Any) -> Any:
        inner: Callable[[Any], bool] = options["callback"]

        def counting(step: Any) -> bool:
            self.tokens += 1
            return inner(step)

        options["callback"] = counting
        return self.real.generate_tokens(prompt, **options)

    def generate_batch(self, prompts: list[list[str]], **options: Any) -> Any:
        inner: Callable[[Any], bool] = options["callback"]

        def counting(step: Any) -> bool:
            self.tokens += 1
            return inner(step)

        options["callback"] = counting
        self.batches.append(len(prompts))
        return self.real.generate_batch(prompts, **options)


def test_packaged_model_streams_an_english_reply(llm: Ct2Llm) -> None:
    started = time.perf_counter()
    deltas = list(llm.stream(HELLO, never))
    text = "".join(deltas)

    assert len(deltas) >= 4
    assert looks_english(text), text
    assert "<|" not in text
    print(f"reply in {time.perf_counter() - started:.2f}s: {text!r}")


def test_two_parallel_streams_give_the_same_greedy_replies_as_one(
    llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm, "max_tokens", 30)
    alone = "".join(llm.stream(ROME, never))
    replies: list[str] = ["", ""]

    def run(i: int) -> None:
        replies[i] = "".join(llm.stream(ROME, never))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert replies == [alone, alone]


def test_should_stop_stops_the_model_within_a_token(llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = CountingGenerator(llm._generator)
    monkeypatch.setattr(llm, "_generator", counter)
    stop = threading.Event()
    deltas: list[str] = []
    tokens_at_stop = 0

    for delta in llm.stream(ROME, stop.is_set):
        deltas.append(delta)
        if len(deltas) == 3:
            tokens_at_stop = counter.tokens
            stop.set()

    assert len(deltas) == 3
    assert counter.tokens - tokens_at_stop <= 1


def test_closing_the_stream_stops_the_model(llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = CountingGenerator(llm._generator)
    monkeypatch.setattr(llm, "_generator", counter)

    stream = llm.stream(ROME, never)
    first = next(stream)
    tokens_at_close = counter.tokens
    stream.close()

    assert first
    assert counter.tokens - tokens_at_close <= 1


def test_max_tokens_bounds_the_reply(llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = CountingGenerator(llm._generator)
    monkeypatch.setattr(llm, "_generator", counter)
    monkeypatch.setattr(llm, "max_tokens", 5)

    text = "".join(llm.stream(ROME, never))

    assert counter.tokens <= 5
    assert 1 <= len(text.split()) <= 5


def test_sampling_with_a_temperature_still_answers(llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm, "temperature", 0.7)

    assert len("".join(llm.stream(HELLO, never)).split()) >= 2


def test_incremental_decoding_never_splits_characters(llm: Ct2Llm) -> None:
    tokenizer = llm._chat.tokenizer
    text = "Café au lait ☕, naïve 😀 日本語 — done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoder = IncrementalDecoder(lambda chunk: tokenizer.decode(chunk))

    deltas = [decoder.push(i) for i in ids]

    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert len(ids) > len([d for d in deltas if d])  # some multi-byte characters took several tokens


@pytest.mark.slow  # the transformers runtime is not the default one; make test-all runs it
def test_transformers_runtime_streams_and_stops() -> None:
    # The small packaged model: this checks the runtime, and its transformers folder is quick to build.
    engine = load_llm(Settings(llm_runtime="transformers", llm_model="smollm2-135m", llm_max_tokens=24))
    assert isinstance(engine, TransformersLlm)

    text = "".join(engine.stream(HELLO, never))
    deltas: list[str] = []
    stop = threading.Event()
    for delta in engine.stream(ROME, stop.is_set):
        deltas.append(delta)
        stop.set()

    assert looks_english(text), text
    assert len(deltas) == 1


@pytest.mark.slow  # the GPU path is not the CPU default; make test-all runs it
def test_the_gpu_decoding_path_runs_on_the_cpu_with_the_same_code() -> None:
    # On CUDA the transformers runtime decodes with a static KV cache (captured in CUDA graphs); the same
    # code, with the device as a parameter, streams here, and gives the eager path's greedy reply.
    source = llm_hf_source(Settings().resolved_cache_dir(), "smollm2-135m")
    static = TransformersLlm(source, device="cpu", max_tokens=16, static_cache=True)
    eager = TransformersLlm(source, device="cpu", max_tokens=16, static_cache=False)
    assert static.static_cache and not eager.static_cache
    assert "".join(static.stream(ROME, never)) == "".join(eager.stream(ROME, never))


def test_the_batched_engine_gives_each_of_several_callers_its_own_greedy_reply(
    llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm, "max_tokens", 20)
    prompts = [HELLO, ROME]
    alone = ["".join(llm.stream(p, never)) for p in prompts]
    together = replies_asked_together(llm, prompts)

    assert isinstance(llm, BatchedCt2Llm) and llm.max_batch > 1
    assert together[1] == alone[1]  # the same words, whoever else was decoded alongside
    assert looks_english(together[0]), together[0]


def test_a_reply_asked_for_while_another_is_decoded_joins_its_batch_at_the_next_token(
    llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(llm, BatchedCt2Llm)
    monkeypatch.setattr(llm, "max_tokens", 24)
    alone = ["".join(llm.stream(p, never)) for p in (BOOK, HELLO)]
    counting = CountingGenerator(llm._generator)
    monkeypatch.setattr(llm, "_generator", counting)
    first: list[str] = []
    second: list[str] = []
    third_token = threading.Event()
    asked = 0.0
    heard: list[float] = []

    def late_caller() -> None:
        nonlocal asked
        third_token.wait(10)
        asked = time.monotonic()
        for delta in llm.stream(HELLO, never):
            if not second:
                heard.append(time.monotonic() - asked)
            second.append(delta)

    late = threading.Thread(target=late_caller)
    late.start()
    for delta in llm.stream(BOOK, never):
        first.append(delta)
        if len(first) == 3:
            third_token.set()
    late.join()

    # The running reply stopped and went on beside the newcomer: a batch of one, then one of two.
    assert counting.batches[:2] == [1, 2], counting.batches
    # Both go on as replies (int8 decoding of a prompt and of a token one at a time round differently,
    # so near-ties can tip either way, as they do between a reply alone and in a batch).
    assert "".join(first[:3]) == "".join(alone[0])[: len("".join(first[:3]))]
    assert looks_english("".join(first)) and looks_english("".join(second)), (first, second)
    assert len("".join(first)) > len("".join(first[:3])) + 20  # it went on after the newcomer came
    print(f"batches {counting.batches}; the late caller's first token after {heard[0]:.2f}s")


def test_system_prompts_that_name_the_call_are_not_kept_by_ctranslate2_without_end(
    llm: Ct2Llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CTranslate2 never forgets a static prompt's state (~170 KB a token): an agent whose system prompt
    # names the caller would grow the process with every call.
    monkeypatch.setattr(llm, "_static_prompts", set())
    statics = []
    for caller in range(MAX_STATIC_PROMPTS + 3):
        messages: list[Message] = [
            {"role": "system", "content": f"You are the order desk. The caller is +4420794600{caller:02d}."},
            {"role": "user", "content": "Hello?"},
        ]
        static, rest = llm._prompt(messages)
        statics.append(static)
        assert rest  # the turn itself is never static
    assert all(statics[:MAX_STATIC_PROMPTS])
    assert not any(statics[MAX_STATIC_PROMPTS:])  # computed with the turn instead
    assert len(llm._static_prompts) == MAX_STATIC_PROMPTS
    first: list[Message] = [
        {"role": "system", "content": "You are the order desk. The caller is +442079460000."}
    ]
    assert llm._prompt([*first, {"role": "user", "content": "Again"}])[0] == statics[0]  # still cached


# OpenAI-compatible endpoint, against a fake server on loopback.


class FakeEndpoint(BaseHTTPRequestHandler):
    mode = "ok"
    requests: list[tuple[dict[str, str], dict[str, Any]]] = []  # noqa: RUF012
    release = threading.Event()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_event(self, data: str) -> None:
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def do_POST(self) -> None:
        # The client hanging up mid-stream is what a stop does: not an error here.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.respond()

    def respond(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeEndpoint.requests.append((dict(self.headers), body))
        if self.mode == "queued":
            FakeEndpoint.release.wait(10)  # a busy server that has not answered yet
        if self.path != "/v1/chat/completions" or self.mode == "error":
            payload = json.dumps({"error": {"message": "model overloaded"}}).encode()
            self.send_response(500 if self.path == "/v1/chat/completions" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.send_event(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        if self.mode == "malformed":
            self.send_event("{not json")
            return
        for piece in ("Hello", " from", " the", " endpoint."):
            self.send_event(json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}))
            self.wfile.write(b": keep-alive\n\n")
            if self.mode == "stall":
                FakeEndpoint.release.wait(10)
        self.send_event(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        self.send_event("[DONE]")


@pytest.fixture
def endpoint() -> Iterator[str]:
    FakeEndpoint.mode = "ok"
    FakeEndpoint.requests = []
    FakeEndpoint.release = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEndpoint)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    FakeEndpoint.release.set()
    server.shutdown()
    server.server_close()
    thread.join()


def test_endpoint_streams_deltas_and_sends_the_request(endpoint: str) -> None:
    settings = Settings(llm_url=endpoint, llm_endpoint_model="tiny", llm_api_key="sekret", llm_max_tokens=33)
    engine = load_llm(settings)
    assert isinstance(engine, OpenAiLlm)

    deltas = list(engine.stream(HELLO, never))

    assert deltas == ["Hello", " from", " the", " endpoint."]
    headers, body = FakeEndpoint.requests[0]
    assert body == {"model": "tiny", "messages": HELLO, "stream": True, "max_tokens": 33, "temperature": 0.0}
    assert headers["Authorization"] == "Bearer sekret"


def test_endpoint_stream_closes_promptly_on_stop_even_when_the_server_stalls(endpoint: str) -> None:
    FakeEndpoint.mode = "stall"
    engine = OpenAiLlm(endpoint)
    stop = threading.Event()
    deltas: list[str] = []

    started = time.perf_counter()
    for delta in engine.stream(HELLO, stop.is_set):
        deltas.append(delta)
        stop.set()
    elapsed = time.perf_counter() - started

    assert deltas == ["Hello"]
    assert elapsed < 2.0


def test_endpoint_request_is_abandoned_on_stop_before_the_server_answers(endpoint: str) -> None:
    FakeEndpoint.mode = "queued"
    stop = threading.Event()
    timer = threading.Timer(0.2, stop.set)
    timer.start()

    started = time.perf_counter()
    deltas = list(OpenAiLlm(endpoint).stream(HELLO, stop.is_set))
    elapsed = time.perf_counter() - started

    assert deltas == []
    assert elapsed < 2.0


@pytest.mark.parametrize(("mode", "message"), [("error", "HTTP 500"), ("malformed", "malformed")])
def test_endpoint_errors_raise_llm_error(endpoint: str, mode: str, message: str) -> None:
    FakeEndpoint.mode = mode

    with pytest.raises(LlmError, match=message):
        list(OpenAiLlm(endpoint).stream(HELLO, never))


def test_wrong_path_and_unreachable_endpoint_raise_llm_error(endpoint: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]

    with pytest.raises(LlmError, match="HTTP 404"):
        list(OpenAiLlm(endpoint + "/extra").stream(HELLO, never))
    with pytest.raises(LlmError, match=str(closed_port)):
        list(OpenAiLlm(f"http://127.0.0.1:{closed_port}/v1", timeout=2).stream(HELLO, never))
    with pytest.raises(ValueError):
        OpenAiLlm("ftp://example.com/v1")
