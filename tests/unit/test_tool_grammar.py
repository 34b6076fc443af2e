"""A tool call held to the offered tools' schemas: what the grammar lets come next, token by token.

Model-free: llama.cpp loads a vocabulary of a few hundred tokens (every byte, some JSON pieces, the
chat template's tags) from a GGUF written here, with no weights, and the tests feed it token sequences.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parley.bench.tools import TOOLS
from parley.engines.tool_grammar import (
    Opening,
    ToolCallGrammar,
    ToolGrammarError,
    grammar_for,
    reply_openings,
    tool_call_grammar,
)
from parley.engines.toolcalls import CLOSE_TAG, OPEN_TAG

JSON_PIECES = ['{"', '":', ' "', '",', '"}', "}}", " {"]
PIECES = [*JSON_PIECES, "name", "arguments", "lookup_order", "number", "destination"]
END = "<|im_end|>"


def _byte_level() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character a byte-level BPE vocabulary writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars = {b: chr(b) for b in printable}
    rest = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + i) for i, b in enumerate(rest)})
    return chars


class ToyVocab:
    """A Qwen-like vocabulary without a model: single bytes, a few JSON pieces, the end and call tags."""

    def __init__(self, folder: Path) -> None:
        import gguf
        import llama_cpp as lc

        chars = _byte_level()
        spell = lambda text: "".join(chars[b] for b in text.encode())  # noqa: E731
        self.texts = [bytes([b]).decode("latin-1") for b in range(256)] + [*PIECES, END, OPEN_TAG, CLOSE_TAG]
        tokens = [chars[b] for b in range(256)] + [spell(p) for p in PIECES] + [END, OPEN_TAG, CLOSE_TAG]
        normal, control, user_defined = 1, 3, 4
        types = [normal] * (256 + len(PIECES)) + [control, user_defined, user_defined]
        path = folder / "toy-vocab.gguf"
        writer = gguf.GGUFWriter(str(path), "qwen2")
        writer.add_context_length(64)
        writer.add_embedding_length(8)
        writer.add_block_count(1)
        writer.add_feed_forward_length(8)
        writer.add_head_count(1)
        writer.add_head_count_kv(1)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges([f"{spell(' ')} {spell(' ')}"])
        writer.add_eos_token_id(self.id(END))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self.lc = lc
        self.model = lc.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, "llama.cpp could not load the toy vocabulary"
        self.vocab = lc.llama_model_get_vocab(self.model)

    def id(self, text: str) -> int:
        """The token for `text`: a piece or a tag when there is one, else a single byte."""
        return self.texts.index(text)

    def ids(self, pieces: list[str]) -> list[int]:
        return [self.id(p) for p in pieces]

    def grammar(self, tools: list[dict[str, Any]], opening: Opening = Opening.TAGGED) -> ToolCallGrammar:
        return ToolCallGrammar(self.lc, self.vocab, tool_call_grammar(tools), [self.id(END)], opening)

    def close(self) -> None:
        self.lc.llama_model_free(self.model)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToyVocab]:
    toy = ToyVocab(tmp_path_factory.mktemp("vocab"))
    yield toy
    toy.close()


def written(vocab: ToyVocab, grammar: ToolCallGrammar, pieces: list[str]) -> list[bool]:
    """Feed `pieces` (a piece, a tag, or one character each) and say, after each, whether the call is
    whole."""
    return [grammar.accept(token) for token in vocab.ids(pieces)]


def may_follow(vocab: ToyVocab, grammar: ToolCallGrammar, *pieces: str) -> list[bool]:
    return [bool(ok) for ok in grammar.allowed(np.array(vocab.ids(list(pieces)), dtype=np.int32))]


CALL_START = ["\n", '{"', "name", '":', ' "']


def test_after_the_opening_tag_only_a_call_to_an_offered_tool_may_follow(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS)
    assert may_follow(vocab, grammar, "\n", "{", '{"') == [True, True, True]
    assert may_follow(vocab, grammar, "H", " ", END) == [False, False, False]
    written(vocab, grammar, CALL_START)
    # lookup_order, cancel_order, transfer, end_call: a name starts with l, c, t or e, or is one of them
    assert may_follow(vocab, grammar, "lookup_order", "l", "c", "t", "e") == [True] * 5
    assert may_follow(vocab, grammar, "x", "d", '"') == [False, False, False]
    grammar.close()


def test_a_call_keeps_its_tools_arguments_an_enum_takes_only_its_values(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS)
    written(vocab, grammar, [*CALL_START, *"transfer", '",', ' "', "arguments", '":', " {", '"'])
    assert may_follow(vocab, grammar, "destination", "number") == [True, False]
    written(vocab, grammar, ["destination", '":', ' "'])
    # the only destination offered is sip:desk@pbx.example.com
    assert may_follow(vocab, grammar, "s", "+", "t", '"') == [True, False, False, False]
    grammar.close()


def test_required_arguments_come_before_the_call_closes(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS)
    written(vocab, grammar, [*CALL_START, "lookup_order", '",', ' "', "arguments", '":', " {"])
    assert may_follow(vocab, grammar, "}", "}}", '"') == [False, False, True]
    grammar.close()


def test_an_argument_string_is_free_but_stays_json(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS)
    written(vocab, grammar, [*CALL_START, "lookup_order", '",', ' "', "arguments", '":', " {"])
    written(vocab, grammar, ['"', "number", '":', ' "'])
    assert may_follow(vocab, grammar, "1", "a", " ", "\xc3", "\\", '"') == [True] * 6
    # a raw new line or tab would make the call's JSON invalid
    assert may_follow(vocab, grammar, "\n", "\t") == [False, False]
    grammar.close()


def test_the_call_is_whole_at_its_closing_tag_and_not_before(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS)
    call = [*CALL_START, *"end_call", '",', ' "', "arguments", '":', " {", "}}", "\n", CLOSE_TAG]
    whole = written(vocab, grammar, call)
    assert whole == [False] * (len(call) - 1) + [True]
    grammar.close()


def test_a_refused_token_raises_instead_of_taking_the_process_down(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS)
    with pytest.raises(ToolGrammarError):
        grammar.accept(vocab.id("x"))
    assert written(vocab, grammar, ["\n", '{"']) == [False, False]  # and the grammar is where it was
    grammar.close()


def test_each_reply_holds_its_own_place_in_its_own_grammar(vocab: ToyVocab) -> None:
    one, other = vocab.grammar(TOOLS), vocab.grammar(TOOLS[:1])
    written(vocab, one, [*CALL_START, "lookup_order", '",'])
    assert may_follow(vocab, other, "\n", ' "') == [True, False]  # still at its start
    written(vocab, other, CALL_START)
    assert may_follow(vocab, other, "lookup_order", "t") == [True, False]  # only lookup_order offered
    assert may_follow(vocab, one, ' "', "x") == [True, False]
    one.close()
    other.close()


def test_the_best_allowed_token_is_kept_whether_or_not_it_was_the_best(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS)
    scores = np.zeros(len(vocab.texts), dtype=np.float32)
    scores[vocab.id("H")] = 9.0  # "Hello": the model's favourite, refused here
    scores[vocab.id('{"')] = 5.0
    scores[vocab.id("\n")] = 4.0
    grammar.restrict(scores)
    assert int(scores.argmax()) == vocab.id('{"')
    assert np.isfinite(scores).sum() == 3  # "\n", "{" and '{"' are all that may start the call
    best = np.zeros(len(vocab.texts), dtype=np.float32)
    best[vocab.id("\n")] = 9.0
    grammar.restrict(best, first=1)  # the favourite fits: nothing else needs checking
    assert np.flatnonzero(np.isfinite(best)).tolist() == [vocab.id("\n")]
    grammar.close()


def test_schemas_with_references_types_and_optional_keys_make_a_grammar(vocab: ToyVocab) -> None:
    booking = {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "$defs": {"seats": {"type": "integer"}},
                "properties": {"seats": {"$ref": "#/$defs/seats"}, "note": {"type": "string"}},
                "required": ["seats"],
            },
        },
    }
    original = json.dumps(booking, sort_keys=True)
    grammar = vocab.grammar([booking])
    assert json.dumps(booking, sort_keys=True) == original  # the agent's schema is left as it was
    written(vocab, grammar, [*CALL_START, *"book", '",', ' "', "arguments", '":', " {", '"'])
    assert may_follow(vocab, grammar, "s", "n") == [True, False]  # in the schema's order, as prompted
    written(vocab, grammar, [*'seats":', " "])
    assert may_follow(vocab, grammar, "4", "-", "a", '"') == [True, True, False, False]
    written(vocab, grammar, ["4"])
    assert may_follow(vocab, grammar, "}", ",", "2") == [True, True, True]  # "note" may come, or not
    grammar.close()


def test_tools_whose_schemas_make_no_grammar_leave_the_call_unconstrained() -> None:
    remote = {
        "type": "function",
        "function": {"name": "fetch", "parameters": {"$ref": "https://example.com/schema.json"}},
    }
    assert grammar_for([remote]) is None
    assert grammar_for(TOOLS) == grammar_for(json.loads(json.dumps(TOOLS)))


def test_a_reply_that_opens_with_the_calls_json_is_that_call_and_then_ends(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS, Opening.BARE)
    assert may_follow(vocab, grammar, '{"', "{", "\n", OPEN_TAG, "H") == [True, True, False, False, False]
    call = ["{", "\n", " ", " ", '"', "name", '":', ' "', *"end_call", '",', "\n", " ", '"', "arguments"]
    call += ['":', " {", "}", "\n", "}"]
    whole = written(vocab, grammar, call)
    assert whole[-1] and not any(whole[:-1])
    assert may_follow(vocab, grammar, END, "\n", "S") == [True, True, False]  # nothing said after it
    grammar.close()


def test_a_reply_that_opens_a_fenced_block_holds_a_call_there(vocab: ToyVocab) -> None:
    grammar = vocab.grammar(TOOLS, Opening.FENCED)
    assert may_follow(vocab, grammar, "`", " ", "{", "H") == [True, True, False, False]
    call = [*"```json\n", '{"', "name", '":', ' "', *"end_call", '",', ' "', "arguments", '":', " {", "}}"]
    assert not any(written(vocab, grammar, [*call, "\n", "`", "`"]))
    assert written(vocab, grammar, ["`"]) == [True]
    grammar.close()


def test_the_tokens_that_open_a_reply_with_a_call_are_told_apart() -> None:
    vocab = {"{": 1, '{"': 2, "Ġ{": 3, "```": 4, "Ġ```Ċ": 5, "Hello": 6, "Ġ}": 7, "<tool_call>": 8}
    assert reply_openings(vocab) == {
        1: Opening.BARE,
        2: Opening.BARE,
        3: Opening.BARE,
        4: Opening.FENCED,
        5: Opening.FENCED,
    }
