"""The chat model that plays a scenario's LLM caller and judges its call: an OpenAI-compatible endpoint
(`--judge-url` and the like), or the local LLM `parley serve` runs by default.

One request, one whole answer: neither the caller nor the judge has anything to do with half an answer,
so nothing here streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import replace
from typing import Any, Protocol

import aiohttp
import yarl

from parley.engine_settings import EngineSettings
from parley.engines.llm import LlmEngine, LlmError
from parley.log import event

log = logging.getLogger(__name__)

CHAT_TIMEOUT_S = 60.0  # a hosted model's whole answer (not a stream's first token) may take this long
ERROR_DETAIL_CHARS = 300  # of an endpoint's error body, quoted in the ChatError
# The local model is loaded for answers this long at most; a request asks for less (see LocalChat).
LOCAL_MAX_TOKENS = 512


class ChatError(RuntimeError):
    """The model gave no answer: the endpoint was unreachable, refused, or answered something else."""


class ChatModel(Protocol):
    async def complete(
        self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float = 0.0
    ) -> str:
        """The model's answer to `messages` (OpenAI chat format: role and content), at most `max_tokens`
        long. Raises ChatError when there is none."""
        ...


class EndpointChat:
    """A model behind an OpenAI-compatible /chat/completions endpoint (vLLM, llama.cpp's server, Ollama,
    a hosted API). `url` is its base (`http://host:8000/v1`) or the whole `.../chat/completions`; a user
    and password in it are sent as HTTP Basic credentials, an API key (`parley test` passes
    $OPENAI_API_KEY) as the bearer instead."""

    def __init__(
        self, url: str, model: str = "", api_key: str = "", *, timeout_s: float = CHAT_TIMEOUT_S
    ) -> None:
        given = yarl.URL(url)
        if given.scheme not in ("http", "https") or not given.host:
            # Not quoted back: a URL that is not one may still hold a password where the host should be.
            raise ValueError(
                "the chat model's URL must be http(s)://host[:port]/... (an OpenAI-compatible API)"
            )
        path = given.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            path += "/chat/completions"
        # The URL goes into error messages: without the user and password it may carry.
        self.url = given.with_user(None).with_path(path).with_query(given.query)
        self._basic = (
            aiohttp.encode_basic_auth(given.user, given.password or "") if given.user is not None else ""
        )
        self.model = model
        self._api_key = api_key
        self.timeout_s = timeout_s

    async def complete(
        self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float = 0.0
    ) -> str:
        request = {
            "model": self.model,
            "messages": messages,
            "stream": False,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        authorization = f"Bearer {self._api_key}" if self._api_key else self._basic
        headers = {"Authorization": authorization} if authorization else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(self.url, json=request, headers=headers) as response,
            ):
                body = await response.text(errors="replace")
                if not 200 <= response.status < 300:
                    detail = " ".join(body.split())[:ERROR_DETAIL_CHARS]
                    raise ChatError(f"{self.url}: HTTP {response.status} {response.reason}: {detail}")
        except TimeoutError as exc:
            raise ChatError(f"{self.url}: no answer within {self.timeout_s:g} s") from exc
        except aiohttp.ClientError as exc:
            raise ChatError(f"{self.url}: {exc}") from exc
        return self._answer_text(body)

    def _answer_text(self, body: str) -> str:
        try:
            answer: Any = json.loads(body)
        except ValueError:
            raise ChatError(f"{self.url}: the answer is not JSON: {body[:ERROR_DETAIL_CHARS]!r}") from None
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ChatError(
                f"{self.url}: the answer has no choices[0].message: {body[:ERROR_DETAIL_CHARS]!r}"
            ) from None
        # null content: the model said nothing (a refusal, or only a tool call nobody offered it)
        return content if isinstance(content, str) else ""


class LocalChat:
    """The local LLM `parley serve` runs by default (or the one `settings` name), loaded here on the first
    request (seconds; the weights are packaged) and asked from a worker thread, so the event loop that
    plays the call goes on meanwhile.

    It is greedy and decodes one answer at a time, so that the same conversation gets the same answer
    on every run (a batch's other replies would change its arithmetic). An engine's longest answer is
    set when it loads: it is loaded for LOCAL_MAX_TOKENS, and a request that asks for fewer is cut off
    after as many pieces of text, each of which is at least one token.
    """

    def __init__(self, settings: EngineSettings | None = None) -> None:
        self._settings = settings if settings is not None else EngineSettings()
        self._engine: LlmEngine | None = None
        self._loading = threading.Lock()

    async def complete(
        self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float = 0.0
    ) -> str:
        if temperature != 0.0:
            raise ValueError("the local chat model answers greedily (temperature 0) only")
        return await asyncio.to_thread(self._complete, messages, max_tokens)

    def close(self) -> None:
        """Stop the model's threads and free it, when it was loaded."""
        with self._loading:
            engine, self._engine = self._engine, None
        close = getattr(engine, "close", None)
        if callable(close):
            close()

    def _complete(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        engine = self._loaded()
        enough = threading.Event()
        pieces: list[str] = []
        deltas = engine.stream([dict(m) for m in messages], enough.is_set)
        try:
            for delta in deltas:
                if isinstance(delta, str):
                    pieces.append(delta)
                    if len(pieces) >= max_tokens:
                        enough.set()  # the engine stops before its next token
                        break
        except LlmError as exc:
            raise ChatError(f"the local LLM failed: {exc}") from exc
        finally:
            close = getattr(deltas, "close", None)
            if callable(close):
                close()
        return "".join(pieces)

    def _loaded(self) -> LlmEngine:
        with self._loading:
            if self._engine is None:
                # Imported here: the engines' runtimes are heavy, and a run with an endpoint never needs them.
                from parley.engines.llm_loading import load_llm

                settings = replace(
                    self._settings,
                    llm_url="",
                    llm_max_tokens=LOCAL_MAX_TOKENS,
                    llm_temperature=0.0,
                    llm_max_batch=1,
                )
                started = time.perf_counter()
                try:
                    self._engine = load_llm(settings)
                except Exception as exc:  # a missing model, a runtime that will not load: the run says so
                    raise ChatError(f"the local LLM {settings.local_llm()!r} could not load: {exc}") from exc
                event(
                    log,
                    "scenario_llm_loaded",
                    model=settings.local_llm(),
                    impl=type(self._engine).__name__,
                    seconds=round(time.perf_counter() - started, 2),
                )
            return self._engine


def chat_for(url: str | None, model: str = "", api_key: str = "") -> ChatModel:
    """The model at `url` (an OpenAI-compatible endpoint; `model`: the name it is asked for, which a
    hosted API needs), or the local one when there is none."""
    return EndpointChat(url, model, api_key) if url else LocalChat()
