"""How a local reply's next token is chosen from the model's scores.

Spoken words are sampled with penalties that keep them from looping or copying an earlier reply
(engines/repeats.py), greedily or at the temperature set. A reply offered tools may open a call (the
chat template's tag, or a first token that opens the call's JSON or a fence: engines/tool_grammar.py);
from there its tokens are held to the offered tools' grammar until the call is whole, so a call always
names a real tool with arguments its schema allows. A reply that must be JSON of a schema (a post-call
extraction) is held to that schema's grammar from its first token to its end. The decoding thread
(engines/llm_llamacpp.py) asks for each token; nothing here touches the model's memory or its batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from parley.engines.llamacpp_model import CONTEXT_PER_SEQUENCE
from parley.engines.llm import REPETITION_PENALTY, SAMPLING_TOPK
from parley.engines.repeats import penalise_copies
from parley.engines.tool_grammar import Opening, ToolCallGrammar, ToolGrammarError, reply_openings
from parley.engines.toolcalls import OPEN_TAG
from parley.log import event

log = logging.getLogger(__name__)

PENALTY_WINDOW = 64  # the reply's last tokens that the repetition penalty looks at
# A tool call opened near the end of a reply may go this many tokens past its limit, to close: the limit
# is for words spoken, and a call cut short is lost (the offered tools' calls take 20-40 tokens).
CALL_TOKENS = 96


class Reply(Protocol):
    """What the chooser reads of a reply, and the tool-call state it keeps on it."""

    prompt: list[int]
    said: list[int]  # its tokens so far
    earlier: list[list[int]]  # the conversation's earlier replies' tokens
    limit: int  # tokens to say at most: a call opened near it gets room to close
    tool_grammar: str | None  # what a call to the offered tools may be (None: no tools offered)
    call: ToolCallGrammar | None  # the tool call being written, held to that grammar
    called: bool  # it opened a tool call
    words_only: bool  # tools are in its prompt, but it may not call them: what would open a call is banned
    json_reply: bool  # the reply is the grammar's JSON from its first token (a post-call extraction)


class TokenChooser:
    """Picks each reply's next token: sampled words, or a tool call held to its grammar."""

    def __init__(
        self,
        lc: Any,
        vocab: Any,
        *,
        end_ids: frozenset[int] | set[int],
        sentence_end_ids: frozenset[int] | set[int],
        tag_ids: Mapping[int, str],
        token_texts: Mapping[str, int],
        temperature: float,
        seed: int | None = None,
    ) -> None:
        self._lc = lc
        self._vocab = vocab
        self._end_ids = sorted(end_ids)
        self._ends = frozenset(end_ids) | frozenset(sentence_end_ids)  # never a copy's penalty
        # The token that opens a tool call in this model's chat template (None: no tagged calls), and
        # those that open a reply that is a call written without it
        self._call_opening = next((i for i, tag in tag_ids.items() if tag == OPEN_TAG), None)
        self._reply_openings = reply_openings(token_texts)
        self.temperature = temperature
        self._rng = np.random.default_rng(seed)

    def next_token(self, reply: Reply, logits: np.ndarray) -> int:
        """The reply's next token; once it has opened a tool call, one that the call's grammar allows."""
        if reply.words_only:
            logits = self._without_openings(logits, first=not reply.said)
        if reply.call is None and reply.json_reply and not reply.said:
            self._open_call(reply, Opening.BARE)  # its first token too is picked under the grammar
        if reply.call is None:
            token = self._sample(logits, reply.said, reply.earlier)
            opening = self._opening(reply, token)
            if opening is None or not self._open_call(reply, opening):
                return token
            if opening is Opening.TAGGED:
                return token  # the tag is the model's; the grammar holds what follows it
            # The reply's first token opens the call: it too is picked under the grammar.
        call = reply.call
        assert call is not None
        try:
            token = self._sample(logits, reply.said, reply.earlier, call)
            # After a tagged call the model goes on (another call, or the end); a reply that is a call
            # is held to it until it ends.
            if call.accept(token) and call.opening is Opening.TAGGED:
                end_call(reply)
            return token
        except ToolGrammarError as exc:
            event(log, "tool_grammar_failed", logging.WARNING, error=str(exc))
            end_call(reply)
            return self._sample(logits, reply.said, reply.earlier)

    def _without_openings(self, logits: np.ndarray, *, first: bool) -> np.ndarray:
        banned = [self._call_opening] if self._call_opening is not None else []
        if first:
            banned += list(self._reply_openings)
        if not banned:
            return logits
        scores = logits.astype(np.float32, copy=True)
        scores[banned] = -np.inf
        return scores

    def _opening(self, reply: Reply, token: int) -> Opening | None:
        """How `token` opens a tool call, if it does (and the reply was offered tools)."""
        if reply.tool_grammar is None:
            return None
        if token == self._call_opening:
            return Opening.TAGGED
        return None if reply.said else self._reply_openings.get(token)

    def _open_call(self, reply: Reply, opening: Opening) -> bool:
        """Hold the call to the offered tools' grammar from `opening` on, with room to close."""
        assert reply.tool_grammar is not None
        try:
            reply.call = ToolCallGrammar(self._lc, self._vocab, reply.tool_grammar, self._end_ids, opening)
        except ToolGrammarError as exc:
            event(log, "tool_grammar_failed", logging.WARNING, error=str(exc))
            return False
        reply.called = True
        event(log, "llm_tool_call_held", logging.DEBUG, opening=opening.name.lower(), said=len(reply.said))
        room = CONTEXT_PER_SEQUENCE - len(reply.prompt)
        reply.limit = max(reply.limit, min(len(reply.said) + 1 + CALL_TOKENS, room))
        return True

    def _sample(
        self,
        logits: np.ndarray,
        said: list[int],
        earlier: list[list[int]],
        call: ToolCallGrammar | None = None,
    ) -> int:
        scores = logits.astype(np.float32, copy=True)
        if call is not None:
            # The penalties keep spoken words from looping, and the grammar bounds a call; its arguments
            # copy the caller's words and digits, which repeat ("445566"). (Measured: the same calls with
            # or without them, over `bench tools` and eight booking requests.)
            call.restrict(scores, first=1 if self.temperature <= 0 else SAMPLING_TOPK)
            return self._pick(scores)
        penalise_copies(scores, said, earlier, self._ends)  # not another turn's reply (engines/repeats.py)
        if said and REPETITION_PENALTY != 1.0:
            seen = np.unique(np.asarray(said[-PENALTY_WINDOW:], dtype=np.int64))
            values = scores[seen]
            scores[seen] = np.where(values > 0, values / REPETITION_PENALTY, values * REPETITION_PENALTY)
        return self._pick(scores)

    def _pick(self, scores: np.ndarray) -> int:
        if self.temperature <= 0:
            return int(scores.argmax())
        top = np.argpartition(scores, -SAMPLING_TOPK)[-SAMPLING_TOPK:]
        weights = np.exp((scores[top] - scores[top].max()) / self.temperature)
        return int(self._rng.choice(top, p=weights / weights.sum()))


def end_call(reply: Reply) -> None:
    """The reply's tool call is whole, or abandoned: its grammar sampler is freed."""
    if reply.call is not None:
        reply.call.close()
        reply.call = None
