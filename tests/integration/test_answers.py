"""The default LLM answers plain everyday and factual questions right (the set of `parley bench answers`)."""

from __future__ import annotations

import pytest

from parley.bench.answers import QUESTIONS, Question, is_right, spoken_reply
from parley.config import Settings
from parley.engines.llm import LlmEngine, load_llm

# Measured on 2 cores: Qwen2.5-0.5B (the default) 16/21, SmolLM2-135M 8/21; greedy, so it does not vary.
RIGHT_AT_LEAST = 14


@pytest.fixture(scope="module")
def llm() -> LlmEngine:
    return load_llm(Settings())


def test_the_default_model_answers_most_plain_questions_right(llm: LlmEngine) -> None:
    settings = Settings()
    answers = {q.text: spoken_reply(llm, settings, q.text)[0] for q in QUESTIONS}
    wrong = {q.text: answers[q.text] for q in QUESTIONS if not is_right(q, answers[q.text])}
    assert len(QUESTIONS) - len(wrong) >= RIGHT_AT_LEAST, wrong


PARIS = Question("What is the capital of France?", (("paris",),))
LEGS = Question("How many legs does a spider have?", (("eight", "8"),))
SLEEP = Question("What is a good way to fall asleep faster?", (("breath*", "dark"),))


@pytest.mark.parametrize(
    ("question", "answer", "right"),
    [
        (PARIS, "The capital of France is Paris.", True),
        (PARIS, "It is Lyon, near Parisian suburbs.", False),
        (LEGS, "A spider has 8 legs.", True),
        (LEGS, "Spiders have many legs, 18 in fact.", False),
        (SLEEP, "Try deep breathing before bed.", True),
    ],
)
def test_an_answer_is_right_when_it_has_the_expected_words(
    question: Question, answer: str, right: bool
) -> None:
    assert is_right(question, answer) is right
