"""Answers: does the agent answer plain questions right, and how does it fail when it does not?

Two sets of questions (bench/answer_sets.py): `factual`, the 21 plain questions the published numbers
were measured on, asked of the service's own agent; `everyday`, what a business's phone line is asked,
asked of a front-desk agent whose prompt holds the answers. `--set` picks one; both by default.

Each reply gets one verdict (bench/verdicts.py): right, wrong, a refusal, a non-answer about itself, or
condolences out of nowhere; the JSON lists the replies of each verdict. By default the LLM the settings
name answers in this process, exactly as the LLM stage would in a fresh call (the agent's prompt, its
greeting said, the reply guard, the stage's sentence limit), and the bench reports how soon the first
speakable piece was ready and how many first replies the guard had written again. `--spoken` asks
over calls instead, as a caller would: in Piper's voice (the packaged one, its noise at 0 so every run
hears the same words) or espeak-ng's, each question in a fresh call after the
greeting or all of a set in one conversation, beside each reply what Whisper heard.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parley.agent.agentfile import Agent, default_agent, load_agent_file
from parley.agent.manners import prompt_start
from parley.agent.opening import default_opening
from parley.agent_settings import AgentSettings
from parley.bench import percentiles, progress, settings_from_flags
from parley.bench.answer_sets import SETS, Question, QuestionSet
from parley.bench.verdicts import VERDICTS, same_words, shapes, verdict
from parley.engines.llm import LlmEngine, Message
from parley.pipeline.reply_guard import guarded_stream
from parley.pipeline.segmenter import ReplySegmenter, ends_sentence

if TYPE_CHECKING:
    from parley.bench.listening import Ears
    from parley.bench.service import Service

NAME = "answers"
HELP = "plain and phone-line questions: right answers, refusals and non-answers, time to the first piece"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llm-model", default="", help="the LLM to ask (default: the service's default, or --server-arg)"
    )
    parser.add_argument(
        "--set",
        choices=("factual", "everyday", "both"),
        default="both",
        help="the questions: the 21 factual ones, the phone line's everyday ones, or both (default)",
    )
    parser.add_argument("--spoken", action="store_true", help="ask over calls (caller speech, Whisper, LLM)")
    parser.add_argument(
        "--voice",
        choices=("piper", "espeak"),
        default="piper",
        help="with --spoken, the caller's voice: Piper's packaged one (default) or espeak-ng's, whose "
        "accent costs words a person's voice would not",
    )
    parser.add_argument(
        "--calls",
        choices=("fresh", "one"),
        default="fresh",
        help="with --spoken: each question in a fresh call (default), or a set's questions in one call",
    )
    parser.add_argument("--repeat", type=int, default=1, help="ask each set this many times")


def chosen_sets(name: str) -> tuple[QuestionSet, ...]:
    return SETS if name == "both" else tuple(s for s in SETS if s.name == name)


@contextlib.contextmanager
def agent_file(question_set: QuestionSet) -> Iterator[Path | None]:
    """The set's agent as a file `parley serve --agent` takes; None for the service's own agent."""
    if not question_set.agent:
        yield None
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{question_set.name}.toml"
        path.write_text(question_set.agent)
        yield path


def agent_of(question_set: QuestionSet, settings: AgentSettings) -> Agent:
    with agent_file(question_set) as path:
        return load_agent_file(path) if path else default_agent(settings.system_prompt, settings.greeting)


def first_turn_messages(agent: Agent, question: str, *, manners: bool = False) -> list[Message]:
    """What the LLM stage is given for the first question of a call: the phone manners when they are
    on, the agent's prompt and its greeting."""
    messages = prompt_start(agent.system_prompt, manners=manners)
    if agent.greeting:
        messages.append({"role": "assistant", "content": agent.greeting})
    return [*messages, {"role": "user", "content": question}]


