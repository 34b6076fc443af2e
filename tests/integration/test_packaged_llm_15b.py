"""`--llm-model qwen2.5-coder-1.5b`: the packaged 1.5B, joined from its 22 parts, answers in llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from parley.agent.opening import default_opening
from parley.config import DEFAULT_GREETING, DEFAULT_SYSTEM_PROMPT, Settings
from parley.engines import prepare_models
from parley.engines.cache import llm_gguf, verify_folder
from parley.engines.llm import Message
from parley.engines.llm_llamacpp import LlamaCppLlm
from parley.engines.llm_loading import load_llm

MODEL = "qwen2.5-coder-1.5b"
# Not the default model: ~20 s to load and answer on 2 cores, ~45 s more the first time (joined, checked
# and requantized into the cache), so it runs in `make test-all`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm() -> Iterator[LlamaCppLlm]:
    settings = Settings(llm_model=MODEL, llm_max_batch=1)
    engine = load_llm(settings, opening=default_opening(settings))
    assert isinstance(engine, LlamaCppLlm)  # the runtime `auto` picks for a packaged model on a CPU
    yield engine
    engine.close()


def test_the_15b_model_answers_a_plain_question(llm: LlamaCppLlm) -> None:
    messages: list[Message] = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "assistant", "content": DEFAULT_GREETING},
        {"role": "user", "content": "What is the capital of France?"},
    ]

    reply = "".join(d for d in llm.stream(messages, lambda: False) if isinstance(d, str))

    assert "paris" in reply.lower(), reply


def test_parley_prepare_assembles_and_verifies_the_15b_model() -> None:
    settings = Settings(llm_model=MODEL)

    prepare_models(settings)  # what `parley prepare --llm-model qwen2.5-coder-1.5b` runs

    gguf, folder = llm_gguf(settings.resolved_cache_dir(), MODEL)
    assert gguf.is_file() and verify_folder(folder)
