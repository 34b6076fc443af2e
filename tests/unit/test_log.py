"""Log lines: key=value or JSON, every line of a call with its call_id, and what was said kept out of
the logs unless asked for."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from parley.call import Call
from parley.config import Settings
from parley.log import CALL_ID, CallContext, JsonFormatter, KeyValueFormatter, event
from parley.runtime import Runtime
from parley.transports.base import HangUp, open_call
from tests.doubles import make_engines
from tests.unit.test_transport_seam import RecordingTransport

log = logging.getLogger("parley.test")


@pytest.fixture
def lines() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(CallContext(transcripts=False))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield out, handler
    root.removeHandler(handler)
    root.setLevel(level)


def parsed(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_carry_the_event_its_fields_and_the_call_of_the_thread(lines) -> None:  # type: ignore[no-untyped-def]
    out, _ = lines
    event(log, "turn_reopened", call_id="c-000000000001", revision=1, took_s=0.25)
    worker = threading.Thread(
        target=lambda: event(log, "stage_failed", stage="stt"), name="c-0123456789ab:stt"
    )
    worker.start()
    worker.join()
    first, second = parsed(out)
    assert (
        first["event"] == "turn_reopened" and first["call_id"] == "c-000000000001" and first["revision"] == 1
    )
    assert first["level"] == "info" and first["logger"] == "parley.test" and str(first["ts"]).endswith("Z")
    assert second["call_id"] == "c-0123456789ab" and second["stage"] == "stt"


def test_what_was_said_is_kept_out_of_the_logs_unless_asked_for(lines) -> None:  # type: ignore[no-untyped-def]
    out, handler = lines
    event(log, "user_said", call_id="c-1", text="my card number is 4111", revision=0)
    event(log, "dtmf", call_id="c-1", digit="4")
    handler.filters[0].transcripts = True  # type: ignore[union-attr]
    event(log, "user_said", call_id="c-1", text="hello")
    quiet, keys, said = parsed(out)
    assert "text" not in quiet and quiet["revision"] == 0 and "digit" not in keys
    assert said["text"] == "hello"


def test_at_debug_level_transcripts_are_logged(lines) -> None:  # type: ignore[no-untyped-def]
    out, _ = lines
    logging.getLogger().setLevel(logging.DEBUG)
    event(log, "user_said", call_id="c-1", text="hello")
    assert parsed(out)[0]["text"] == "hello"


async def test_lines_logged_while_a_transport_connects_carry_the_call_id(lines) -> None:  # type: ignore[no-untyped-def]
    out, _ = lines
    runtime = Runtime(Settings(greeting="", sip="off"), make_engines())

    async def connect(call: Call, hang_up: HangUp) -> RecordingTransport:
        event(log, "negotiating")  # no call_id given: it comes from the context
        return RecordingTransport(call, hang_up)

    try:
        call, _ = await open_call(runtime, "sip", 8000, connect)
        assert CALL_ID.get() == ""  # the caller's context is left as it was
    finally:
        await runtime.close()
    negotiating = next(line for line in parsed(out) if line["event"] == "negotiating")
    assert negotiating["call_id"] == call.call_id


def test_text_lines_quote_values_with_spaces() -> None:
    record = logging.LogRecord("parley.x", logging.INFO, "", 0, "reply_started", None, None)
    record.call_id = "c-1"
    record.note = 'two "words"'
    line = KeyValueFormatter().format(record)
    assert 'event=reply_started call_id=c-1 note="two \\"words\\""' in line


def test_phone_numbers_are_masked_to_their_last_digits_unless_asked_for(lines) -> None:  # type: ignore[no-untyped-def]
    out, handler = lines
    event(
        log, "sip_answered", call_id="c-1", caller="sip:+15551234567@trunk.example.com", rtp="10.0.0.7:40000"
    )
    event(log, "call_transferred", call_id="c-1", to="+44 20 7946 0958")
    event(log, "dial_failed", call_id="c-1", error="486 from <sip:0049301234567@pbx>; tel:+15550001111")
    event(log, "sip_answered", call_id="c-1", caller="sip:alice@example.com", called="sip:500@parley")
    handler.filters[0].numbers = True  # type: ignore[union-attr]
    event(log, "sip_answered", call_id="c-1", caller="sip:+15551234567@trunk.example.com")
    answered, transferred, failed, named, whole = parsed(out)
    assert answered["caller"] == "sip:+********567@trunk.example.com" and answered["rtp"] == "10.0.0.7:40000"
    assert transferred["to"] == "+** ** **** *958"
    assert failed["error"] == "486 from <sip:**********567@pbx>; tel:+********111"
    assert named["caller"] == "sip:alice@example.com" and named["called"] == "sip:500@parley"  # no numbers
    assert whole["caller"] == "sip:+15551234567@trunk.example.com"


def test_what_the_caller_heard_is_kept_out_of_the_logs_like_what_they_said(lines) -> None:  # type: ignore[no-untyped-def]
    out, _ = lines
    event(log, "agent_resumed", call_id="c-1", heard="your card ends in 1234")
    assert "heard" not in parsed(out)[0]
