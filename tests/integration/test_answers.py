"""The default LLM answers plain everyday and factual questions right (the set of `parley bench answers`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from parley.agent.agentfile import load_agent_file
from parley.agent.manners import prompt_start
from parley.agent.opening import default_opening, opening_of
from parley.bench.answer_sets import QUESTIONS, Question
from parley.bench.answers import spoken_reply
from parley.bench.verdicts import is_right, shapes
from parley.config import Settings
from parley.engines.llm import LlmEngine
from parley.engines.llm_llamacpp import LlamaCppLlm
from parley.engines.llm_loading import load_llm
from parley.pipeline.history import Conversation
from parley.pipeline.reply_guard import guarded_stream
from parley.pipeline.segmenter import split_sentences
from tests.unit.test_llm_llamacpp import kept_and_read

# Measured on 2 cores: Qwen2.5-0.5B (the default) 16/21, SmolLM2-135M 8/21; greedy, so it does not vary.
RIGHT_AT_LEAST = 14


@pytest.fixture(scope="module")
def llm() -> LlmEngine:
    return load_llm(Settings(), opening=default_opening(Settings()))


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


BOOK = next(q for q in QUESTIONS if q.text == "Can you recommend a good book to read?")


def first_reply(llm: LlmEngine, settings: Settings, question: str) -> str:
    """What the LLM stage says to the first question of a call: the call's prompt (the phone manners, the
    agent's prompt, the greeting heard), the guard on its opening, its sentence limit."""
    conversation = Conversation(
        settings.system_prompt, settings.history_turns, manners=settings.phone_manners
    )
    conversation.commit_agent("greeting", settings.greeting, interrupted=False)
    conversation.set_user_text("t1", 0, question)
    text = "".join(str(d) for d in guarded_stream(llm, conversation.messages_for("t1"), lambda: False))
    return " ".join(split_sentences(text)[: settings.max_reply_sentences])


def test_the_book_question_of_the_readme_gets_a_book_not_a_refusal_or_condolences(llm: LlmEngine) -> None:
    # The README's first picture had "I'm sorry for your loss, but as a voice assistant, I don't have the
    # ability to recommend books."
    reply = first_reply(llm, Settings(), BOOK.text)
    assert is_right(BOOK, reply) and not shapes(reply), reply


def test_the_phone_manners_and_examples_are_read_once_at_load_not_by_each_call() -> None:
    settings = Settings(phone_manners=True)
    engine = load_llm(
        settings, opening=default_opening(settings)
    )  # reads the manners, examples, default prompt and greeting
    assert isinstance(engine, LlamaCppLlm)
    try:
        prefix = len(engine._chat.prompt_ids(prompt_start("", manners=True), reply=False))
        kept_before, read_before = kept_and_read()
        first_reply(engine, settings, "What is the capital of France?")
        kept, read = kept_and_read()
        assert kept - kept_before >= prefix > 150
        assert read - read_before < 30  # the question and the template's tokens around it
        # Another agent's prompt follows the examples: a call of it reads its prompt, not the examples.
        other = replace(settings, system_prompt="You are Maya at Kestrel Cycles, a bicycle shop.")
        kept_before, read_before = kept_and_read()
        first_reply(engine, other, "When are you open?")
        kept, read = kept_and_read()
        assert kept - kept_before >= prefix
        assert read - read_before < 60
    finally:
        engine.close()


def test_an_agent_files_prompt_and_tools_are_read_at_load_not_by_its_first_call() -> None:
    # Without it, the order desk's first call read its prompt and tools first: ~2 s on Qwen2.5-Coder-1.5B.
    agent = load_agent_file(Path(__file__).parents[2] / "examples" / "agents" / "orders.toml")
    opening = opening_of(agent, manners=False)
    assert opening.tools and {t["function"]["name"] for t in opening.tools} >= {"lookup_order", "end_call"}
    engine = load_llm(Settings(), opening=opening)
    assert isinstance(engine, LlamaCppLlm)
    try:
        prefix = len(engine._chat.prompt_ids(opening.messages, opening.tools, reply=False))
        kept_before, read_before = kept_and_read()
        question = [*opening.messages, {"role": "user", "content": "Where is my order? The number is 4712."}]
        replied = list(engine.stream(question, lambda: False, opening.tools))
        kept, read = kept_and_read()
        assert replied
        assert kept - kept_before >= prefix > 300  # the prompt and the tools' descriptions
        assert read - read_before < 40  # the question and the template's tokens around it
    finally:
        engine.close()
