"""SIP over TCP: cutting the byte stream into messages (RFC 3261 18.3)."""

from __future__ import annotations

from parley.transports.sip.message import HEAD_END, LENGTH_LINE, MAX_MESSAGE_BYTES, content_length
from parley.transports.sip.uri import SipError


class StreamFramer:
    """Cuts a TCP byte stream into messages by Content-Length (RFC 3261 18.3: mandatory on streams).

    A SipError leaves the stream unframeable: the connection should be closed.
    """

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_message_bytes
        self._scanned = 0  # the head's end was not found before this offset
        self._total: int | None = None  # length of the message at the buffer's start, once known

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        messages: list[bytes] = []
        while True:
            if self._total is None:
                # RFC 3261 7.5 and RFC 5626 4.4.1: CRLFs between messages are keep-alives.
                blank = len(self._buffer) - len(self._buffer.lstrip(b"\r\n"))
                if blank:
                    del self._buffer[:blank]
                    self._scanned = 0
                end = HEAD_END.search(self._buffer, self._scanned)
                if end is None:
                    if len(self._buffer) > self._max:
                        raise SipError("no complete message head within 64 KiB", 513)
                    self._scanned = max(0, len(self._buffer) - 3)
                    return messages
                # Only the length is read here: a message malformed otherwise is still cut out whole, for
                # parse_message to reject (and the UA to answer) without losing the connection.
                head = bytes(self._buffer[: end.start()])
                length = content_length(
                    {m.group(1).strip().decode("latin-1") for m in LENGTH_LINE.finditer(head)}
                )
                if length is None:
                    raise SipError("missing Content-Length on a stream transport")
                self._total = end.end() + length
                if self._total > self._max:
                    raise SipError("message larger than 64 KiB", 513)
            if len(self._buffer) < self._total:
                return messages
            messages.append(bytes(self._buffer[: self._total]))
            del self._buffer[: self._total]
            self._total, self._scanned = None, 0
