"""What the benchmarks share: the service they measure, and the questions they ask."""

from __future__ import annotations

import argparse
import contextlib
import difflib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from parley.bench.caller import Caller
from parley.bench.carrier import CarrierCaller
from parley.bench.service import Service
from parley.bench.sip_caller import SipCaller

QUESTIONS = (
    "what is the weather like in paris today",
    "can you recommend a good book to read",
    "how do i make a cup of tea",
    "what time does the bank usually open",
    "tell me something interesting about the moon",
    "how far is it from london to madrid",
    "what should i cook for dinner tonight",
    "how many legs does a spider have",
    "what is the capital city of japan",
    "can you help me plan a short trip",
)


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=("webrtc", "sip", "carrier"),
        default="webrtc",
        help="how the caller calls (default webrtc; carrier: a Twilio media stream)",
    )
    parser.add_argument("--sip-uri", default="", help="with --url and --transport sip: the service's SIP URI")


def new_caller(
    args: argparse.Namespace, url: str, service: Service | None
) -> Caller | SipCaller | CarrierCaller:
    """A caller (not yet connected) over the transport the benchmark was asked for."""
    transport = getattr(args, "transport", "webrtc")
    if transport == "carrier":
        return CarrierCaller(url)
    if transport == "sip":
        sip_uri = getattr(args, "sip_uri", "") or (service.sip_uri if service else "")
        if not sip_uri:
            raise SystemExit("--transport sip with --url needs --sip-uri")
        return SipCaller(url, sip_uri)
    return Caller(url)


@contextlib.asynccontextmanager
async def caller_for(
    args: argparse.Namespace, url: str, service: Service | None
) -> AsyncIterator[Caller | SipCaller | CarrierCaller]:
    """A connected caller over the chosen transport, hung up on exit."""
    async with new_caller(args, url, service) as caller:
        yield caller


@contextlib.contextmanager
def service_for(args: argparse.Namespace) -> Iterator[tuple[str, Service | None]]:
    """The URL to call: `--url`, or a service started here for the duration of the benchmark."""
    if args.url:
        yield args.url, None
        return
    log_path = Path(args.server_log) if args.server_log else None
    with Service(args.server_arg, log_path=log_path) as service:
        yield service.base_url, service


def words(text: str) -> set[str]:
    return {w.strip(".,?!'\"").lower() for w in text.split() if w.strip(".,?!'\"")}


def word_overlap(heard: str, said: str) -> float:
    """The share of the words said that were heard (a transcript check that tolerates one slip)."""
    return len(words(heard) & words(said)) / max(1, len(words(said)))


def letters_alike(heard: str, said: str) -> float:
    """How alike the letters of two transcripts are, 0..1, blind to where the words split.

    Whisper hearing narrowband speech often merges or splits words ("on Japan" -> "Onjupant"),
    which costs a short reply most of its word overlap while its letters still match.
    """

    def letters(text: str) -> str:
        return "".join(c for c in text.lower() if c.isalpha())

    return difflib.SequenceMatcher(None, letters(heard), letters(said), autojunk=False).ratio()
