"""A reply that opens as a refusal, condolences out of nowhere or talk about itself is written again before
the caller hears a word of it; a real answer goes out as it is written, and a cancelled reply stays
cancelled."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from parley import metrics
from parley.agent.agentfile import Agent
from parley.call import Call
from parley.config import Settings
from parley.engines.endpoint import OpenAiLlm
from parley.engines.llm import Message
from parley.engines.toolcalls import ToolCall
from parley.pipeline.reply_guard import (
    MAX_WORDS_BEFORE_CALL,
    NUDGE,
    Asked,
    OpeningCheck,
    Reason,
    failure_shape,
    guarded_stream,
)
from tests.doubles import ScriptedLlm, ScriptedStt, loud, make_engines, quiet
from tests.openai_endpoint import ScriptedEndpoint
from tests.unit.test_call import RATE, Line

BOOK = "Can you recommend a good book to read?"
ANSWER = "Try To Kill a Mockingbird by Harper Lee."
CANNOT = "I don't have the ability to recommend books."


def words(text: str) -> list[str | ToolCall]:
    return [word + " " for word in text.split(" ")]


def ask(question: str) -> list[Message]:
    return [{"role": "system", "content": "You answer the phone."}, {"role": "user", "content": question}]


def regenerated(reason: Reason) -> float:
    return metrics.REPLIES_REGENERATED_TOTAL.labels(reason=reason)._value.get()  # prometheus_client's


def reply(llm: ScriptedLlm, question: str = BOOK, should_stop: Callable[[], bool] = lambda: False) -> str:
    fired: list[Reason] = []
    text = "".join(
        str(d) for d in guarded_stream(llm, ask(question), should_stop, on_regenerate=fired.append)
    )
    return text.strip()


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        ("I'm sorry, but I can't assist with that.", "refusal"),
        (f"I'm sorry for your loss, but as a voice assistant, {CANNOT}", "condolence"),
        ("As a voice assistant, I don't have personal preferences.", "non_answer"),
        ("I am unable to recommend books.", "refusal"),
        ("As Parley, I don't have personal experiences or emotions.", "refusal"),
    ],
)
def test_a_reply_of_a_failure_shape_is_asked_again_and_only_the_second_is_given(
    first: str, reason: Reason
) -> None:
    llm = ScriptedLlm(token_s=0.0, script=[words(first), words(ANSWER)])
    before = regenerated(reason)
    assert reply(llm) == ANSWER
    assert regenerated(reason) == before + 1
    assert len(llm.prompts) == 2
    assert llm.prompts[1] == [*llm.prompts[0], {"role": "system", "content": NUDGE}]


def test_the_second_reply_is_given_whatever_it_is() -> None:
    refusal = "I'm sorry, but I can't assist with that."
    llm = ScriptedLlm(token_s=0.0, script=[words(refusal)])  # the same refusal again
    assert reply(llm) == refusal
    assert len(llm.prompts) == 2


@pytest.mark.parametrize(
    "answer",
    [
        ANSWER,
        "The capital of France is Paris.",
        "I'd recommend Pride and Prejudice.",
        "I'm sorry, we're closed on Sundays.",  # an apology that answers
        "Sorry, I didn't catch that. Could you say it again?",
        "I can recommend The Hobbit.",
        "As soon as you like.",
    ],
)
def test_a_real_answer_is_given_as_written_and_the_model_asked_once(answer: str) -> None:
    llm = ScriptedLlm(token_s=0.0, reply=answer)
    assert reply(llm) == answer
    assert len(llm.prompts) == 1


@pytest.mark.parametrize(
    ("caller", "answer"),
    [
        ("My dog died yesterday.", "I'm so sorry for your loss. Losing a dog is hard."),
        ("Am I talking to a real person?", "I'm an AI assistant, but I can help with most things."),
    ],
)
def test_a_shape_the_caller_asked_for_is_kept(caller: str, answer: str) -> None:
    llm = ScriptedLlm(token_s=0.0, reply=answer)
    assert reply(llm, caller) == answer
    assert len(llm.prompts) == 1


def test_a_reply_that_opens_otherwise_is_given_word_by_word_before_the_model_has_finished() -> None:
    produced: list[str] = []

    class Recording(ScriptedLlm):
        def stream(self, *args: Any, **kwargs: Any) -> Iterator[str | ToolCall]:
            for delta in super().stream(*args, **kwargs):
                produced.append(str(delta))
                yield delta

    llm = Recording(token_s=0.0, reply="Paris is the capital of France.")
    seen_when_given = [len(produced) for _ in guarded_stream(llm, ask("Capital of France?"), lambda: False)]
    assert seen_when_given == [1, 2, 3, 4, 5, 6]


def test_an_opening_is_held_only_while_it_could_still_become_a_failure_shape() -> None:
    check = OpeningCheck()
    assert [check.push(d) for d in ("I", "'m", " sorry", ",", " but", " I", " can", "'t", " do that. ")] == [
        "hold", "hold", "hold", "hold", "hold", "hold", "hold", "hold", "refusal",
    ]  # fmt: skip
    check = OpeningCheck()
    assert [check.push(d) for d in ("I", "'d", " say")] == ["hold", "speak", "speak"]
    assert OpeningCheck().push("Sure") == "speak"


def test_the_shapes_are_told_apart() -> None:
    assert failure_shape("As an AI language model, I have no favourite colour.") == "non_answer"
    assert failure_shape("I don't have personal preferences.") == "refusal"
    assert failure_shape("Sorry, I can't tell you a story right now.") == "refusal"
    assert failure_shape("My condolences.") == "condolence"
    assert failure_shape("My condolences.", Asked("My grandmother passed away.")) is None
    assert failure_shape("Sorry, we're fully booked on Friday.") is None


@pytest.mark.parametrize(
    "true_limit",
    [
        "As an AI language model, I don't have real-time weather data.",  # asked again, it made one up
        "I'm sorry, but I can't book a table for you.",
        "I'm sorry, but I can't give out the owner's personal number.",
    ],
)
def test_a_refusal_that_names_what_the_agent_truly_cannot_do_is_kept(true_limit: str) -> None:
    assert failure_shape(true_limit) is None


def test_a_reply_cancelled_while_its_opening_is_held_is_not_asked_again() -> None:
    asked = 0

    def cancelled_after_three_words() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3

    llm = ScriptedLlm(token_s=0.0, script=[words("I'm sorry, but I can't help."), words(ANSWER)])
    assert list(guarded_stream(llm, ask(BOOK), cancelled_after_three_words)) == []
    assert len(llm.prompts) == 1


def test_a_tool_call_in_the_opening_goes_out_with_the_words_before_it() -> None:
    call = ToolCall("c1", "lookup_order", {"number": "42"})
    llm = ScriptedLlm(token_s=0.0, script=[["I ", call], words("It has shipped.")])
    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {}}}]
    given = list(guarded_stream(llm, ask("Where is order 42?"), lambda: False, tools))
    assert given == ["I ", call] and len(llm.prompts) == 1


def test_in_a_call_the_caller_hears_only_the_reply_written_again() -> None:
    llm = ScriptedLlm(
        token_s=0.01,
        script=[words("I'm sorry for your loss, but as a voice assistant, I can't recommend books."),
                words(ANSWER)],
    )  # fmt: skip
    stt = ScriptedStt(text_for=lambda seconds: BOOK if seconds > 0.25 else "")
    config = Settings(greeting="", end_of_turn_ms=300, reopen_grace_ms=300)
    agent = Agent(name="default", system_prompt="You answer the phone.", greeting="")
    call = Call("c-guard", "test", config, make_engines(llm=llm, stt=stt), RATE, agent)
    line = Line(call)
    call.start()
    line.start()
    try:
        line.say(np.concatenate([loud(600), quiet(500)]))
        line.wait(lambda: line.event("agent_done") is not None)
        done = line.event("agent_done")
        assert done is not None and done["text"] == ANSWER
        assert call.details()["transcript"][0]["agent"] == ANSWER
    finally:
        line.stop()
        call.end("test_over")
        assert call.join(5.0)


@pytest.mark.parametrize(
    ("rule", "question"),
    [
        ("Never give out the personal details of the staff or the owner.", "Can I have the owner's number?"),
        ("Refunds are given only in the shop: we do not give refunds by phone.", "Can I get a refund now?"),
    ],
)
def test_a_refusal_of_what_the_agent_file_forbids_is_kept(rule: str, question: str) -> None:
    refusal = "I'm sorry, but I can't help with that."
    messages: list[Message] = [
        {"role": "system", "content": f"You are Maya at Kestrel Cycles. {rule}"},
        {"role": "user", "content": question},
    ]
    llm = ScriptedLlm(token_s=0.0, reply=refusal)
    assert "".join(map(str, guarded_stream(llm, messages, lambda: False))).strip() == refusal
    assert len(llm.prompts) == 1
    assert failure_shape(refusal, Asked("Can you recommend a book?", (rule,))) == "refusal"


ORDER_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "lookup_order", "parameters": {}}},
    {"type": "function", "function": {"name": "transfer", "parameters": {"enum": ["+15557654321"]}}},
]


def call_of(name: str, arguments: str) -> ToolCall:
    return ToolCall("c1", name, arguments)


def test_a_tool_call_with_a_number_nobody_said_is_asked_for_again_as_words() -> None:
    # Qwen2.5-Coder called lookup_order with "12345" for "Hello, how are you today?"
    made_up = call_of("lookup_order", '{"number": "12345"}')
    llm = ScriptedLlm(token_s=0.0, script=[[made_up], words("What is your order number?")])
    before = regenerated("invented_number")
    given = list(guarded_stream(llm, ask("Where is my order?"), lambda: False, ORDER_TOOLS))
    assert "".join(str(d) for d in given).strip() == "What is your order number?"
    assert regenerated("invented_number") == before + 1
    assert llm.prompts[1] == [*llm.prompts[0], {"role": "system", "content": NUDGE}]
    # Asked again, the same made-up call would come back: the second reply is words only.
    assert llm.calls_allowed == [True, False] and llm.offered[1] == ["lookup_order", "transfer"]


@pytest.mark.parametrize(
    ("caller", "arguments"),
    [
        ("Can you check on my order, the number is 778899?", '{"number": "778899"}'),
        ("My order is seven seven eight, double nine.", '{"number": "77899"}'),
        ("It's order 77 88 99.", '{"number": "778899"}'),
        ("Call me back on 555-1234.", '{"phone": "5551234"}'),
        ("Put me through to a person.", '{"destination": "+15557654321"}'),  # the tool's own enum
        ("A table for 2 at 7 pm.", '{"people": 2, "time": "19:00"}'),  # short numbers are not checked
    ],
)
def test_a_tool_call_with_the_callers_own_numbers_goes_out_at_once(caller: str, arguments: str) -> None:
    call = call_of("lookup_order", arguments)
    llm = ScriptedLlm(token_s=0.0, script=[[call]])
    assert list(guarded_stream(llm, ask(caller), lambda: False, ORDER_TOOLS)) == [call]
    assert len(llm.prompts) == 1


LOOKUPS = ("lookup_order",)
LOOKED_UP = call_of("lookup_order", '{"number": "4712"}')


def after_lookup(question: str) -> list[Message]:
    """The conversation once `question`'s number was looked up, its result read back to the model."""
    tool_call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": '{"number": "4712"}'},
    }
    return [
        *ask(question),
        {"role": "assistant", "content": "", "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped", "eta": "Monday"}'},
    ]


