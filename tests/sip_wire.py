"""A raw SIP peer for tests: hand-written request text over UDP or TCP on 127.0.0.1.

What goes out is text written here line by line (not built by our serialiser), so the tests check what
a peer that never shared our code sees. What comes back is parsed with `parse_message`, and requests the
server sends us (a BYE) are answered by hand as RFC 3261 8.2.6 asks: Via, From, To (with our tag),
Call-ID and CSeq copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from parley.transports.sip.message import SipRequest, SipResponse, parse_message
from parley.transports.sip.uri import SipError

LOCAL = "127.0.0.1"
CRLF = "\r\n"
_HEAD_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"^(?:content-length|l)[ \t]*:[ \t]*([0-9]+)", re.IGNORECASE | re.MULTILINE)
_TAG = re.compile(r";\s*tag=", re.IGNORECASE)

Message = SipRequest | SipResponse


def branch() -> str:
    return "z9hG4bK" + secrets.token_hex(8)


def token() -> str:
    return secrets.token_hex(6)


@dataclass
class Received:
    message: Message
    raw: bytes
    at: float


@dataclass
class SipWire:
    """One raw peer: a UDP socket (or one TCP connection) on 127.0.0.1 talking to the server's port."""

    server_port: int
    transport: str = "UDP"
    port: int = 0
    received: list[Received] = field(default_factory=list)
    unparsed: list[bytes] = field(default_factory=list)
    # Requests from the server answered at once with this status (method -> status); others wait.
    auto_answer: dict[str, int] = field(default_factory=lambda: {"BYE": 200, "OPTIONS": 200})
    _udp: asyncio.DatagramTransport | None = None
    _writer: asyncio.StreamWriter | None = None
    _reader_task: asyncio.Task[None] | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def open(cls, server_port: int, transport: str = "UDP") -> SipWire:
        wire = cls(server_port, transport.upper())
        loop = asyncio.get_running_loop()
        if wire.transport == "UDP":
            wire._udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(wire), local_addr=(LOCAL, 0)
            )
            wire.port = int(wire._udp.get_extra_info("sockname")[1])
        else:
            reader, wire._writer = await asyncio.open_connection(LOCAL, server_port)
            wire.port = int(wire._writer.get_extra_info("sockname")[1])
            wire._reader_task = asyncio.ensure_future(wire._read_stream(reader))
        return wire

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task

    # addresses

    @property
    def here(self) -> str:
        return f"{LOCAL}:{self.port}"

    @property
    def contact(self) -> str:
        suffix = ";transport=tcp" if self.transport == "TCP" else ""
        return f"<sip:caller@{self.here}{suffix}>"

    def via(self, branch_id: str) -> str:
        return f"SIP/2.0/{self.transport} {self.here};branch={branch_id};rport"

    # sending

    def send(self, data: str | bytes) -> None:
        payload = data.encode() if isinstance(data, str) else data
        if self._udp is not None:
            self._udp.sendto(payload, (LOCAL, self.server_port))
        elif self._writer is not None:
            self._writer.write(payload)

    def reply(
        self,
        request: SipRequest,
        status: int,
        reason: str = "",
        *,
        to_tag: str | None = None,
        headers: Iterable[str] = (),
        body: str = "",
        content_type: str | None = None,
    ) -> None:
        """Answer a request the server sent us (8.2.6.2): its Vias, From, To, Call-ID and CSeq copied."""
        to = request.required("To")
        if to_tag and not _TAG.search(to):
            to += f";tag={to_tag}"
        lines = [f"SIP/2.0 {status} {reason or _REASONS.get(status, 'Whatever')}"]
        lines += [f"Via: {value}" for value in request.headers.get_all("Via")]
        lines += [
            f"From: {request.required('From')}",
            f"To: {to}",
            f"Call-ID: {request.required('Call-ID')}",
            f"CSeq: {request.required('CSeq')}",
            *headers,
        ]
        self.send(text(lines, body, content_type))

    # receiving

    def _received(self, data: bytes) -> None:
        try:
            message = parse_message(data)
        except SipError:
            self.unparsed.append(data)
            return
        self.received.append(Received(message, data, time.monotonic()))
        self._arrived.set()
        if isinstance(message, SipRequest) and message.method in self.auto_answer:
            self.reply(message, self.auto_answer[message.method], to_tag=token())

    async def _read_stream(self, reader: asyncio.StreamReader) -> None:
        buffer = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            buffer += chunk
            while (end := buffer.find(_HEAD_END)) >= 0:
                match = _LENGTH.search(buffer[:end])
                total = end + len(_HEAD_END) + (int(match.group(1)) if match else 0)
                if len(buffer) < total:
                    break
                self._received(buffer[:total])
                buffer = buffer[total:]

    def arrivals(
        self,
        status: int | None = None,
        *,
        method: str | None = None,
        call_id: str | None = None,
        cseq: int | None = None,
    ) -> list[Received]:
        """Every response received so far (copies included) that matches, with its arrival time."""
        found = []
        for item in self.received:
            m = item.message
            if not isinstance(m, SipResponse) or (status is not None and m.status != status):
                continue
            if (method is not None and m.cseq[1] != method) or (call_id is not None and m.call_id != call_id):
                continue
            if cseq is not None and m.cseq[0] != cseq:
                continue
            found.append(item)
        return found

    def responses(
        self,
        status: int | None = None,
        *,
        method: str | None = None,
        call_id: str | None = None,
        cseq: int | None = None,
    ) -> list[SipResponse]:
        found = []
        for item in self.arrivals(status, method=method, call_id=call_id, cseq=cseq):
            assert isinstance(item.message, SipResponse)
            found.append(item.message)
        return found

    def requests(self, method: str | None = None, *, call_id: str | None = None) -> list[SipRequest]:
        found = []
        for item in self.received:
            m = item.message
            if not isinstance(m, SipRequest) or (method is not None and m.method != method):
                continue
            if call_id is not None and m.call_id != call_id:
                continue
            found.append(m)
        return found

    async def wait_for(
        self, found: Callable[[], list[Message]], timeout: float, count: int = 1
    ) -> list[Message]:
        """Wait until `found()` returns at least `count` messages; AssertionError after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            messages = found()
            if len(messages) >= count:
                return messages
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"waited {timeout} s for {count} message(s), got {len(messages)}")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def response(
        self,
        status: int,
        *,
        method: str = "INVITE",
        call_id: str | None = None,
        cseq: int | None = None,
        timeout: float = 5.0,
    ) -> SipResponse:
        """The first response with `status` to a `method` request (of `call_id`), waiting for it."""
        messages = await self.wait_for(
            lambda: list(self.responses(status, method=method, call_id=call_id, cseq=cseq)), timeout
        )
        assert isinstance(messages[0], SipResponse)
        return messages[0]

    async def final(
        self, *, method: str, call_id: str, cseq: int | None = None, timeout: float = 5.0
    ) -> SipResponse:
        """The first final (>= 200) response to `method` in `call_id`."""

        def finals() -> list[Message]:
            return [r for r in self.responses(method=method, call_id=call_id, cseq=cseq) if r.status >= 200]

        messages = await self.wait_for(finals, timeout)
        assert isinstance(messages[0], SipResponse)
        return messages[0]

    async def request(self, method: str, *, call_id: str | None = None, timeout: float = 5.0) -> SipRequest:
        messages = await self.wait_for(lambda: list(self.requests(method, call_id=call_id)), timeout)
        assert isinstance(messages[0], SipRequest)
        return messages[0]


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, wire: SipWire) -> None:
        self.wire = wire

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.wire._received(data)


def text(lines: list[str], body: str = "", content_type: str | None = None) -> str:
    """A message from its start line and header lines; Content-Type and Content-Length added."""
    encoded = body.encode()
    if content_type is not None:
        lines = [*lines, f"Content-Type: {content_type}"]
    return CRLF.join([*lines, f"Content-Length: {len(encoded)}"]) + CRLF + CRLF + body


@dataclass
class Dialogue:
    """Our side of one call, as a phone keeps it: Call-ID, tags, CSeq; writes its requests as text."""

    wire: SipWire
    target: str  # the request-URI of the INVITE, e.g. sip:agent@127.0.0.1:5060
    call_id: str = field(default_factory=lambda: f"{token()}@test")
    from_tag: str = field(default_factory=token)
    to_tag: str | None = None  # learned from the server's answer
    cseq: int = 1
    invite_branch: str = ""
    invite_cseq: int = 1
    _sent: bool = False

    def request(
        self,
        method: str,
        *,
        cseq: int | None = None,
        branch_id: str | None = None,
        uri: str | None = None,
        body: str = "",
        content_type: str | None = None,
        headers: Iterable[str] = (),
        to_tag: str | None = None,
    ) -> str:
        """The request as text; a new branch and the next CSeq unless given."""
        if cseq is None and method in ("ACK", "CANCEL"):
            cseq = self.invite_cseq
        elif cseq is None:
            if self._sent:
                self.cseq += 1
            self._sent = True
            cseq = self.cseq
        branch_id = branch_id or branch()
        if method == "INVITE":
            self.invite_branch, self.invite_cseq = branch_id, cseq
        tag = to_tag if to_tag is not None else self.to_tag
        to = f"<{self.target}>" + (f";tag={tag}" if tag else "")
        lines = [
            f"{method} {uri or self.target} SIP/2.0",
            f"Via: {self.wire.via(branch_id)}",
            "Max-Forwards: 70",
            f"From: <sip:caller@{self.wire.here}>;tag={self.from_tag}",
            f"To: {to}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {cseq} {method}",
        ]
        if method in ("INVITE", "ACK"):
            lines.append(f"Contact: {self.wire.contact}")
        return text([*lines, *headers], body, content_type)

    def invite(
        self, body: str, *, content_type: str | None = "application/sdp", headers: Iterable[str] = ()
    ) -> str:
        return self.request("INVITE", body=body, content_type=content_type, headers=headers)

    def ack(self, *, branch_id: str | None = None, to_tag: str | None = None) -> str:
        """The ACK of our INVITE's 2xx (a new branch); of a non-2xx, pass the INVITE's branch and the
        response's To-tag (17.1.1.3)."""
        return self.request("ACK", branch_id=branch_id, to_tag=to_tag)

    def cancel(self) -> str:
        """CANCEL (9.1): the INVITE's branch, CSeq number and To (no tag)."""
        return self.request("CANCEL", branch_id=self.invite_branch, to_tag="")

    def learn(self, response: SipResponse) -> None:
        self.to_tag = response.to_tag


