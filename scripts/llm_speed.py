"""First-token time and decode speed of local LLMs, asked as the LLM stage asks them in a fresh call.

    .venv/bin/python scripts/llm_speed.py qwen2.5-0.5b qwen2.5-coder-1.5b --rounds 3

Each model is loaded as `parley serve` loads it (llama.cpp on a CPU, the agent's prompt and greeting
read before the first call), then asked each question in a fresh conversation; the models take turns
every round, so that a machine slowed by something else slows them alike. First token: the question
asked -> its reply's first text. Decode: the reply's tokens after its first, per second of their
arrival. Medians over every question and round. On a machine others share the numbers are rough:
compare models only within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from transformers import AutoTokenizer

from parley.config import Settings
from parley.engines.cache import llm_gguf
from parley.engines.llm import LlmEngine, Message
from parley.engines.llm_loading import load_llm

QUESTIONS = (
    "What is the capital of France?",
    "Can you recommend a good book to read?",
    "Tell me about the history of Rome.",
    "How do I make a good cup of tea?",
)


def timed_reply(llm: LlmEngine, settings: Settings, question: str) -> tuple[str, float, list[float]]:
    """(reply, seconds to its first text, arrival time of each piece after that)."""
    messages: list[Message] = [{"role": "system", "content": settings.system_prompt}]
    if settings.greeting:
        messages.append({"role": "assistant", "content": settings.greeting})
    messages.append({"role": "user", "content": question})
    started = time.perf_counter()
    pieces: list[str] = []
    arrivals: list[float] = []
    for delta in llm.stream(messages, lambda: False):
        if isinstance(delta, str) and delta:
            arrivals.append(time.perf_counter() - started)
            pieces.append(delta)
    if not arrivals:
        raise RuntimeError(f"no reply to {question!r}")
    return "".join(pieces), arrivals[0], arrivals


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="+", help="--llm-model names (packaged) or local .gguf files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="--llm-threads (0: every core)")
    args = parser.parse_args()

    settings = {
        m: Settings(llm_model=m, llm_runtime="llamacpp", llm_threads=args.threads) for m in args.models
    }
    engines: dict[str, LlmEngine] = {}
    tokenizers = {}
    for model, s in settings.items():
        started = time.perf_counter()
        engines[model] = load_llm(s)
        print(f"{model}: loaded in {time.perf_counter() - started:.1f} s", flush=True)
        tokenizers[model] = AutoTokenizer.from_pretrained(str(llm_gguf(s.resolved_cache_dir(), model)[1]))

    first: dict[str, list[float]] = {m: [] for m in args.models}
    rates: dict[str, list[float]] = {m: [] for m in args.models}
    lengths: dict[str, list[int]] = {m: [] for m in args.models}
    for _ in range(args.rounds):
        for model in args.models:
            for question in QUESTIONS:
                reply, to_first, arrivals = timed_reply(engines[model], settings[model], question)
                tokens = len(tokenizers[model].encode(reply, add_special_tokens=False))
                first[model].append(to_first)
                lengths[model].append(tokens)
                if tokens > 1 and arrivals[-1] > to_first:
                    rates[model].append((tokens - 1) / (arrivals[-1] - to_first))

    print(f"{'model':<24} {'first token p50':>16} {'decode tok/s p50':>17} {'reply tokens p50':>17}")
    for model in args.models:
        print(
            f"{model:<24} {statistics.median(first[model]):>14.3f} s "
            f"{statistics.median(rates[model]):>17.1f} {statistics.median(lengths[model]):>17.0f}"
        )
    for engine in engines.values():
        close = getattr(engine, "close", None)
        if close is not None:
            close()


if __name__ == "__main__":
    main()
