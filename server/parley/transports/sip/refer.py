"""Call transfer by REFER (RFC 3515): the request we send in a call's dialog, and the implicit
subscription whose NOTIFYs (`Event: refer`, a `message/sipfrag` body, RFC 3420) tell how the
transferee's new call went: `SIP/2.0 100 Trying` while it is being set up, then its final status.
"""

from __future__ import annotations

import asyncio

from parley.transports.line import Destination
from parley.transports.sip.dialog import Dialog
from parley.transports.sip.message import SipRequest
from parley.transports.sip.uri import SipError, SipUri, bare_host

SIPFRAG = "message/sipfrag"
EVENT_PACKAGE = "refer"


class ReferSubscription:
    """Our REFER's subscription (RFC 3515 2.4.4), from the REFER until its final NOTIFY.

    `outcome` holds the new call's final status and reason, or (0, why) when the subscription ended
    without one. A NOTIFY may overtake the REFER's 202 (UDP does not keep order, and the transferee may
    notify at once), so the subscription exists before the REFER is sent.
    """

    def __init__(self) -> None:
        self.outcome: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self.progress: list[int] = []  # every status the NOTIFYs reported, provisional ones included

    def notified(self, status: int | None, reason: str, terminated: bool) -> None:
        if status is not None:
            self.progress.append(status)
        if self.outcome.done():
            return
        if status is not None and status >= 200:
            self.outcome.set_result((status, reason))
        elif terminated:
            self.outcome.set_result((0, "the far end ended the transfer without an outcome"))

    def end(self, why: str) -> None:
        if not self.outcome.done():
            self.outcome.set_result((0, why))


def refer_to(destination: Destination, dialog: Dialog) -> str:
    """The Refer-To URI: a SIP URI as given; a number as a SIP URI at the peer we are talking to, which
    routes it (the dialog's remote target host and port: the peer's Contact, RFC 3261 12.1)."""
    if not destination.is_number:
        return destination.text
    try:
        target: SipUri | None = SipUri.parse(dialog.remote_target)
    except SipError:
        target = None
    if target is not None and target.host:
        host, port = bare_host(target.host), target.port
    else:  # a tel: target or none usable: where the dialog's requests come from
        host, port = dialog.fallback.host, dialog.fallback.port
    where = f"[{host}]" if ":" in host else host
    return f"sip:{destination.text}@{where}" + (f":{port}" if port else "")


def refer_request(dialog: Dialog, target: str) -> SipRequest:
    """The REFER (RFC 3515): Refer-To the target, Referred-By us (RFC 3892), and our Contact, which a
    request that creates a subscription carries (RFC 6665)."""
    refer = dialog.request("REFER")
    refer.headers.add("Refer-To", f"<{target}>")
    refer.headers.add("Referred-By", dialog.local_uri)
    refer.headers.add("Contact", dialog.local_contact)
    return refer


def sipfrag_status(body: bytes) -> tuple[int, str]:
    """The status line of a sipfrag body (RFC 3420), e.g. `SIP/2.0 486 Busy Here` -> (486, "Busy Here").
    ValueError when the body does not start with one."""
    first = body.decode("utf-8", errors="replace").lstrip().split("\n", 1)[0].strip()
    version, _, rest = first.partition(" ")
    code, _, reason = rest.partition(" ")
    if version.upper() != "SIP/2.0" or len(code) != 3 or not code.isdigit() or not 100 <= int(code) <= 699:
        raise ValueError(f"not a sipfrag status line: {first[:80]!r}")
    return int(code), reason.strip()


def subscription_terminated(value: str | None) -> bool:
    """Whether a Subscription-State header (RFC 6665 8.2.3) says the subscription is over."""
    return (value or "").split(";")[0].strip().lower() == "terminated"