@pytest.mark.parametrize(
    "caller",
    [
        "Where is my order? The number is 4712.",
        "Where is my order? The number is four seven one two.",
        "Where is my order? The number is 47. 1,2,",  # Whisper's writing of a pause in the number
    ],
)
@pytest.mark.parametrize(
    "words_instead",
    ["Sure, I'll look up your order.", "Order 4712 is in transit.", "I'm sorry, but I can't find it."],
)
def test_a_callers_number_nobody_looked_up_is_looked_up_instead_of_talked_about(
    caller: str, words_instead: str
) -> None:
    # Qwen2.5-Coder-1.5B said "Sure, I'll look up your order." and stopped, or gave a status it had not
    # looked up; made to call, it called the right tool with the number in figures.
    llm = ScriptedLlm(token_s=0.0, script=[words(words_instead + " It is on its way."), [LOOKED_UP]])
    before = regenerated("not_looked_up")
    given = list(guarded_stream(llm, ask(caller), lambda: False, ORDER_TOOLS, lookups=LOOKUPS))
    assert given == [LOOKED_UP]  # the caller hears none of the first reply's words
    assert regenerated("not_looked_up") == before + 1
    assert llm.calls_allowed == [True, LOOKUPS]  # asked again, it must call a lookup
    assert llm.prompts[1] == [
        *llm.prompts[0],
        {"role": "system", "content": "The caller's number, in figures: 4712."},
    ]


