"""`parley bench answers` judges each reply as a caller would: right, wrong, or the way it failed (a
refusal, a non-answer about itself, condolences out of nowhere), and asks the questions as a call would."""

from __future__ import annotations

import argparse

import pytest

from parley.bench import add_bench_parser
from parley.bench.answer_sets import EVERYDAY, QUESTIONS, SETS, Question
from parley.bench.answers import agent_of, judged, spoken_reply, summarise
from parley.bench.verdicts import same_words, shapes, verdict
from parley.config import Settings
from tests.doubles import ScriptedLlm

BOOK = next(q for q in QUESTIONS if q.text == "Can you recommend a good book to read?")
PARIS = next(q for q in QUESTIONS if q.text == "What is the capital of France?")
EVERYDAY_BY_TEXT = {q.text: q for q in EVERYDAY}
REFUND = EVERYDAY_BY_TEXT["Can I get a refund right now?"]
SPELL = EVERYDAY_BY_TEXT["Can you spell your company's name?"]
CALL_BACK = EVERYDAY_BY_TEXT["What number can I call back on?"]
SATURDAY = EVERYDAY_BY_TEXT["When are you open on Saturday?"]

# The reply in the README's own picture of a call.
PICTURE = "I'm sorry for your loss, but as a voice assistant, I don't have the ability to recommend books."


@pytest.mark.parametrize(
    ("question", "reply", "expected"),
    [
        (PARIS, "The capital of France is Paris.", "right"),
        (PARIS, "The capital of France is Lyon.", "wrong"),
        (PARIS, "I'm sorry, but I can't help with that.", "refusal"),
        (PARIS, "As an AI, I do not have opinions on capitals.", "refusal"),
        (BOOK, "I’m unable to browse a library for you.", "refusal"),  # a curly apostrophe
        (BOOK, "As a voice assistant, I am here to help you with many things.", "non-answer"),
        (BOOK, "I'm just a virtual assistant on the phone, happy to chat.", "non-answer"),
        (BOOK, "I'm so sorry for your loss. Take all the time you need.", "condolence"),
        (BOOK, PICTURE, "condolence"),
        (BOOK, "You might enjoy To Kill a Mockingbird by Harper Lee.", "right"),
    ],
)
def test_each_reply_gets_the_verdict_a_caller_would_give_it(
    question: Question, reply: str, expected: str
) -> None:
    assert verdict(question, reply) == expected


def test_the_pictures_reply_shows_all_three_failure_shapes() -> None:
    assert shapes(PICTURE) == ["condolence", "refusal", "non-answer"]


def test_a_right_answer_is_right_even_after_a_failure_shape_and_the_shape_is_kept() -> None:
    reply = "As an AI I can't browse the web, but the capital of France is Paris."
    assert verdict(PARIS, reply) == "right"
    assert shapes(reply) == ["refusal"]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("I'm sorry, we don't give refunds over the phone; please bring the receipt to the shop.", "right"),
        ("Sorry, I can't do that.", "refusal"),  # a refusal without the reason the caller needs
        ("Sure, I have refunded your purchase.", "wrong"),
    ],
)
def test_a_polite_refusal_with_its_reason_is_the_right_answer_where_the_agent_must_refuse(
    reply: str, expected: str
) -> None:
    assert verdict(REFUND, reply) == expected


@pytest.mark.parametrize(
    ("reply", "right"),
    [
        ("Sure, it's spelled K-E-S-T-R-E-L.", True),
        ("That's K, E, S, T, R, E, L: Kestrel Cycles.", True),
        ("It's k.e.s.t.r.e.l, then Cycles.", True),
        ("It's Kestrel Cycles.", False),
        ("It's spelled K-E-S-T-E-R-L.", False),
    ],
)
def test_a_name_is_right_only_when_spelled_out_letter_by_letter(reply: str, right: bool) -> None:
    assert (verdict(SPELL, reply) == "right") is right


@pytest.mark.parametrize(
    ("reply", "right"),
    [
        ("You can call us back on 503 555 0198.", True),
        ("Our number is (503) 555-0198, from 9 to 5.", True),
        ("It's five oh three, five five five, oh one nine eight.", True),
        ("You can call 503 555 0189.", False),
        ("Call us back any time during opening hours.", False),
    ],
)
def test_a_number_is_right_only_when_read_back_digit_for_digit(reply: str, right: bool) -> None:
    assert (verdict(CALL_BACK, reply) == "right") is right


def test_hours_written_with_the_time_of_day_attached_are_read() -> None:
    assert verdict(SATURDAY, "On Saturdays we're open from 10am to 2pm.") == "right"
    assert verdict(SATURDAY, "On Saturdays we're open from 8:30 to 6.") == "wrong"


