"""A reply of a known failure shape is written once more before the caller hears any of it.

A small model answers some plain questions with a shape of its own instead of an answer: a refusal ("I'm
sorry, but I can't assist with that."), talk about itself ("As a voice assistant, I don't have ..."), or
condolences nobody asked for ("I'm sorry for your loss, ..."; the README's first picture had all three in
one sentence, to "Can you recommend a good book to read?"). Each opens its reply. So a reply whose opening
words could be one of them (`SUSPECT_OPENINGS`) is held until its first sentence is whole, and judged
then; one of the shapes is stopped and asked for again, with a nudge after the caller's words, and that
second reply is passed on as it comes. A reply that opens any other way is passed on as it is written: the
check reads only text the model has already given, so it adds nothing to the wait for a reply that is fine.

A shape the turn calls for is kept: condolences to a caller who tells of a loss, what the agent is to one
who asks, a refusal of what the agent's instructions forbid ("Never give out the personal details of the
staff"), and a limit that is true ("I don't have real-time weather data").

A tool call before any words is checked too: one whose arguments carry a number (three digits or more)
that nobody in the conversation said, nor its instructions or tools hold, was made up ("Hello, how are you
today?" called `lookup_order` with order "12345"; "Do you sell gift cards?" with "1234567890"): it is
asked for once more before the call runs, as words only (the same nudge; one that told it to ask for the
number, the 0.5B model read aloud). Numbers the caller spelled out in words ("seven seven eight, double
nine") count as said.

And the other way round: a caller who gives a number (three digits or more) that no tool has been given
yet, to an agent with tools that only look things up (`lookups`: side-effect free, with parameters), is
answered by one of those lookups. A reply may say a few words before its call ("Let me check.", as the
models behind endpoints do): its words are held, and go out with the call when it comes. One that ends,
begins a second sentence or runs past an acknowledgement's length with no call is stopped and asked
again as a call to one of the lookups, held to their grammar; so is a call that carries only a piece of
the number ("47" of "47. 1,2.", Whisper's writing of a pause inside it). The small models know which
tool and which argument when made to call (both packaged Qwen models: every order desk request tried),
but decide badly whether to: they say "Sure, I'll look up your order." and stop, or give an order's
status that nothing looked up ("Order 4712 is in transit."). A lookup a caller did not need costs a
second; only tools without side effects are ever called this way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from parley import metrics
from parley.engines.llm import LlmEngine, Message, Tools
from parley.engines.toolcalls import ToolCall
from parley.pipeline.segmenter import ends_sentence, split_sentences
from parley.text import digit_runs, normalise_words

Reason = Literal["refusal", "condolence", "non_answer", "invented_number", "repeated_call", "not_looked_up"]
Decision = Literal["hold", "speak"] | Reason

# The words a failure shape opens with (normalised). A reply is held only while its words so far are one
# of these or the start of one: "I" waits for its next word, "I'd recommend" goes on at once.
SUSPECT_OPENINGS = (
    "i'm sorry", "i am sorry", "sorry", "i'm so sorry", "i'm very sorry", "i'm really sorry",
    "i apologize", "i apologise", "unfortunately", "i'm afraid", "i am afraid", "my condolences",
    "my deepest", "my heart goes out", "as", "i'm an", "i am an", "i'm a",
    "i am a", "i'm just", "i am just", "i'm only", "i'm not", "i am not", "i can't", "i cannot",
    "i can not", "i'm unable", "i am unable", "i don't have", "i do not have", "i won't", "i will not",
)  # fmt: skip
# Held this long with no end to its first sentence, the opening is judged as it stands.
MAX_HELD_WORDS = 30
# While a lookup is due, words before a call longer than an acknowledgement ("Sure, let me look that up
# for you.") are an answer that nothing looked up: Qwen2.5-Coder-1.5B wrote one of ~3 s on 2 cores
# before the sentence ended, all of it a wait for a caller whose reply was to be a lookup.
MAX_WORDS_BEFORE_CALL = 12

_MACHINE = "(ai|language model|chatbot|bot|computer program)"
_NOT_ABLE = r"(can't|cannot|can not|unable to|not able to|won't be able to|will not be able to)"
CONDOLENCE = re.compile(
    r"\b(sorry (for|about) (your|the) loss|sorry to hear about your loss|condolences?"
    r"|(my|deepest|heartfelt) sympath(y|ies)|passed away|rest in peace|my heart goes out)\b"
)
NON_ANSWER = re.compile(
    rf"\b(as (a|an|your) ([a-z-]+ ){{0,2}}(assistant|{_MACHINE})|an ai|artificial intelligence"
    r"|language model)\b"
)
# A refusal that says nothing of what it refuses ("I can't assist with that request"), one of what any
# caller may ask for (a recommendation, a story), or a dodge about itself. One that names what it cannot
# do ("I can't book a table", "I can't give out the owner's number") may be true, and is kept.
REFUSAL = re.compile(
    rf"\b{_NOT_ABLE} (assist|help)( you)?( with)? (that|this|it|your|such)\b"
    rf"|\b{_NOT_ABLE} (answer|fulfil|fulfill|do|comply with) (that|this)\b"
    rf"|\b{_NOT_ABLE} (recommend|suggest|tell (you )?(a )?(story|stories|joke)|give (you )?advice)\b"
    r"|\bi (don't|do not) have (the ability|the capability|(any )?(personal )?(experiences|feelings|emotions"
    r"|preferences|opinions))\b"
    r"|\b(i'm|i am) not (capable|programmed)\b"
)
LOSS = re.compile(
    r"\b(die|died|dies|dying|dead|death|passed|passing|loss|lost|funeral|grief|grieving|bereave\w*|killed"
    r"|widow\w*|miscarriage|put down)\b"
)
ASKS_WHAT_IT_IS = re.compile(
    r"\b(ai|robot|bot|machine|computer|automated|recording|real|human|person|assistant|who are you"
    r"|what are you)\b"
)
# What a model honestly lacks: asked again, it made up a forecast for "What's the weather like in Paris
# today?" where it had said, as an AI language model, that it had no real-time weather data.
HONEST_LIMIT = re.compile(
    r"\b(real-time|real time|up-to-date|up to date|live|current|internet|browse|browsing)\b"
)
SHAPES: tuple[tuple[Reason, re.Pattern[str]], ...] = (
    ("condolence", CONDOLENCE),
    ("non_answer", NON_ANSWER),
    ("refusal", REFUSAL),
)
# An instruction that forbids something ("Never give out the personal details of the staff", "we do not
# give refunds over the phone"), and the words of it that a question must share to be one it forbids.
FORBIDS = re.compile(r"\b(never|not|no|only|don't|cannot|can't|mustn't)\b")
FUNCTION_WORDS = frozenset((
    "what", "when", "where", "which", "would", "could", "should", "there", "their", "them", "they", "this",
    "that", "these", "those", "with", "from", "have", "your", "yours", "about", "into", "just", "like",
    "please", "will", "does", "here", "than", "then", "were", "been", "being", "some", "many", "much",
    "very", "also", "okay",
))  # fmt: skip
# Asked again, a reply told to open with "Sure," answered where a nudge to answer without apologising
# (in several wordings) got the same refusal back from Qwen2.5-Coder-0.5B ("Tell me a story.", "Uh.").
NUDGE = 'Reply to the caller again, in one or two short sentences, beginning with "Sure,".'
MIN_NUMBER_DIGITS = 3  # shorter numbers (a party of 4, 7 pm) are said in too many ways to check


def _normalised(text: str) -> str:
    return normalise_words(text.replace("\u2019", "'").replace("\u2018", "'"))


def _content_words(text: str) -> set[str]:
    words = (w.removesuffix("'s") for w in _normalised(text).split())
    return {w.removesuffix("s") if len(w) > 4 else w for w in words if len(w) >= 4} - FUNCTION_WORDS


@dataclass(frozen=True)
class Asked:
    """What a reply answers: the caller's last words, and the instructions the model was given."""

    caller_said: str = ""
    instructions: tuple[str, ...] = ()

    @classmethod
    def of(cls, messages: list[Message]) -> Asked:
        said = next((m for m in reversed(messages) if m.get("role") == "user"), {}).get("content")
        rules = tuple(str(m.get("content") or "") for m in messages if m.get("role") == "system")
        return cls(str(said or ""), rules)

    def calls_for(self, reason: Reason) -> bool:
        """Whether the turn makes this shape the right reply: condolences to a caller who tells of a loss,
        what the agent is to one who asks it, a refusal to one who asks what the instructions forbid."""
        if reason == "condolence":
            return bool(LOSS.search(_normalised(self.caller_said)))
        if reason == "non_answer":
            return bool(ASKS_WHAT_IT_IS.search(_normalised(self.caller_said)))
        asked = _content_words(self.caller_said)
        return any(
            FORBIDS.search(_normalised(rule)) and asked & _content_words(rule)
            for text in self.instructions
            for rule in split_sentences(text)
        )


