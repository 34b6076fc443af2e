"""Reply generation: a local model (CTranslate2 or transformers) or an OpenAI-compatible endpoint.

Every engine streams text deltas and honours `should_stop` between tokens, so a barge-in stops the
model itself, not only the reading of its output: the compute goes back to the other calls at once.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from parley.config import Settings
from parley.engines.cache import llm_ct2_dir, llm_hf_source
from parley.engines.device import cpu_threads, resolve_device

log = logging.getLogger(__name__)

Message = dict[str, str]

REPETITION_PENALTY = 1.2  # without it the small default model repeats itself until max_tokens
SAMPLING_TOPK = 40
ENDPOINT_TIMEOUT_S = 30.0


class LlmEngine(Protocol):
    def stream(self, messages: list[Message], should_stop: Callable[[], bool]) -> Iterator[str]: ...


class LlmError(RuntimeError):
    """The LLM could not produce a reply (endpoint unreachable, HTTP error, malformed stream)."""


def _input_ids(encoded: Any) -> list[int]:
    # apply_chat_template returns a list of ids or, in recent transformers, a BatchEncoding.
    if hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    ids = list(encoded)
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


class _IncrementalDecoder:
    """Turns a stream of token ids into text deltas that never split a character or a word piece.

    It decodes a short window of recent ids twice (with and without the newest) and yields the
    difference: tokenizers that drop a word's leading space when it starts the text still get it right,
    and the cost per token stays constant however long the reply grows.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # start of the window
        self._read = 0  # end of what has been yielded

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        # A trailing replacement character is half of a multi-byte character: wait for the rest.
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]