def offer(
    rtp_port: int,
    *,
    formats: str = "0 101",
    rtpmaps: Iterable[str] = ("0 PCMU/8000", "101 telephone-event/8000"),
    direction: str = "sendrecv",
    version: int = 1,
) -> str:
    lines = [
        "v=0",
        f"o=caller 4242 {version} IN IP4 {LOCAL}",
        "s=call",
        f"c=IN IP4 {LOCAL}",
        "t=0 0",
        f"m=audio {rtp_port} RTP/AVP {formats}",
        *(f"a=rtpmap:{m}" for m in rtpmaps),
        "a=fmtp:101 0-16",
        "a=ptime:20",
        f"a={direction}",
    ]
    return CRLF.join(lines) + CRLF


_REASONS = {
    100: "Trying",
    180: "Ringing",
    200: "OK",
    481: "Call/Transaction Does Not Exist",
    486: "Busy Here",
    487: "Request Terminated",
}


class RtpPeer(asyncio.DatagramProtocol):
    """The caller's RTP port: counts what arrives, sends what a test crafts."""

    def __init__(self) -> None:
        self.packets: list[tuple[bytes, tuple[str, int], float]] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0

    @classmethod
    async def open(cls) -> RtpPeer:
        peer = cls()
        loop = asyncio.get_running_loop()
        peer.transport, _ = await loop.create_datagram_endpoint(lambda: peer, local_addr=(LOCAL, 0))
        peer.port = int(peer.transport.get_extra_info("sockname")[1])
        return peer

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.packets.append((data, (str(addr[0]), int(addr[1])), time.monotonic()))

    def send(self, data: bytes, port: int) -> None:
        assert self.transport is not None
        self.transport.sendto(data, (LOCAL, port))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