def test_the_answer_after_the_lookup_goes_out_as_written() -> None:
    answer = "Your order has shipped and arrives on Monday."
    llm = ScriptedLlm(token_s=0.0, script=[words(answer)])
    question = "Where is my order? The number is 4712."
    given = guarded_stream(llm, after_lookup(question), lambda: False, ORDER_TOOLS, lookups=LOOKUPS)
    assert "".join(str(d) for d in given).strip() == answer
    assert len(llm.prompts) == 1


@pytest.mark.parametrize(
    ("caller", "lookups"),
    [
        ("Where is my order? The number is 4712.", ()),  # no tool that only looks things up
        ("Where is my order?", LOOKUPS),  # no number yet
        ("A table for 2 at 7 pm.", LOOKUPS),  # numbers too short to be one to look up
    ],
)
def test_words_go_out_as_written_where_no_lookup_is_due(caller: str, lookups: tuple[str, ...]) -> None:
    answer = "Sure, what is the number?"
    llm = ScriptedLlm(token_s=0.0, script=[words(answer)])
    given = guarded_stream(llm, ask(caller), lambda: False, ORDER_TOOLS, lookups=lookups)
    assert "".join(str(d) for d in given).strip() == answer
    assert len(llm.prompts) == 1


def test_a_call_the_model_makes_itself_goes_out_where_a_lookup_is_due() -> None:
    # "Please cancel my order 445566.": its own choice of tool, side effects and all, is the model's.
    cancel = call_of("transfer", '{"destination": "+15557654321"}')
    llm = ScriptedLlm(token_s=0.0, script=[[cancel]])
    caller = "Order 445566 is wrong, put me through to someone."
    assert list(guarded_stream(llm, ask(caller), lambda: False, ORDER_TOOLS, lookups=LOOKUPS)) == [cancel]
    assert len(llm.prompts) == 1