def spoken_reply(
    llm: LlmEngine,
    settings: AgentSettings,
    question: str,
    *,
    agent: Agent | None = None,
    on_regenerate: Callable[[str], None] | None = None,
) -> tuple[str, float | None]:
    """The reply the LLM stage would speak to the first question of a call (the reply guard and the
    sentence limit included), and seconds to its first piece. The service's own agent unless `agent` is
    given; `on_regenerate` hears the failure shape of a first reply the guard asked for again."""
    agent = agent or default_agent(settings.system_prompt, settings.greeting)
    segmenter = ReplySegmenter()
    pieces: list[str] = []
    first_piece_s: float | None = None
    sentences_left = settings.max_reply_sentences
    started = time.perf_counter()
    messages = first_turn_messages(agent, question, manners=settings.phone_manners)
    deltas = guarded_stream(llm, messages, lambda: False, on_regenerate=on_regenerate)
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


def judged(
    set_name: str, question: Question, reply: str, *, heard_as: str | None = None, **measured: Any
) -> dict[str, Any]:
    """One row of the results: what was heard (spoken), the reply, its verdict, its failure shapes."""
    said = verdict(question, reply)
    heard = {} if heard_as is None else {"heard_as": heard_as}
    row = {
        "set": set_name,
        "question": question.text,
        **heard,
        "reply": reply,
        "verdict": said,
        "right": said == "right",
        "shapes": shapes(reply),
        **measured,
    }
    progress(f"{said:<10} {question.text!r}{'' if heard_as is None else f' (heard {heard_as!r})'}: {reply!r}")
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sets = chosen_sets(args.set)
    if args.spoken:
        return await _spoken(args, sets)
    from parley.engines.llm_loading import load_llm

    flags = [*args.server_arg, *([f"--llm-model={args.llm_model}"] if args.llm_model else [])]
    settings = settings_from_flags(flags)
    started = time.perf_counter()
    llm = load_llm(settings, opening=default_opening(settings))
    load_s = time.perf_counter() - started
    rows = []
    try:
        for question_set in sets:
            agent = agent_of(question_set, settings)
            for _ in range(args.repeat):
                for question in question_set.questions:
                    guarded: list[str] = []
                    reply, first_piece_s = spoken_reply(
                        llm, settings, question.text, agent=agent, on_regenerate=guarded.append
                    )
                    first = None if first_piece_s is None else round(first_piece_s, 3)
                    rows.append(
                        judged(
                            question_set.name,
                            question,
                            reply,
                            first_piece_s=first,
                            written_again=guarded[0] if guarded else None,
                        )
                    )
    finally:
        close = getattr(llm, "close", None)
        if callable(close):
            close()
    return summarise(rows, {"llm": settings.local_llm(), "load_s": round(load_s, 1)})


async def _spoken(args: argparse.Namespace, sets: tuple[QuestionSet, ...]) -> dict[str, Any]:
    from parley.bench.common import service_for

    if args.url and len(sets) > 1:
        raise SystemExit(
            "--spoken with --url asks one --set, of the agent that service was started with "
            "(for --set everyday, FRONT_DESK_AGENT in parley/bench/answer_sets.py as its --agent file)"
        )
    if args.llm_model:
        args.server_arg = [*args.server_arg, f"--llm-model={args.llm_model}"]
    # Made before any call, so that the caller's synthesis never shares the cores with a reply.
    clips = {q.text: caller_speech(q.text, args.voice) for s in sets for q in s.questions}
    rows: list[dict[str, Any]] = []
    for question_set in sets:
        with agent_file(question_set) as path, service_for(_for_set(args, question_set, path)) as started:
            url, service = started
            rows += await _ask_set(args, url, service, question_set, clips)
    return summarise(rows, {"spoken": True, "voice": args.voice, "calls": args.calls})


def caller_speech(text: str, voice: str) -> np.ndarray:
    from parley.bench.speech import espeak, piper, trim

    return trim(piper(text, steady=True) if voice == "piper" else espeak(text))


def _for_set(args: argparse.Namespace, question_set: QuestionSet, agent: Path | None) -> argparse.Namespace:
    """The benchmark's flags for the service that answers this set: its agent, its own log."""
    server_log = args.server_log
    if server_log:
        log = Path(server_log)
        server_log = str(log.with_name(f"{log.stem}-{question_set.name}{log.suffix}"))
    server_arg = [*args.server_arg, *([f"--agent={agent}"] if agent else [])]
    return argparse.Namespace(**{**vars(args), "server_arg": server_arg, "server_log": server_log})