class Ct2Llm:
    """LlmEngine over a CTranslate2 Generator; `workers` replies are generated in parallel."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "cpu",
        workers: int = 2,
        max_tokens: int = 80,
        temperature: float = 0.0,
    ) -> None:
        import ctranslate2

        # The fast tokenizer class alone: AutoTokenizer would import torch, which this runtime never needs.
        from transformers import PreTrainedTokenizerFast

        workers = max(1, workers)
        # fix_mistral_regex: transformers reads CTranslate2's config.json beside the tokenizer, finds no
        # model type and warns about a Mistral tokenizer bug; these are not Mistral tokenizers.
        self._tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir), fix_mistral_regex=False)
        # The Rust tokenizer refuses concurrent use while one thread changes its padding/truncation.
        self._tokenizer_lock = threading.Lock()
        self._generator = ctranslate2.Generator(
            str(model_dir),
            device=device,
            compute_type="int8_float16" if device == "cuda" else "int8",
            inter_threads=workers,
            intra_threads=cpu_threads(workers),
        )
        self.device = device
        self.max_tokens = max_tokens
        self.temperature = temperature
        vocab = self._tokenizer.get_vocab()
        ends = [t for t in ("<|im_end|>", self._tokenizer.eos_token) if isinstance(t, str) and t in vocab]
        self._end_tokens = list(dict.fromkeys(ends))
        self._end_ids = {vocab[t] for t in self._end_tokens}

    def _prompt(self, messages: list[Message]) -> tuple[list[str], list[str]]:
        """(static prompt, the rest): the system message's tokens, when the prompt starts with them.

        CTranslate2 keeps the model state after a static prompt and starts the next generation from it:
        measured here, the first token of a reply came ~30 ms sooner.
        """
        with self._tokenizer_lock:
            ids = _input_ids(self._tokenizer.apply_chat_template(messages, add_generation_prompt=True))
            static: list[int] = []
            if messages and messages[0]["role"] == "system":
                static = _input_ids(
                    self._tokenizer.apply_chat_template(messages[:1], add_generation_prompt=False)
                )
                if ids[: len(static)] != static or len(static) == len(ids):
                    static = []
            tokens: list[str] = self._tokenizer.convert_ids_to_tokens(ids)
        return tokens[: len(static)], tokens[len(static) :]

    def _decode(self, ids: list[int]) -> str:
        with self._tokenizer_lock:
            text: str = self._tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def stream(self, messages: list[Message], should_stop: Callable[[], bool]) -> Iterator[str]:
        if should_stop():
            return
        sampling: dict[str, Any] = (
            {"sampling_topk": 1}
            if self.temperature <= 0
            else {"sampling_topk": SAMPLING_TOPK, "sampling_temperature": self.temperature}
        )
        static, prompt = self._prompt(messages)
        steps = self._generator.generate_tokens(
            prompt,
            static_prompt=static or None,
            max_length=self.max_tokens,
            repetition_penalty=REPETITION_PENALTY,
            end_token=self._end_tokens or None,
            # Runs in CTranslate2's worker before each next token: stops the model even while the
            # consumer is blocked elsewhere.
            callback=lambda _step: should_stop(),
            **sampling,
        )
        decoder = _IncrementalDecoder(self._decode)
        try:
            for step in steps:
                if step.token_id in self._end_ids or should_stop():
                    break
                delta = decoder.push(step.token_id)
                if delta:
                    yield delta
        finally:
            steps.close()  # waits for the model to stop (at most one more token)


class TransformersLlm:
    """LlmEngine over a transformers causal LM (hub name or local folder); GPU when there is one."""

    def __init__(
        self, source: str, *, device: str = "cpu", max_tokens: int = 80, temperature: float = 0.0
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        # Progress bars would garble the one-line-per-event server log.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        if device == "cuda" and not torch.cuda.is_available():
            log.warning("torch has no CUDA; the transformers LLM runs on CPU")
            device = "cpu"
        self.device = device
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._tokenizer = AutoTokenizer.from_pretrained(source)
        dtype = torch.float16 if device == "cuda" else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        self._model = model.to(device).eval()
        self._lock = threading.Lock()

    def stream(self, messages: list[Message], should_stop: Callable[[], bool]) -> Iterator[str]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        if should_stop():
            return
        with self._lock:
            encoded: Any = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
        streamer: Any = TextIteratorStreamer(self._tokenizer, skip_prompt=True, skip_special_tokens=True)
        stopped = threading.Event()
        failure: list[BaseException] = []

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                flag = stopped.is_set() or should_stop()
                return torch.full((input_ids.shape[0],), flag, dtype=torch.bool, device=input_ids.device)

        options: dict[str, Any] = {
            **{k: v.to(self.device) for k, v in encoded.items()},
            "max_new_tokens": self.max_tokens,
            "repetition_penalty": REPETITION_PENALTY,
            "streamer": streamer,
            "stopping_criteria": StoppingCriteriaList([_Stop()]),
            "pad_token_id": self._tokenizer.pad_token_id or self._tokenizer.eos_token_id,
        }
        if self.temperature > 0:
            options.update(do_sample=True, temperature=self.temperature, top_k=SAMPLING_TOPK)
        else:
            options.update(do_sample=False)

        def run() -> None:
            try:
                with torch.inference_mode():
                    self._model.generate(**options)
            except BaseException as exc:
                failure.append(exc)
                streamer.end()  # unblocks the reader, which then raises

        worker = threading.Thread(target=run, name="llm-transformers", daemon=True)
        worker.start()
        try:
            for text in streamer:
                if should_stop():
                    break
                if text:
                    yield text
            if failure:
                raise LlmError(f"generation failed: {failure[0]}") from failure[0]
        finally:
            stopped.set()
            worker.join()


class OpenAiLlm:
    """LlmEngine over an OpenAI-compatible /chat/completions endpoint (vLLM, llama.cpp, Ollama...).

    The standard library only: this runs in a stage thread, not on the event loop.
    """

    def __init__(
        self,
        url: str,
        *,
        model: str = "",
        api_key: str = "",
        max_tokens: int = 80,
        temperature: float = 0.0,
        timeout: float = ENDPOINT_TIMEOUT_S,
    ) -> None:
        parts = urllib.parse.urlsplit(url.rstrip("/") + "/chat/completions")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"llm_url must be an http(s) URL, not {url!r}")
        self.url = urllib.parse.urlunsplit(parts)
        self._parts = parts
        self.model = model
        self._api_key = api_key
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout = timeout

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
        return cls(self._parts.hostname or "", self._parts.port, timeout=self.timeout)

    def stream(self, messages: list[Message], should_stop: Callable[[], bool]) -> Iterator[str]:
        if should_stop():
            return
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "stream": True,
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            }
        ).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        path = self._parts.path + (f"?{self._parts.query}" if self._parts.query else "")
        conn = self._connect()
        done = threading.Event()
        # A busy or stalled endpoint would keep us blocked in a read; the watcher cuts the socket on a stop.
        watcher = threading.Thread(target=self._watch, args=(conn, done, should_stop), daemon=True)
        watcher.start()
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            if response.status != 200:
                detail = response.read(2000).decode("utf-8", "replace").strip()
                raise LlmError(f"{self.url}: HTTP {response.status} {response.reason}: {detail}")
            yield from self._events(response, should_stop)
        except (OSError, http.client.HTTPException) as exc:
            if should_stop():
                return
            raise LlmError(f"{self.url}: {exc}") from exc
        finally:
            done.set()
            watcher.join()
            conn.close()

    @staticmethod
    def _watch(
        conn: http.client.HTTPConnection, done: threading.Event, should_stop: Callable[[], bool]
    ) -> None:
        while not done.wait(0.02):
            sock = conn.sock  # None until connected: keep watching
            if sock is not None and should_stop():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                return

    def _events(self, response: http.client.HTTPResponse, should_stop: Callable[[], bool]) -> Iterator[str]:
        for raw in response:
            if should_stop():
                return
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue  # blank separators, comments (": keep-alive"), event:/id: fields
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise LlmError(f"{self.url}: malformed stream event {data[:200]!r}") from exc
            if not isinstance(chunk, dict):
                raise LlmError(f"{self.url}: unexpected stream event {data[:200]!r}")
            if chunk.get("error"):
                raise LlmError(f"{self.url}: {chunk['error']}")
            choices = chunk.get("choices") or []
            if not choices:
                continue
            content = (choices[0].get("delta") or {}).get("content")
            if content:
                yield str(content)


def load_llm(settings: Settings) -> LlmEngine:
    if settings.llm_url:
        return OpenAiLlm(
            settings.llm_url,
            model=settings.llm_endpoint_model,
            api_key=settings.llm_api_key,
            max_tokens=settings.llm_max_tokens,
            temperature=settings.llm_temperature,
        )
    device = resolve_device(settings.device)
    cache_dir = settings.resolved_cache_dir()
    if settings.llm_runtime == "transformers":
        return TransformersLlm(
            llm_hf_source(cache_dir, settings.llm_model),
            device=device,
            max_tokens=settings.llm_max_tokens,
            temperature=settings.llm_temperature,
        )
    return Ct2Llm(
        llm_ct2_dir(cache_dir, settings.llm_model),
        device=device,
        workers=settings.llm_workers,
        max_tokens=settings.llm_max_tokens,
        temperature=settings.llm_temperature,
    )
