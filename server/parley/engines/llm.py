"""Reply generation, what every LLM engine shares: the engine protocol and its message types, the chat
tokenizer and the tool calls a local model writes in its text. The runtimes are modules of their own
(llm_llamacpp, llm_ct2, llm_batching, llm_transformers, endpoint); llm_loading picks and loads one.

Every engine streams text deltas and honours `should_stop` between tokens, so a barge-in stops the
model itself, not only the reading of its output: the compute goes back to the other calls at once.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from parley.engines.toolcalls import CLOSE_TAG, OPEN_TAG, TaggedToolCalls, ToolCall

Message = dict[str, Any]  # OpenAI chat format: role, content, and tool_calls / tool_call_id for tools

REPETITION_PENALTY = 1.2  # without it the small default model repeats itself until max_tokens
SAMPLING_TOPK = 40
ENDPOINT_TIMEOUT_S = 30.0


Tools = list[dict[str, Any]]  # OpenAI `tools` (type function, with a JSON Schema of parameters)
# What a reply may do with the tools offered to it (they stay in its prompt either way, as the
# conversation's other prompts have them): True, call them if it chooses; False, words only; a tuple of
# names, it must call one of those (OpenAI's tool_choice "required", narrowed to those tools).
Calls = bool | tuple[str, ...]


@dataclass(frozen=True)
class Opening:
    """What every conversation of an agent begins with (its prompt, greeting and the tools it offers):
    an in-process model reads it when it loads, and each call copies it (engines/llm_llamacpp.py)."""

    messages: list[Message]
    tools: Tools | None = None


def offered(tools: Tools | None, names: tuple[str, ...]) -> Tools:
    """The offered tools that `names` names, in their order."""
    return [t for t in tools or [] if t.get("function", {}).get("name") in names]


def allows(calls: Calls, call: ToolCall) -> bool:
    """Whether a reply asked with `calls` may make `call` (a runtime or server that cannot hold the model
    to the choice has the calls it may not make dropped)."""
    return calls is True or (calls is not False and call.name in calls)


class LlmEngine(Protocol):
    """An engine may also say `reuses_prefixes = True` (a server that caches prompt prefixes): the LLM
    stage then windows the history so that each prompt begins with the previous one."""

    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: Tools | None = None,
        *,
        calls: Calls = True,
    ) -> Iterator[str | ToolCall]:
        """Reply text as it comes, and the tools the model asks for (when it was offered `tools`), as
        `calls` allows (see `Calls`)."""
        ...


@runtime_checkable
class JsonReplies(Protocol):
    """An engine that can hold a whole reply to a JSON Schema (llama.cpp by the schema's grammar, an
    endpoint by its `response_format`): what a post-call analysis asks for (analysis/)."""

    def json_reply(
        self,
        messages: list[Message],
        schema: dict[str, Any],
        should_stop: Callable[[], bool],
        *,
        max_tokens: int = ...,
    ) -> str:
        """The reply's text: JSON of `schema` when the reply ended by itself ("" when stopped first)."""
        ...


def template_messages(messages: list[Message]) -> list[Message]:
    """Messages as chat templates take them: tool-call arguments as objects, not JSON text."""
    converted: list[Message] = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [_with_object_arguments(call) for call in calls]}
        converted.append(message)
    return converted


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    with contextlib.suppress(ValueError, TypeError):
        function["arguments"] = json.loads(function.get("arguments") or "{}")
    return {**call, "function": function}


def with_tagged_tool_calls(deltas: Iterator[str], tools: Tools | None) -> Iterator[str | ToolCall]:
    """A local model's text with its `<tool_call>` blocks turned into ToolCalls (when tools were offered)."""
    if not tools:
        yield from deltas
        return
    tags = TaggedToolCalls()
    for delta in deltas:
        text, calls = tags.push(delta)
        if text:
            yield text
        yield from calls
    text, calls = tags.flush()
    if text:
        yield text
    yield from calls


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


class IncrementalDecoder:
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