def test_a_call_the_conversation_already_holds_is_asked_for_again_as_words() -> None:
    # Qwen2.5-0.5B asked for the order it had just been told about, until the rounds ran out.
    answer = "Your order has shipped and arrives on Monday."
    llm = ScriptedLlm(token_s=0.0, script=[[LOOKED_UP], words(answer)])
    before = regenerated("repeated_call")
    question = "Where is my order? The number is 4712."
    given = guarded_stream(llm, after_lookup(question), lambda: False, ORDER_TOOLS, lookups=LOOKUPS)
    assert "".join(str(d) for d in given).strip() == answer
    assert regenerated("repeated_call") == before + 1
    assert llm.calls_allowed == [True, False]


def test_a_reply_that_ends_with_words_and_no_lookup_is_asked_again_as_one() -> None:
    llm = ScriptedLlm(token_s=0.0, script=[words("Sure, I'll look up your order."), [LOOKED_UP]])
    question = ask("Where is my order? The number is 4712.")
    assert list(guarded_stream(llm, question, lambda: False, ORDER_TOOLS, lookups=LOOKUPS)) == [LOOKED_UP]
    assert llm.calls_allowed == [True, LOOKUPS]


def test_words_before_the_lookup_go_out_with_it() -> None:
    # The models behind endpoints say "Let me check." and then call (tests/openai_endpoint.py does too).
    llm = ScriptedLlm(token_s=0.0, script=[[*words("Let me check."), LOOKED_UP]])
    question = ask("Where is my order? The number is 4712.")
    given = list(guarded_stream(llm, question, lambda: False, ORDER_TOOLS, lookups=LOOKUPS))
    assert "".join(str(d) for d in given if not isinstance(d, ToolCall)).strip() == "Let me check."
    assert given[-1] == LOOKED_UP and len(llm.prompts) == 1


