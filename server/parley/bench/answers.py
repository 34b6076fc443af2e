"""Answers: does the agent answer plain questions right? A fixed set of everyday and factual questions.

Each question has the words a right answer contains (one word of each group). By default the LLM the
settings name answers in this process, exactly as the LLM stage would (the service's system prompt, its
token and sentence limits), one question at a time with no history, and the bench reports how many
answers were right and how soon the first speakable piece was ready. `--spoken` asks the questions
instead over a call (espeak-ng speech, the service's Whisper and LLM), as a caller would.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from parley.bench import percentiles, progress, settings_from_flags
from parley.config import Settings
from parley.engines.llm import LlmEngine, Message
from parley.pipeline.segmenter import ReplySegmenter, ends_sentence

NAME = "answers"
HELP = "everyday and factual questions: right answers out of the set, and time to the first piece"


@dataclass(frozen=True)
class Question:
    text: str
    expect: tuple[tuple[str, ...], ...]  # a right answer has one of each group (words or phrases)


BOOKS = (
    "mockingbird", "1984", "orwell", "gatsby", "austen", "pride and prejudice", "harry potter", "hobbit",
    "tolkien", "lord of the rings", "alchemist", "sapiens", "little prince", "book thief", "dune",
    "the road", "moby dick", "jane eyre", "great expectations", "catcher in the rye", "the martian",
    "atomic habits", "educated", "becoming", "brave new world", "war and peace", "odyssey", "narnia",
    "charlotte's web", "wonder", "the giver", "the secret garden", "treasure island", "old man and the sea",
)  # fmt: skip
DISHES = (
    "pasta", "chicken", "salad", "soup", "stir fry", "stir-fry", "rice", "curry", "tacos", "pizza", "fish",
    "salmon", "vegetables", "omelette", "omelet", "risotto", "burger", "steak", "noodles", "lasagna",
    "spaghetti", "roast", "sandwich", "beans", "tofu", "eggs", "quinoa",
)  # fmt: skip
SLEEP_TIPS = (
    "screen", "caffeine", "routine", "dark", "relax*", "breath*", "bed", "cool", "meditat*", "read",
    "schedule", "same time", "phone",
)  # fmt: skip
STORY_WORDS = ("ship", "sail*", "captain", "crew", "storm", "wave*", "ocean", "island")
BATTERY_TIPS = (
    "brightness", "background", "low power", "battery saver", "power saving", "location", "bluetooth",
    "wi-fi", "wifi", "apps", "notifications",
)  # fmt: skip

QUESTIONS = (
    Question("What is the capital of France?", (("paris",),)),
    Question("What is the capital city of Japan?", (("tokyo",),)),
    Question("How many legs does a spider have?", (("eight", "8"),)),
    Question("How many days are there in a week?", (("seven", "7"),)),
    Question("What is two plus two?", (("four", "4"),)),
    Question("How many continents are there?", (("seven", "7"),)),
    Question("What is the largest ocean on Earth?", (("pacific",),)),
    Question("Who wrote Romeo and Juliet?", (("shakespeare",),)),
    Question("At what temperature does water boil in Celsius?", (("100", "hundred"),)),
    Question("What do bees make?", (("honey",),)),
    Question("What language do people speak in Brazil?", (("portuguese",),)),
    Question("Which planet is closest to the sun?", (("mercury",),)),
    Question("What colour is a ripe banana?", (("yellow",),)),
    Question("How many minutes are there in an hour?", (("sixty", "60"),)),
    Question("What time zone is London in?", (("gmt", "greenwich", "utc", "bst", "british summer time"),)),
    Question("How do I make a cup of tea?", (("boil*", "kettle", "hot water"),)),
    Question("Can you recommend a good book to read?", (BOOKS,)),
    Question("What should I cook for dinner tonight?", (DISHES,)),
    Question("Tell me a short story about a ship lost at sea.", (STORY_WORDS,)),
    Question("What is a good way to fall asleep faster?", (SLEEP_TIPS,)),
    Question("How can I keep my phone battery from running out so fast?", (BATTERY_TIPS,)),
)


def normalise(text: str) -> str:
    """Lower case, words and digits only: what the expected words are compared with."""
    return " ".join("".join(c if c.isalnum() or c in "'-" else " " for c in text.lower()).split())


def is_right(question: Question, answer: str) -> bool:
    """True when the answer holds a word (or phrase) of every expected group; "word*" is any word that
    starts so."""
    words = f" {normalise(answer)} "
    return all(any(_holds(words, option) for option in group) for group in question.expect)


def _holds(words: str, option: str) -> bool:
    if option.endswith("*"):
        return f" {normalise(option[:-1])}" in words
    return f" {normalise(option)} " in words


def spoken_reply(llm: LlmEngine, settings: Settings, question: str) -> tuple[str, float | None]:
    """The reply the LLM stage would speak (its sentence limit included), and seconds to its first piece."""
    messages: list[Message] = [
        {"role": "system", "content": settings.system_prompt},
        {"role": "user", "content": question},
    ]
    segmenter = ReplySegmenter()
    pieces: list[str] = []
    first_piece_s: float | None = None
    sentences_left = settings.max_reply_sentences
    started = time.perf_counter()
    deltas = llm.stream(messages, should_stop=lambda: False)
    try:
        for delta in deltas:
            if not isinstance(delta, str):
                continue  # no tools are offered here
            for piece in segmenter.push(delta):
                if first_piece_s is None:
                    first_piece_s = time.perf_counter() - started
                pieces.append(piece)
                sentences_left -= ends_sentence(piece)
            if sentences_left <= 0:
                break
    finally:
        close = getattr(deltas, "close", None)  # stops the model at once, as a barge-in would
        if callable(close):
            close()
    if sentences_left > 0:
        pieces.extend(segmenter.flush())
    if first_piece_s is None and pieces:
        first_piece_s = time.perf_counter() - started
    return " ".join(pieces), first_piece_s


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llm-model", default="", help="the LLM to ask (default: the service's default, or --server-arg)"
    )
    parser.add_argument("--spoken", action="store_true", help="ask over a call (espeak-ng, Whisper, LLM)")
    parser.add_argument("--repeat", type=int, default=1, help="ask the whole set this many times")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.spoken:
        return await _spoken(args)
    from parley.engines.llm import load_llm

    flags = [*args.server_arg, *([f"--llm-model={args.llm_model}"] if args.llm_model else [])]
    settings = settings_from_flags(flags)
    started = time.perf_counter()
    llm = load_llm(settings)
    load_s = time.perf_counter() - started
    rows = []
    for _ in range(args.repeat):
        for question in QUESTIONS:
            reply, first_piece_s = spoken_reply(llm, settings, question.text)
            rows.append(
                {
                    "question": question.text,
                    "reply": reply,
                    "right": is_right(question, reply),
                    "first_piece_s": None if first_piece_s is None else round(first_piece_s, 3),
                }
            )
            progress(f"{'right' if rows[-1]['right'] else 'WRONG'} {question.text!r}: {reply!r}")
    close = getattr(llm, "close", None)
    if callable(close):
        close()
    return _result(rows, {"llm": settings.llm_model, "load_s": round(load_s, 1)})


async def _spoken(args: argparse.Namespace) -> dict[str, Any]:
    from parley.bench.common import caller_for, service_for
    from parley.bench.speech import espeak, trim

    if args.llm_model:
        args.server_arg = [*args.server_arg, f"--llm-model={args.llm_model}"]
    rows = []
    with service_for(args) as (url, service):
        async with caller_for(args, url, service) as caller:
            await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
            for _ in range(args.repeat):
                for question in QUESTIONS:
                    _, asked = await caller.say(trim(espeak(question.text)))
                    heard = await caller.wait_for_event("user_transcript", timeout=30, after=asked)
                    done = await caller.wait_for_event("agent_done", timeout=90, after=asked)
                    latency = await caller.wait_for_event("latency", timeout=5, after=asked)
                    await caller.wait_for_silence(after=time.monotonic(), hold_s=1.0, timeout=60)
                    rows.append(
                        {
                            "question": question.text,
                            "heard_as": heard["text"],
                            "reply": done["text"],
                            "right": is_right(question, done["text"]),
                            "response_s": latency.get("response_s"),
                        }
                    )
                    verdict = "right" if rows[-1]["right"] else "WRONG"
                    progress(f"{verdict} {heard['text']!r}: {done['text']!r}")
    return _result(rows, {"spoken": True})


def _result(rows: list[dict[str, Any]], about: dict[str, Any]) -> dict[str, Any]:
    right = sum(r["right"] for r in rows)
    summary: dict[str, Any] = {**about, "right answers": f"{right}/{len(rows)}"}
    if any("first_piece_s" in r for r in rows):
        summary["first piece ready (s)"] = percentiles(
            [r["first_piece_s"] for r in rows if r.get("first_piece_s") is not None]
        )
    if any("response_s" in r for r in rows):
        summary["server response_s"] = percentiles(
            [r["response_s"] for r in rows if r.get("response_s") is not None]
        )
    return {"summary": summary, "answers": rows}
