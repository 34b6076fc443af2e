"""A tool call the local model may write: the offered tools' JSON Schemas as a llama.cpp grammar.

Once the model has opened a call, what follows is held to
`{"name": <an offered tool>, "arguments": <valid for that tool's parameters>}` and the call's close:
the tool is a real one, the JSON is whole, required keys are there, enums and types are kept (strings
are free). A model opens a call in one of three ways (`Opening`): the chat template's `<tool_call>`
tag, a reply that is the call's JSON alone, or one that opens a fenced block; each has its own root in
one grammar. `tool_call_grammar` writes it (GBNF, through the JSON Schema converter that
llama-cpp-python ships); `ToolCallGrammar` is one reply's place in it, a llama.cpp grammar sampler of
its own, so each conversation's call is held apart from the others'. `json_grammar` holds a whole reply
to one JSON Schema the same way (a post-call analysis's extraction: analysis/).

Checking a token against the grammar costs a pass over the token's text, and the whole vocabulary is
~150,000 tokens: the tokens the reply would take anyway are checked first, the vocabulary only when
none of them fits (see `restrict`). Outside a call nothing is checked.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np

from parley.engines.toolcalls import CLOSE_TAG
from parley.log import event

log = logging.getLogger(__name__)

# A grammar sampler checks `llama_token_data` entries: (token id, logit, probability).
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# Checking a token costs ~0.05 ms, the whole vocabulary (~150,000 tokens) 55-90 ms on a busy 2-core
# machine, several decoding steps: when the model's favourite is refused, its next best are checked first.
SHORTLIST = 256
# JSON forbids raw control characters in a string; the converter's own rule lets them through.
JSON_STRING_CHAR = r'char ::= [^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
# Between JSON's tokens, a space or a new line and indent: the model's `{\n` opening is one of its calls'.
JSON_SPACE = r'space ::= | " " | "\n" [ \t]{0,20}'
_RULE = re.compile(r"^(char|space) ::= .*$", re.MULTILINE)
# A token that opens a reply with the call's JSON, or with a fence (byte-level BPE writes a space Ġ, a
# new line Ċ, a tab ĉ; SentencePiece a space ▁)
_BARE_OPENING = re.compile(r"^[\sĠĊĉ▁]*\{")
_FENCED_OPENING = re.compile(r"^[\sĠĊĉ▁]*```")


class Opening(Enum):
    """How a reply opened its call: the grammar's root for what follows (and for `BARE` and `FENCED`,
    for the opening token itself)."""

    # Qwen2.5-Coder-0.5B, though its template asks for the tag, opened every call of `parley bench
    # tools` bare: its first token `{"` or `{\n` at 0.40-0.87, a fence (```) at up to 0.18, the tag
    # under 0.0001.

    TAGGED = "root"  # after `<tool_call>`: the call, then `</tool_call>`; then the model goes on
    BARE = "bare"  # the reply is the call's JSON, and ends there
    FENCED = "fenced"  # the reply is a fenced block (```json) holding the call, and ends there


class ToolGrammarError(ValueError):
    """The offered tools' schemas could not be made into a grammar."""


def tool_call_grammar(tools: Sequence[dict[str, Any]]) -> str:
    """GBNF for one call to one of `tools` (OpenAI `tools`), with a root for each `Opening`.

    Raises ToolGrammarError for a schema the converter does not take (a remote `$ref`, say).
    """
    from llama_cpp import llama_grammar

    schema_converter: Any = llama_grammar.SchemaConverter  # untyped in llama-cpp-python
    # Arguments in the order their schema lists them, as the prompt shows them to the model (an order
    # forced on them moved a restaurant booking's "name" first, and the model put the time in it).
    converter = schema_converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    calls: list[str] = []
    try:
        for i, tool in enumerate(tools):
            function = tool.get("function") or {}
            name = function.get("name")
            if not isinstance(name, str) or not name:
                continue
            # The converter writes resolved references into the schema it reads: never the agent's own.
            parameters = copy.deepcopy(function.get("parameters") or {"type": "object", "properties": {}})
            parameters = converter.resolve_refs(parameters, f"tool:{name}")
            arguments = converter.visit(parameters, f"tool-{i}-arguments")
            calls.append(
                f'"{{" space {_literal(json.dumps("name"))} space ":" space {_literal(json.dumps(name))} '
                f'space "," space {_literal(json.dumps("arguments"))} space ":" space {arguments} "}}" space'
            )
        if not calls:
            raise ToolGrammarError("no tool has a name")
        rules = _RULE.sub(_json_rule, converter.format_grammar())
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ToolGrammarError(f"the tools' schemas make no grammar: {exc}") from exc
    rules = "call ::= " + " | ".join(f"( {call} )" for call in calls) + "\n" + rules
    # The chat template writes `<tool_call>\n{...}\n</tool_call>`; the model may leave the new lines out.
    roots = (
        f'{Opening.TAGGED.value} ::= "\\n"? call "\\n"? {json.dumps(CLOSE_TAG)}',
        f'{Opening.BARE.value} ::= " "? call',
        f'{Opening.FENCED.value} ::= " "? "```" "json"? "\\n"? call "\\n"? "```"',
    )
    return "\n".join([*roots, rules, ""])