class _Counted(list[str | ToolCall]):
    """A scripted model turn that counts the items the guard read of it."""

    read = 0

    def __iter__(self) -> Iterator[str | ToolCall]:
        for item in super().__iter__():
            self.read += 1
            yield item


def test_a_long_answer_that_nothing_looked_up_is_stopped_after_an_acknowledgements_length() -> None:
    # Qwen2.5-Coder-1.5B wrote a status of ~3 s on 2 cores before its sentence ended: the caller waited
    # all of it for the lookup that came after.
    made_up = _Counted(words(
        "Your order number 4712 has been shipped from our warehouse yesterday afternoon and it should "
        "be arriving at your address by next Monday at the latest."
    ))  # fmt: skip
    llm = ScriptedLlm(token_s=0.0, script=[made_up, [LOOKED_UP]])
    question = ask("Where is my order? The number is 4712.")
    assert list(guarded_stream(llm, question, lambda: False, ORDER_TOOLS, lookups=LOOKUPS)) == [LOOKED_UP]
    assert made_up.read == MAX_WORDS_BEFORE_CALL + 1
    assert llm.calls_allowed == [True, LOOKUPS]


def test_a_lookup_of_a_piece_of_the_callers_number_is_asked_again_with_all_of_it() -> None:
    # Whisper wrote a pause inside "four seven ... one two" as "47. 1,2.", and Qwen2.5-Coder-1.5B looked
    # up order 47.
    llm = ScriptedLlm(token_s=0.0, script=[[call_of("lookup_order", '{"number": "47"}')], [LOOKED_UP]])
    question = ask("Where's my order? The number is 47. 1,2.")
    before = regenerated("not_looked_up")
    assert list(guarded_stream(llm, question, lambda: False, ORDER_TOOLS, lookups=LOOKUPS)) == [LOOKED_UP]
    assert regenerated("not_looked_up") == before + 1
    assert llm.prompts[1][-1] == {"role": "system", "content": "The caller's number, in figures: 4712."}


def test_a_lookup_with_the_whole_number_and_a_small_one_beside_it_goes_out() -> None:
    both = call_of("lookup_order", '{"number": "4712", "line": "4"}')
    llm = ScriptedLlm(token_s=0.0, script=[[both]])
    question = ask("Where is my order? The number is 4712.")
    assert list(guarded_stream(llm, question, lambda: False, ORDER_TOOLS, lookups=LOOKUPS)) == [both]


def test_behind_an_endpoint_a_number_heard_without_the_word_order_is_looked_up() -> None:
    # Whisper heard "order" as "other": the endpoint's model answered without a call, and the guard asked
    # again with tool_choice naming the lookup (tests/openai_endpoint.py heeds it, as a server must).
    with ScriptedEndpoint() as endpoint:
        llm = OpenAiLlm(endpoint.url)
        question = ask("Hi, where is my other? The number is 4712.")
        given = list(guarded_stream(llm, question, lambda: False, ORDER_TOOLS, lookups=LOOKUPS))
        assert endpoint.requests[1]["tool_choice"] == {
            "type": "function",
            "function": {"name": "lookup_order"},
        }
    calls = [d for d in given if isinstance(d, ToolCall)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup_order", {"number": "4712"})]
    assert not [d for d in given if not isinstance(d, ToolCall)]  # the first reply's words are not heard