def failure_shape(sentence: str, asked: Asked = Asked()) -> Reason | None:
    """The failure shape of a reply's first sentence, the most telling first; None for none, or for one
    the turn calls for."""
    words = _normalised(sentence)
    for reason, pattern in SHAPES:
        if not pattern.search(words) or asked.calls_for(reason):
            continue
        if reason == "condolence" or not HONEST_LIMIT.search(words):
            return reason
    return None


def _suspect(words: str) -> bool:
    return any(
        opening.startswith(words) or words == opening or words.startswith(opening + " ")
        for opening in SUSPECT_OPENINGS
    )


class OpeningCheck:
    """Reads a reply's text as it comes: hold it, speak it, or the failure shape its opening has."""

    def __init__(self, asked: Asked = Asked()) -> None:
        self.asked = asked
        self.text = ""

    def push(self, delta: str) -> Decision:
        self.text += delta
        words = _normalised(self.text)
        if not words:
            return "hold"
        if not _suspect(words):
            return "speak"
        sentences = split_sentences(self.text)
        if len(sentences) > 1 or ends_sentence(self.text) or len(words.split()) > MAX_HELD_WORDS:
            return failure_shape(sentences[0], self.asked) or "speak"
        return "hold"

    def end(self) -> Reason | None:
        """The reply ended while held: the failure shape of its opening as it stands, or None."""
        sentences = split_sentences(self.text)
        return failure_shape(sentences[0], self.asked) if sentences else None