def test_the_factual_set_is_the_published_one_and_the_everyday_set_is_asked_of_the_front_desk() -> None:
    assert [s.name for s in SETS] == ["factual", "everyday"]
    assert len(QUESTIONS) == 21
    assert QUESTIONS[0].text == "What is the capital of France?"
    assert QUESTIONS[-1].text == "How can I keep my phone battery from running out so fast?"
    assert 8 <= len(EVERYDAY) <= 12
    settings = Settings()
    service_agent = agent_of(SETS[0], settings)
    assert (service_agent.system_prompt, service_agent.greeting) == (
        settings.system_prompt,
        settings.greeting,
    )
    front_desk = agent_of(SETS[1], settings)  # read as `parley serve --agent` reads it
    assert front_desk.name == "frontdesk"
    assert "K-E-S-T-R-E-L" in front_desk.system_prompt and "503 555 0198" in front_desk.system_prompt
    assert front_desk.greeting


def test_a_question_is_asked_as_the_first_turn_of_a_call_and_the_reply_cut_where_the_stage_cuts_it() -> None:
    settings = Settings(max_reply_sentences=2)
    llm = ScriptedLlm(reply="Paris is the capital. It is lovely. It has the Eiffel Tower.", token_s=0.0)
    front_desk = agent_of(SETS[1], settings)
    reply, first_piece_s = spoken_reply(llm, settings, "What is the capital of France?", agent=front_desk)
    assert reply == "Paris is the capital. It is lovely."
    assert first_piece_s is not None
    (prompt,) = llm.prompts
    assert prompt == [
        {"role": "system", "content": front_desk.system_prompt},
        {"role": "assistant", "content": front_desk.greeting},
        {"role": "user", "content": "What is the capital of France?"},
    ]


def test_the_summary_counts_each_verdict_per_set_and_the_json_lists_the_replies_of_each() -> None:
    rows = [
        judged("factual", PARIS, "Paris.", first_piece_s=0.1),
        judged("factual", BOOK, PICTURE, first_piece_s=0.2),
        judged("factual", PARIS, "As an AI I can't say, but it is Paris.", first_piece_s=0.1),
        judged("everyday", REFUND, "Sorry, I can't do that.", first_piece_s=0.3),
    ]
    results = summarise(rows, {"llm": "test"})
    summary = results["summary"]
    assert summary["right answers"] == "2/4"
    assert summary["factual (3)"] == {"right": 2, "wrong": 0, "refusal": 0, "non-answer": 0, "condolence": 1}
    assert summary["everyday (1)"] == {"right": 0, "wrong": 0, "refusal": 1, "non-answer": 0, "condolence": 0}
    assert summary["right, with a failure shape"] == 1
    assert results["by verdict"]["condolence"] == [
        {"set": "factual", "question": BOOK.text, "reply": PICTURE}
    ]
    assert results["by verdict"]["refusal"][0]["reply"] == "Sorry, I can't do that."


def test_spoken_rows_say_what_whisper_heard_and_count_questions_heard_word_for_word() -> None:
    rows = [
        judged("factual", PARIS, "Paris.", heard_as="What is the capital of France?", word_for_word=True),
        judged("factual", BOOK, "Dune.", heard_as="Can you recommend a Godbook?", word_for_word=False),
    ]
    results = summarise(rows, {"spoken": True})
    assert results["summary"]["questions heard word for word"] == "1/2"
    assert results["by verdict"]["right"][1]["heard_as"] == "Can you recommend a Godbook?"


def test_the_command_line_picks_sets_voices_and_calls() -> None:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    defaults = parser.parse_args(["bench", "answers"])
    assert (defaults.set, defaults.spoken, defaults.voice, defaults.calls) == (
        "both",
        False,
        "piper",
        "fresh",
    )
    chosen = parser.parse_args(
        ["bench", "answers", "--spoken", "--voice", "espeak", "--calls", "one", "--set", "everyday"]
    )
    assert (chosen.set, chosen.spoken, chosen.voice, chosen.calls) == ("everyday", True, "espeak", "one")


@pytest.mark.parametrize(
    ("heard", "same"),
    [
        ("What is 2 plus 2?", True),
        ("what is two plus two", True),
        ("What is two plus three?", False),
        ("What is two?", False),
    ],
)
def test_a_question_is_heard_word_for_word_whether_whisper_writes_its_numbers_in_figures_or_words(
    heard: str, same: bool
) -> None:
    assert same_words(heard, "What is two plus two?") is same