@contextlib.asynccontextmanager
async def _greeted_call(args: argparse.Namespace, url: str, service: Service | None) -> AsyncIterator[Ears]:
    """A call whose greeting has been heard to its end."""
    from parley.bench.common import caller_for

    async with caller_for(args, url, service) as caller:
        await caller.wait_for_event("agent_done", timeout=60, turn_id="greeting")
        await caller.wait_for_silence(after=time.monotonic(), hold_s=0.5, timeout=30)
        yield caller


async def _ask_set(
    args: argparse.Namespace,
    url: str,
    service: Service | None,
    question_set: QuestionSet,
    clips: dict[str, np.ndarray],
) -> list[dict[str, Any]]:
    """Each question in a fresh call after its greeting, or (`--calls one`) all of them in one call."""
    questions = [question for _ in range(args.repeat) for question in question_set.questions]
    if args.calls == "one":
        async with _greeted_call(args, url, service) as caller:
            return [await _ask(caller, question_set.name, q, clips[q.text]) for q in questions]
    rows = []
    for question in questions:
        async with _greeted_call(args, url, service) as caller:
            rows.append(await _ask(caller, question_set.name, question, clips[question.text]))
    return rows


async def _ask(caller: Ears, set_name: str, question: Question, clip: np.ndarray) -> dict[str, Any]:
    """Ask one question, wait for the whole reply to be heard, and judge it. A question that got no
    reply is a wrong answer with its reason, and the benchmark goes on."""
    _, asked = await caller.say(clip)
    heard: dict[str, Any] = {}
    try:
        heard = await caller.wait_for_event("user_transcript", timeout=30, after=asked)
        done = await caller.wait_for_event("agent_done", timeout=90, after=asked)
        latency = await caller.wait_for_event("latency", timeout=5, after=asked)
        await caller.wait_for_silence(after=time.monotonic(), hold_s=1.0, timeout=60)
    except TimeoutError as missing:
        text = str(heard.get("text", ""))
        return judged(set_name, question, "", heard_as=text, word_for_word=False, failure=str(missing))
    text = str(heard.get("text", ""))
    return judged(
        set_name,
        question,
        str(done.get("text", "")),
        heard_as=text,
        word_for_word=same_words(text, question.text),
        response_s=latency.get("response_s"),
    )


def summarise(rows: list[dict[str, Any]], about: dict[str, Any]) -> dict[str, Any]:
    """Counts per verdict for each set, the replies of each verdict, and the timings measured."""
    right = sum(r["right"] for r in rows)
    summary: dict[str, Any] = {**about, "right answers": f"{right}/{len(rows)}"}
    for name in dict.fromkeys(r["set"] for r in rows):
        of_set = [r for r in rows if r["set"] == name]
        summary[f"{name} ({len(of_set)})"] = {v: sum(r["verdict"] == v for r in of_set) for v in VERDICTS}
    summary["right, with a failure shape"] = sum(bool(r["right"] and r["shapes"]) for r in rows)
    if any("word_for_word" in r for r in rows):
        summary["questions heard word for word"] = f"{sum(r['word_for_word'] for r in rows)}/{len(rows)}"
    if any("written_again" in r for r in rows):
        again = [r["written_again"] for r in rows if r["written_again"]]
        summary["first replies the guard had written again"] = {
            "count": f"{len(again)}/{len(rows)}",
            **{reason: again.count(reason) for reason in dict.fromkeys(again)},
        }
    if any("first_piece_s" in r for r in rows):
        summary["first piece ready (s)"] = percentiles(
            [r["first_piece_s"] for r in rows if r.get("first_piece_s") is not None]
        )
    if any("response_s" in r for r in rows):
        summary["server response_s"] = percentiles(
            [r["response_s"] for r in rows if r.get("response_s") is not None]
        )
    shown = ("set", "question", "heard_as", "reply")
    by_verdict = {
        v: [{k: r[k] for k in shown if k in r} for r in rows if r["verdict"] == v] for v in VERDICTS
    }
    return {"summary": summary, "by verdict": by_verdict, "answers": rows}
