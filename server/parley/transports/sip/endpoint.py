"""The SIP sockets: UDP and TCP on one address (RFC 3261 18). Bytes in, messages out, and back.

Every datagram and every framed TCP message is parsed here; whatever cannot be parsed is counted and,
when enough of it was readable to answer (a request with a Via), answered 400 with the parser's reason.
Nothing a peer sends can raise out of here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from parley import metrics
from parley.log import event
from parley.transports.sip.framing import StreamFramer
from parley.transports.sip.message import (
    SipRequest,
    SipResponse,
    make_response,
    new_tag,
    parse_message,
    response_destination,
)
from parley.transports.sip.transactions import Peer
from parley.transports.sip.uri import SipError, bare_host

log = logging.getLogger(__name__)

Handler = Callable[[SipRequest | SipResponse, Peer], None]
TCP_IDLE_S = 300.0  # a TCP connection with no message for this long is closed (RFC 5626 keeps alive)
MAX_TCP_CONNECTIONS = 1024
PORT_ATTEMPTS = 20  # port 0: free UDP ports tried until TCP is free at the same number


class SipEndpoint:
    def __init__(self, on_message: Handler) -> None:
        self._on_message = on_message
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp_server: asyncio.Server | None = None
        self._connections: dict[tuple[str, int], asyncio.StreamWriter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.host = ""
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        """Listen on UDP and TCP at one port; port 0 takes a free one for both."""
        loop = asyncio.get_running_loop()
        for attempt in range(PORT_ATTEMPTS):
            self._udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(host, port)
            )
            sockname = self._udp.get_extra_info("sockname")
            self.host, self.port = host, int(sockname[1])
            try:
                self._tcp_server = await asyncio.start_server(self._serve_connection, host, self.port)
                return
            except OSError as exc:
                # The port the kernel chose for UDP may be a TCP connection's local port already.
                self._udp.close()
                self._udp = None
                if port != 0 or exc.errno != errno.EADDRINUSE or attempt == PORT_ATTEMPTS - 1:
                    raise

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp_server is not None:
            self._tcp_server.close()
        for writer in list(self._connections.values()):
            writer.close()
        if self._tasks:
            # Let the connection readers see their end: on Python 3.11 a server connection task that
            # is cancelled instead makes asyncio log "Exception in callback" (fixed in 3.12).
            await asyncio.wait(list(self._tasks), timeout=1.0)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._tcp_server is not None:
            await self._tcp_server.wait_closed()

    # receiving

    def received(self, data: bytes, peer: Peer) -> None:
        if not data.strip(b"\r\n"):
            return  # RFC 5626 keep-alive
        try:
            message = parse_message(data)
        except SipError as exc:
            self._malformed(exc, peer)
            return
        try:
            self._on_message(message, peer)
        except SipError as exc:  # a header the handler needed turned out malformed
            self._malformed(exc, peer, message if isinstance(message, SipRequest) else None)
        except Exception:
            log.exception("sip_handler_failed", extra={"peer": f"{peer.host}:{peer.port}"})

    def _malformed(self, exc: SipError, peer: Peer, request: SipRequest | None = None) -> None:
        metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="malformed").inc()
        event(log, "sip_malformed", logging.DEBUG, peer=f"{peer.host}:{peer.port}", error=str(exc))
        request = request or exc.request
        if request is None or request.method == "ACK":
            return  # nothing to answer to (RFC 3261 18.3: discard)
        with contextlib.suppress(SipError):
            reason = str(exc).replace("\r", " ").replace("\n", " ")[:120]
            self.send(make_response(request, exc.status, reason, to_tag=new_tag()), peer)  # 8.2.6.2

    # sending

    def send(self, message: SipRequest | SipResponse, peer: Peer) -> None:
        """Send a message (never blocks, never raises for network trouble: SIP retransmits)."""
        data = message.to_bytes()
        if peer.transport == "UDP":
            if self._udp is not None:
                self._udp.sendto(data, (peer.host, peer.port))
            return
        writer = self._connections.get((peer.host, peer.port))
        if writer is not None and not writer.is_closing():
            writer.write(data)
        elif isinstance(message, SipResponse):
            # 18.2.2: the connection is gone; a response goes to the Via's address on a new one.
            host, port = response_destination(message.top_via, "TCP")
            self._spawn(self._connect_and_send(Peer("TCP", host, port), data))
        else:
            self._spawn(self._connect_and_send(peer, data))

    async def _connect_and_send(self, peer: Peer, data: bytes) -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(peer.host, peer.port), 5.0)
        except (OSError, TimeoutError) as exc:
            event(log, "sip_connect_failed", logging.WARNING, peer=f"{peer.host}:{peer.port}", error=str(exc))
            return
        writer.write(data)
        await self._read_connection(reader, writer, Peer("TCP", peer.host, peer.port))

    # TCP

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = writer.get_extra_info("peername")[:2]
        if len(self._connections) >= MAX_TCP_CONNECTIONS:
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await self._read_connection(reader, writer, Peer("TCP", bare_host(host), int(port)))

    async def _read_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        key = (peer.host, peer.port)
        self._connections[key] = writer
        framer = StreamFramer()
        try:
            while True:
                data = await asyncio.wait_for(reader.read(65536), TCP_IDLE_S)
                if not data:
                    return
                try:
                    messages = framer.feed(data)
                except SipError as exc:
                    self._malformed(exc, peer)
                    return  # the stream cannot be framed any more
                for message in messages:
                    self.received(message, peer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            return
        finally:
            if self._connections.get(key) is writer:
                del self._connections[key]
            writer.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, endpoint: SipEndpoint) -> None:
        self.endpoint = endpoint

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.endpoint.received(data, Peer("UDP", str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # An ICMP port unreachable for something we sent: the peer is gone; its transactions time out.
        event(log, "sip_udp_error", logging.DEBUG, error=str(exc))