def nudged(messages: list[Message]) -> list[Message]:
    return [*messages, {"role": "system", "content": NUDGE}]


def _arguments_text(call: ToolCall) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def invented_number(call: ToolCall, messages: list[Message], tools: Tools | None) -> bool:
    """Whether `call`'s arguments carry a number that no instruction, tool, tool result or caller's words
    in `messages` holds (the model's own earlier replies do not count)."""
    numbers = [n for n in re.findall(r"\d+", _arguments_text(call)) if len(n) >= MIN_NUMBER_DIGITS]
    if not numbers:
        return False
    known = [str(m.get("content") or "") for m in messages if m.get("role") != "assistant"]
    said = digit_runs(" ".join([*known, json.dumps(tools or [])]))
    return any(not any(number in run for run in said) for number in numbers)


def _arguments(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments


def _calls_made(messages: list[Message]) -> Iterator[dict[str, Any]]:
    """The `function` (name, arguments) of every tool call the conversation holds."""
    for message in messages:
        for call in message.get("tool_calls") or ():
            yield call.get("function", {})


def repeated_call(call: ToolCall, messages: list[Message]) -> bool:
    """Whether the conversation already holds `call`: the same tool with the same arguments (Qwen2.5-0.5B
    asked for the order it had just been told about, until the rounds ran out)."""
    asked = _arguments(call.arguments)
    return any(
        earlier.get("name") == call.name and _arguments(earlier.get("arguments")) == asked
        for earlier in _calls_made(messages)
    )


def gives_part_of(call: ToolCall, due: list[str]) -> bool:
    """Whether `call` carries a piece of a number due to be looked up and not the whole of it: Whisper
    wrote a caller's pause inside "four seven ... one two" as "47. 1,2.", and Qwen2.5-Coder-1.5B looked
    up order 47."""
    given = re.findall(r"\d+", _arguments_text(call))
    whole = any(number in run for number in due for run in given)
    return not whole and any(run in number for number in due for run in given)


def numbers_to_look_up(messages: list[Message], lookups: tuple[str, ...]) -> list[str]:
    """The numbers (three digits or more, said in any way, as figures) in the caller's newest words that
    no tool call in `messages` has been given, when a lookup is offered to answer them with."""
    if not lookups:
        return []
    numbers = [n for n in digit_runs(Asked.of(messages).caller_said) if len(n) >= MIN_NUMBER_DIGITS]
    given = digit_runs(" ".join(str(call.get("arguments") or "") for call in _calls_made(messages)))
    return [number for number in numbers if not any(number in run for run in given)]


def _past_an_acknowledgement(words: str) -> bool:
    """Whether a reply's words before its call have gone on past a short first sentence."""
    return len(split_sentences(words)) > 1 or len(words.split()) > MAX_WORDS_BEFORE_CALL


def guarded_stream(
    llm: LlmEngine,
    messages: list[Message],
    should_stop: Callable[[], bool],
    tools: Tools | None = None,
    *,
    lookups: tuple[str, ...] = (),
    on_regenerate: Callable[[Reason], None] | None = None,
) -> Iterator[str | ToolCall]:
    """`llm.stream`, with a reply of a failure shape asked for once more (counted, and told to
    `on_regenerate`) before any of it is given. A reply stopped by `should_stop` is never asked again.
    `lookups`: the offered tools without side effects that take arguments (see the module's account)."""
    check: OpeningCheck | None = OpeningCheck(Asked.of(messages))
    due = numbers_to_look_up(messages, lookups) if tools else []
    held: list[str] = []
    words_before_call = ""  # while a lookup is due, the reply's words so far
    reason: Reason | None = None
    first = llm.stream(messages, should_stop, tools)
    try:
        for delta in first:
            if check is None:
                yield delta
                continue
            decision: Decision = "speak"
            if not isinstance(delta, ToolCall) and due:
                words_before_call += delta
                decision = "not_looked_up" if _past_an_acknowledgement(words_before_call) else "hold"
            elif not isinstance(delta, ToolCall):
                decision = check.push(delta)
            elif due and gives_part_of(delta, due):
                decision = "not_looked_up"
            elif invented_number(delta, messages, tools):
                decision = "invented_number"
            elif repeated_call(delta, messages):
                decision = "repeated_call"
            if decision == "hold":
                held.append(str(delta))
                continue
            if decision != "speak":
                reason = decision
                break
            check = None
            yield from held
            yield delta
        else:
            if check is None or not held or should_stop():
                return
            reason = "not_looked_up" if due else check.end()
            if reason is None:
                yield from held
                return
    finally:
        close = getattr(first, "close", None)  # stops the model at once
        if callable(close):
            close()
    if reason is None or should_stop():
        return
    metrics.REPLIES_REGENERATED_TOTAL.labels(reason=reason).inc()
    if on_regenerate is not None:
        on_regenerate(reason)
    if reason == "not_looked_up":
        # The number in figures: a caller's "four seven one two", or "47. 1,2," as Whisper wrote a pause,
        # went into the call as written.
        figures = {"role": "system", "content": f"The caller's number, in figures: {', '.join(due)}."}
        yield from llm.stream([*messages, figures], should_stop, tools, calls=lookups)
        return
    # A made-up number comes back when asked again (Qwen2.5-Coder did, with the nudge): the second reply
    # is words only, which ask for the number or answer what was asked; the tools stay in its prompt.
    calls = reason not in ("invented_number", "repeated_call")
    yield from llm.stream(nudged(messages), should_stop, tools, calls=calls)
