"""Keeps a reply from copying an earlier one: a penalty on the token that would extend a copied run.

A small model decoding greedily falls into saying the same reply every turn: once two of its replies
in the history begin alike, the likeliest next reply is that one again ("I'm sorry, but I don't have
enough information to ..." to nine different questions in a row over SIP, 2026-12-02). The repetition
penalty looks only inside the reply being written. This looks at the conversation's earlier replies, in
the way of the "DRY" sampler: when the reply's last tokens are the same run as somewhere in an earlier
reply, the token that came next there is penalised, more the longer the run, so that a reply may start
as another did ("The capital of ...") but does not go on copying it. Words the caller said are not
looked at: an answer repeats the question's words by right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import numpy as np

ALLOWED_RUN = 2  # tokens of an earlier reply a reply may repeat freely ("I'm", "The capital")
BASE = 1.75  # each token more of the same run multiplies the penalty by this
# The penalty (in logits) on the token that makes the run ALLOWED_RUN + 1 long. DRY's usual 0.8 did not
# hold Qwen2.5-0.5B: after a garbled first question it introduced itself, then answered each of nine
# questions with "I'm Parley, a voice assistant. How can I ... you today?", dodging the penalty with
# "voiceassistant", "voice-Assistant" (SIP, 2026-12-03); at 3.0 it answered from the fourth turn on.
MULTIPLIER = 3.0
# The penalty on a reply's first token where two or more earlier replies began with it. A run penalty
# cannot reach an opening: "As a" is free, and the copy then goes on in new words. After a garbled first
# question (SIP, 2026-12-06) Qwen2.5-0.5B answered "As a voice assistant, I don't have personal
# experiences"; then 8 of the next 9 replies began "As a voice assistant" and most refused ("... I am
# not able to provide information about the capital city of Japan"). With this, the second reply still
# began so, and the 8 after it answered ("The capital city of Japan is Tokyo."). Not after one reply:
# kept from "I'm" where only an introduction had opened with it, the model wrote "As a Parley voice
# assistant" instead. Light: "The" may open reply after reply where it is by far the likeliest word.
OPENING_PENALTY = 1.5
LONGEST_RUN = 24  # beyond this, the penalty stops growing (it is far past any logit margin by then)


def copy_penalties(
    said: Sequence[int], earlier: Sequence[Sequence[int]], free: AbstractSet[int] = frozenset()
) -> dict[int, float]:
    """For each token that would extend a run of `said`'s last tokens found in an earlier reply by one,
    the penalty to subtract from its logit (the longest run's). Empty while nothing is being copied.
    Tokens in `free` (a sentence's or the reply's end) are never penalised: ending a sentence where an
    earlier reply ended one copies nothing more ("A dog has four legs." after "A spider has four legs.";
    penalised, the full stop gave way to ", but it is not a mammal.").
    Before the first token, a token that opened two or more earlier replies gets `OPENING_PENALTY`."""
    if not said:
        opened = Counter(reply[0] for reply in earlier if reply and reply[0] not in free)
        return {token: OPENING_PENALTY for token, n in opened.items() if n >= 2}
    if len(said) < ALLOWED_RUN:
        return {}
    last = said[-1]
    penalties: dict[int, float] = {}
    for reply in earlier:
        for at in range(1, len(reply)):
            if reply[at - 1] != last:
                continue
            run = 1
            while run < min(at, len(said), LONGEST_RUN) and reply[at - 1 - run] == said[-1 - run]:
                run += 1
            if run >= ALLOWED_RUN:
                penalty = MULTIPLIER * BASE ** (run - ALLOWED_RUN)
                token = reply[at]
                if token not in free and penalty > penalties.get(token, 0.0):
                    penalties[token] = penalty
    return penalties


def penalise_copies(
    scores: np.ndarray,
    said: Sequence[int],
    earlier: Sequence[Sequence[int]],
    free: AbstractSet[int] = frozenset(),
) -> None:
    """Lower, in place, the logits of the tokens that would go on copying an earlier reply."""
    for token, penalty in copy_penalties(said, earlier, free).items():
        if 0 <= token < scores.shape[0]:
            scores[token] -= penalty