def json_grammar(schema: Mapping[str, Any]) -> str:
    """GBNF for a reply that is one JSON value of `schema` and nothing else (a post-call extraction),
    written by the same converter and JSON rules as a tool call's arguments and rooted at
    `Opening.BARE`: a reply held to it from its first token (token_choice.py) is that JSON.

    Raises ToolGrammarError for a schema the converter does not take.
    """
    from llama_cpp import llama_grammar

    schema_converter: Any = llama_grammar.SchemaConverter  # untyped in llama-cpp-python
    converter = schema_converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        resolved = converter.resolve_refs(copy.deepcopy(dict(schema)), "json")
        value = converter.visit(resolved, "json-value")
        rules = _RULE.sub(_json_rule, converter.format_grammar())
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ToolGrammarError(f"the schema makes no grammar: {exc}") from exc
    return f'{Opening.BARE.value} ::= " "? {value}\n{rules}\n'


@functools.lru_cache(maxsize=16)
def _cached_json_grammar(key: str) -> str | None:
    try:
        return json_grammar(json.loads(key))
    except ToolGrammarError as exc:
        event(log, "json_grammar_unusable", logging.WARNING, error=str(exc))
        return None


def json_grammar_for(schema: Mapping[str, Any]) -> str | None:
    """`json_grammar(schema)`, made once per schema; None when it makes none."""
    return _cached_json_grammar(json.dumps(schema))


def _literal(text: str) -> str:
    """`text` as a GBNF string literal (whose escapes are JSON's)."""
    return json.dumps(text)


def _json_rule(match: re.Match[str]) -> str:
    return JSON_STRING_CHAR if match.group(1) == "char" else JSON_SPACE


def reply_openings(vocab: Mapping[str, int]) -> dict[int, Opening]:
    """The tokens (of a tokenizer's `vocab`, piece -> id) that open a reply with a call's JSON or a
    fence, and how."""
    openings: dict[int, Opening] = {}
    for piece, token in vocab.items():
        if _BARE_OPENING.match(piece):
            openings[token] = Opening.BARE
        elif _FENCED_OPENING.match(piece):
            openings[token] = Opening.FENCED
    return openings


@functools.lru_cache(maxsize=16)
def _cached_grammar(key: str) -> str | None:
    try:
        return tool_call_grammar(json.loads(key))
    except ToolGrammarError as exc:
        # Decoding goes on unconstrained: the call is then checked where it is run, as before.
        event(log, "tool_grammar_unusable", logging.WARNING, error=str(exc))
        return None


def grammar_for(tools: Sequence[dict[str, Any]]) -> str | None:
    """`tool_call_grammar(tools)`, made once per set of tools; None when they make none."""
    return _cached_grammar(json.dumps(list(tools)))  # in order: the arguments are written in it


class ToolCallGrammar:
    """One reply's tool call as it is decoded: which tokens may come next, and when it is whole.

    Its grammar sampler is used by one thread (the decoding thread) and freed by `close`.
    """

    def __init__(
        self, lc: Any, vocab: Any, grammar: str, ends: Sequence[int], opening: Opening = Opening.TAGGED
    ) -> None:
        self._lc = lc
        self.opening = opening
        self._n_vocab = int(lc.llama_vocab_n_tokens(vocab))
        self._ends = np.asarray(list(ends)[:1], dtype=np.int32)
        self._sampler = lc.llama_sampler_init_grammar(vocab, grammar.encode(), opening.value.encode())
        if not self._sampler:
            raise ToolGrammarError("llama.cpp could not parse the tool-call grammar")

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        """For each of `tokens`, whether the grammar lets it come next."""
        data = np.zeros(len(tokens), dtype=_TOKEN_DATA)
        data["id"] = tokens
        array = self._lc.llama_token_data_array(
            data=data.ctypes.data_as(self._lc.llama_token_data_p),
            size=len(data),
            selected=-1,
            sorted=False,
        )
        self._lc.llama_sampler_apply(self._sampler, ctypes.byref(array))
        # The grammar sampler marks a token it refuses with a logit of -inf, in place.
        return np.asarray(np.isfinite(data["logit"]))

    def restrict(self, scores: np.ndarray, first: int = 1) -> None:
        """Leave finite only the scores of tokens that may come next: among the `first` best if any of
        them may (a sampler that takes from those `first` needs no more), else among the SHORTLIST best,
        else among the whole vocabulary. For greedy decoding each step gives the token a mask of the
        whole vocabulary would. Raises ToolGrammarError when no token may come next."""
        for size in (first, SHORTLIST):
            size = max(1, min(size, len(scores)))
            best = np.array([int(scores.argmax())]) if size == 1 else np.argpartition(scores, -size)[-size:]
            ok = self.allowed(best)
            if ok.any():
                keep = best[ok]
                kept = scores[keep]
                scores.fill(-np.inf)
                scores[keep] = kept
                return
        ok = self.allowed(np.arange(self._n_vocab, dtype=np.int32))
        if len(scores) > self._n_vocab:  # rows past the tokenizer's tokens (padding) are never text
            scores[self._n_vocab :] = -np.inf
        scores[: self._n_vocab][~ok] = -np.inf
        if not ok.any():
            raise ToolGrammarError("the tool-call grammar allows no next token")

    def accept(self, token: int) -> bool:
        """Take `token` as written; whether the call is now whole. Raises ToolGrammarError for a token
        the grammar refuses (llama.cpp would abort the process on it)."""
        if not self.allowed(np.array([token], dtype=np.int32))[0]:
            raise ToolGrammarError(f"the tool-call grammar refuses token {token}")
        self._lc.llama_sampler_accept(self._sampler, token)
        # A whole call is where the grammar would let the reply end.
        return bool(self._ends.size) and bool(self.allowed(self._ends)[0])

    def close(self) -> None:
        if self._sampler:
            self._lc.llama_sampler_free(self._sampler)
            self._sampler = None
