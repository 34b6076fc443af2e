"""What the agent asks of its line, checked once for every transport: keypad digits to send and the
destination of a transfer (spec/interfaces.md, "[builtins]"). A bad value fails as LineActionFailed,
whose message the model reads, before any transport touches its wire."""

from __future__ import annotations

import re
from dataclasses import dataclass

from parley.transports.base import LineActionFailed

KEYPAD = "0123456789*#ABCD"  # the 16 DTMF keys (ITU-T Q.23; RFC 4733 events 0-15)
MAX_DIGITS = 64  # what an RTP stream queues at most (sip/media.py); a phone menu needs a handful
_SIP_URI = re.compile(r"sips?:[^\s<>\"]+")
_E164 = re.compile(r"\+[0-9]{6,15}")  # ITU-T E.164: at most 15 digits after the +


@dataclass(frozen=True)
class Destination:
    """Where a transfer goes: a `sip:`/`sips:` URI, or a phone number in +E.164 form."""

    text: str

    @property
    def is_number(self) -> bool:
        return self.text.startswith("+")


def transfer_destination(text: str) -> Destination:
    value = text.strip()
    if _SIP_URI.fullmatch(value) or _E164.fullmatch(value):
        return Destination(value)
    raise LineActionFailed(f"{text!r} is not a destination: use a sip: URI or a +E.164 number")


def keypad_digits(digits: str) -> str:
    """The keys to send, upper-cased, spaces dropped; LineActionFailed for anything else."""
    keys = "".join(digits.split()).upper()
    if not keys:
        raise LineActionFailed("no digits to send")
    if len(keys) > MAX_DIGITS:
        raise LineActionFailed(f"at most {MAX_DIGITS} digits at a time")
    bad = sorted({key for key in keys if key not in KEYPAD})
    if bad:
        raise LineActionFailed(f"{''.join(bad)!r} are not keypad keys; the keys are 0-9, *, # and A-D")
    return keys