class LocalLlm:
    """A model run here (not an endpoint): its text, with the tool calls its chat template asks for."""

    def stream(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: Tools | None = None,
        *,
        calls: Calls = True,
    ) -> Iterator[str | ToolCall]:
        deltas = with_tagged_tool_calls(self._text(messages, should_stop, tools, calls), tools)
        # One that must call and speaks instead is left its words.
        return (d for d in deltas if not isinstance(d, ToolCall) or allows(calls, d))

    def _text(
        self,
        messages: list[Message],
        should_stop: Callable[[], bool],
        tools: Tools | None,
        calls: Calls = True,
    ) -> Iterator[str]:
        raise NotImplementedError


class ChatTokenizer:
    """A chat model's tokenizer: prompts as token ids, ids back to text, its end and tool-call tokens."""

    def __init__(self, folder: Path) -> None:
        # The fast tokenizer class alone: AutoTokenizer would import torch, which this runtime never needs.
        from transformers import PreTrainedTokenizerFast

        # fix_mistral_regex: transformers reads CTranslate2's config.json beside the tokenizer, finds no
        # model type and warns about a Mistral tokenizer bug; these are not Mistral tokenizers.
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), fix_mistral_regex=False)
        # The Rust tokenizer refuses concurrent use while one thread changes its padding/truncation.
        self.lock = threading.Lock()
        vocab = self.tokenizer.get_vocab()
        ends = [t for t in ("<|im_end|>", self.tokenizer.eos_token) if isinstance(t, str) and t in vocab]
        self.end_tokens = list(dict.fromkeys(ends))
        self.end_ids = {vocab[t] for t in self.end_tokens}
        # A sentence's last mark, where it is a token of its own (a reply may end a sentence as another did)
        marks = (self._single_token(mark) for mark in (".", "!", "?", "...", "…"))
        self.sentence_end_ids = {token for token in marks if token is not None}
        # Tool-call tags are added tokens that decoding with skip_special_tokens would drop: pass them on.
        self.tag_ids = {vocab[t]: t for t in (OPEN_TAG, CLOSE_TAG) if t in vocab}

    def prompt_ids(
        self, messages: list[Message], tools: Tools | None = None, *, reply: bool = True
    ) -> list[int]:
        """The chat template's tokens for `messages`, ending with the reply's opening when `reply`."""
        with self.lock:
            return _input_ids(
                self.tokenizer.apply_chat_template(
                    template_messages(messages), tools=tools, add_generation_prompt=reply
                )
            )

    def next_turn_opening(self) -> list[int]:
        """The template's tokens between a reply's own and the caller's next words (ChatML: the reply's
        `<|im_end|>`, a new line, `<|im_start|>user` and a new line); [] where they cannot be told apart."""
        words = "Hello there."
        said = [{"role": "system", "content": "x"}, {"role": "assistant", "content": words}]
        ids = self.prompt_ids([*said, {"role": "user", "content": words}], reply=False)
        own = self.encode(words)
        at = [i for i in range(len(ids) - len(own) + 1) if ids[i : i + len(own)] == own]
        if len(at) != 2:
            return []
        return ids[at[0] + len(own) : at[1]]

    def _single_token(self, text: str) -> int | None:
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    def encode(self, text: str) -> list[int]:
        """`text`'s tokens on their own, as a reply that said it would have written them."""
        with self.lock:
            return _input_ids(self.tokenizer.encode(text, add_special_tokens=False))

    def pieces(self, ids: list[int]) -> list[str]:
        if not ids:
            return []
        with self.lock:
            pieces: list[str] = self.tokenizer.convert_ids_to_tokens(ids)
        return pieces

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text


STEPS_DONE = object()  # put after a reply's last token id
STEP_POLL_S = 0.05  # how often a caller waiting for its next token checks whether it should stop


def deltas_from_steps(
    steps: queue.SimpleQueue[Any], should_stop: Callable[[], bool], chat: ChatTokenizer
) -> Iterator[str]:
    """Text deltas from the token ids a decoding thread puts in `steps` (then STEPS_DONE, or an error)."""
    decoder = IncrementalDecoder(chat.decode)
    while True:
        try:
            step = steps.get(timeout=STEP_POLL_S)
        except queue.Empty:
            if should_stop():
                return
            continue
        if step is STEPS_DONE:
            return
        if isinstance(step, BaseException):
            raise LlmError(f"generation failed: {step}") from step
        if step in chat.end_ids or should_stop():
            return
        tag = chat.tag_ids.get(step)
        delta = tag if tag is not None else decoder.push(step)
        if delta:
            yield delta
