"""A reply does not go on copying an earlier reply of the conversation (engines/repeats.py)."""

from __future__ import annotations

import numpy as np
import pytest

from parley.engines.repeats import (
    ALLOWED_RUN,
    BASE,
    MULTIPLIER,
    OPENING_PENALTY,
    copy_penalties,
    penalise_copies,
)

SORRY = [40, 2776, 14589, 11, 714, 358, 1513, 944, 614]  # "I'm sorry, but I don't have ..."


def test_nothing_is_penalised_until_a_run_of_an_earlier_reply_is_being_copied() -> None:
    assert copy_penalties([], []) == {}
    assert copy_penalties([40], [SORRY]) == {}  # one token of it: free
    assert copy_penalties([7, 8], [SORRY]) == {}  # not in any earlier reply


def test_a_reply_is_kept_lightly_from_opening_as_two_earlier_replies_did() -> None:
    as_a_voice_assistant = [2121, 264, 7743, 17847, 11]  # "As a voice assistant,"
    as_a_friend = [2121, 264, 4238]  # "As a friend"
    the_capital = [785, 6722, 315]  # "The capital of"
    assert copy_penalties([], [as_a_voice_assistant, the_capital, []]) == {}  # one each: free
    assert copy_penalties([], [as_a_voice_assistant, the_capital, as_a_friend]) == {
        2121: pytest.approx(OPENING_PENALTY)
    }
    full_stop = 13
    assert copy_penalties([], [[full_stop], [full_stop]], free={full_stop}) == {}


def test_the_token_that_extends_a_copied_run_is_penalised_more_the_longer_the_run() -> None:
    two = copy_penalties(SORRY[:2], [SORRY])
    assert two == {SORRY[2]: pytest.approx(MULTIPLIER)}
    five = copy_penalties(SORRY[:5], [SORRY])
    assert five == {SORRY[5]: pytest.approx(MULTIPLIER * BASE ** (5 - ALLOWED_RUN))}
    # A run found in the middle of a reply counts as well, and the longest run sets the penalty.
    middle = copy_penalties([99, *SORRY[3:6]], [[1, 2], SORRY])
    assert middle == {SORRY[6]: pytest.approx(MULTIPLIER * BASE)}


def test_only_the_copying_token_is_lowered_so_a_reply_may_start_alike_and_say_something_else() -> None:
    scores = np.zeros(20000, dtype=np.float32)
    scores[SORRY[4]] = 5.0
    scores[123] = 4.9
    penalise_copies(scores, SORRY[:4], [SORRY])
    assert int(scores.argmax()) == 123  # "but" would copy four tokens on: another word wins
    assert scores[SORRY[4]] == pytest.approx(5.0 - MULTIPLIER * BASE**2)
    assert np.count_nonzero(scores) == 2


def test_a_sentence_or_reply_may_end_where_an_earlier_reply_ended() -> None:
    full_stop = 13
    spider = [32, 34354, 702, 3040, 14201, full_stop]  # "A spider has four legs."
    dog = [32, 5562, 702, 3040, 14201]  # "A dog has four legs"
    assert copy_penalties(dog, [spider]) == {full_stop: pytest.approx(MULTIPLIER * BASE)}
    assert copy_penalties(dog, [spider], free={full_stop}) == {}
