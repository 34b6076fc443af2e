"""What a team's backend does with `X-Parley-Signature`: a good, recent signature verifies; anything a
stranger can put in the header instead is refused with False, never an exception."""

from __future__ import annotations

import time

import pytest

from parley.agent.signing import sign, verify

SECRET = "webhook-secret"
BODY = b'{"call_id": "c-1"}'


def test_a_recent_signature_of_the_body_verifies_and_a_stale_or_altered_one_does_not() -> None:
    now = int(time.time())
    assert verify(sign(BODY, SECRET), BODY, SECRET)
    assert not verify(sign(BODY, SECRET, now - 301), BODY, SECRET)
    assert not verify(sign(BODY, SECRET), BODY + b" ", SECRET)
    assert not verify(sign(BODY, "another-secret"), BODY, SECRET)


@pytest.mark.parametrize(
    "header",
    [
        "",
        ",,,",
        "garbage",
        "v1=" + "0" * 64,  # no t=
        "t=,v1=" + "0" * 64,
        "t=abc,v1=" + "0" * 64,
        "t=1e9,v1=" + "0" * 64,
        "t=-1,v1=" + "0" * 64,
        "t=\u0661\u0662\u0663,v1=" + "0" * 64,  # Arabic-Indic digits: int() takes them
        "t=" + "9" * 400 + ",v1=" + "0" * 64,  # int() takes it; subtracting it from a float overflows
        "t=" + "9" * 5000 + ",v1=" + "0" * 64,  # over int()'s digit limit
        "t={now}",  # no v1
        "t={now},v1=",
        "t={now},v1=zz" + "0" * 62,  # not hex
        "t={now},v1=\u00e9" + "0" * 63,  # non-ASCII: compare_digest raises on it
        "t={now},v1=" + "0" * 63,  # one digit short
        "t={now},v1=" + "0" * 6400,  # huge
        "t={now}," * 5000,
        "t={now},v1=" + "0" * 64 + "\x00",
    ],
)
def test_a_malformed_header_is_refused_never_raised(header: str) -> None:
    assert verify(header.replace("{now}", str(int(time.time()))), BODY, SECRET) is False


@pytest.mark.parametrize("header", [None, b"t=1,v1=00", 12])
def test_a_header_that_is_not_text_is_refused(header: object) -> None:
    assert verify(header, BODY, SECRET) is False  # type: ignore[arg-type]
