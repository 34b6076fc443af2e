"""The SIP sockets: UDP and TCP on one address, TLS on another (RFC 3261 18, 26.2). Bytes in, messages
out, and back.

Every datagram and every framed stream message is parsed here; whatever cannot be parsed is counted and,
when enough of it was readable to answer (a request with a Via), answered 400 with the parser's reason.
Nothing a peer sends can raise out of here.

Every datagram leaves through one guarded path: its destination is an IP literal (a name is resolved
off the event loop, and only for requests we send), and no error sending it reaches asyncio, which
closes a datagram socket for good on anything but an OSError. Stream connections peers open are
capped per source and in all, refused at accept when the source is not allowed, and closed once no
complete message came for the idle time (CRLF keep-alives do not count: they cost a peer nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from parley import metrics
from parley.log import event
from parley.ratelimit import source_key
from parley.transports.sip.framing import StreamFramer
from parley.transports.sip.message import (
    SipRequest,
    SipResponse,
    ip_literal,
    make_response,
    new_tag,
    parse_message,
    response_destination,
)
from parley.transports.sip.transactions import Peer
from parley.transports.sip.uri import SipError, bare_host

log = logging.getLogger(__name__)

Handler = Callable[[SipRequest | SipResponse, Peer], None]
PORT_ATTEMPTS = 20  # port 0: free UDP ports tried until TCP is free at the same number
CONNECT_TIMEOUT_S = 5.0
MAX_LOOKUPS = 16  # names resolved at once for requests we send; past it a send fails (counted)
MAX_UDP_BUFFER_BYTES = 1 << 20
ConnectionKey = tuple[str, str, int]  # transport, host, port


@dataclass(frozen=True)
class StreamLimits:
    """Bounds on the TCP and TLS connections peers open to us."""

    max_connections: int = 1024
    max_per_source: int = 32  # per IPv4 address or IPv6 /64
    idle_s: float = 300.0  # no complete message for this long: closed
    handshake_s: float = 10.0  # a TLS handshake not done within this: closed


def _accept_any(host: str) -> bool:
    return True


def _keep_none(peer: Peer) -> bool:
    return False


class SipEndpoint:
    def __init__(
        self,
        on_message: Handler,
        *,
        limits: StreamLimits = StreamLimits(),
        accepts: Callable[[str], bool] = _accept_any,
        keeps_open: Callable[[Peer], bool] = _keep_none,
        tls_server: ssl.SSLContext | None = None,
        tls_client: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        """`accepts(host)`: whether a source may open a connection; `keeps_open(peer)`: whether an idle
        connection still carries something (a dialog) and stays; `tls_server` listens for TLS when
        `start` gets a TLS address; `tls_client` gives the context for outbound TLS connections."""
        self._on_message = on_message
        self.limits = limits
        self._accepts = accepts
        self._keeps_open = keeps_open
        self._tls_server = tls_server
        self._tls_client = tls_client
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp_server: asyncio.Server | None = None
        self._tls_listener: asyncio.Server | None = None
        self._connections: dict[ConnectionKey, asyncio.StreamWriter] = {}
        self._accepted = 0
        self._per_source: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._lookups = 0
        self._resolver = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sip-resolve")
        self.host = ""
        self.port = 0
        self.tls_port = 0

    async def start(self, host: str, port: int, tls: tuple[str, int] | None = None) -> None:
        """Listen on UDP and TCP at one port (port 0 takes a free one for both), and for TLS at `tls`."""
        loop = asyncio.get_running_loop()
        for attempt in range(PORT_ATTEMPTS):
            self._udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(host, port)
            )
            sockname = self._udp.get_extra_info("sockname")
            self.host, self.port = host, int(sockname[1])
            try:
                self._tcp_server = await asyncio.start_server(self._serve_tcp, host, self.port)
                break
            except OSError as exc:
                # The port the kernel chose for UDP may be a TCP connection's local port already.
                self._udp.close()
                self._udp = None
                if port != 0 or exc.errno != errno.EADDRINUSE or attempt == PORT_ATTEMPTS - 1:
                    raise
        if tls is not None:
            if self._tls_server is None:
                raise ValueError("a TLS address needs a server context")
            self._tls_listener = await asyncio.start_server(self._serve_tls, tls[0], tls[1])
            self.tls_port = int(self._tls_listener.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        for server in (self._tcp_server, self._tls_listener):
            if server is not None:
                server.close()
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
        for server in (self._tcp_server, self._tls_listener):
            if server is not None:
                await server.wait_closed()
        self._resolver.shutdown(wait=False, cancel_futures=True)

    def has_connection(self, peer: Peer) -> bool:
        writer = self._connections.get((peer.transport, peer.host, peer.port))
        return writer is not None and not writer.is_closing()

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
        if request is None and isinstance(exc.request, SipRequest):
            request = exc.request
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
            self._send_datagram(data, peer, resolve=isinstance(message, SipRequest))
            return
        writer = self._connections.get((peer.transport, peer.host, peer.port))
        if writer is not None and not writer.is_closing():
            writer.write(data)
        elif isinstance(message, SipResponse):
            # 18.2.2: the connection is gone; a response goes to the Via's received address on a new one.
            via = message.top_via
            destination = response_destination(via, peer.transport)
            if destination is None:
                self._send_failed(peer, "the connection is gone and the Via names no address")
                return
            self._spawn(self._connect_and_send(Peer(peer.transport, *destination), data, bare_host(via.host)))
        else:
            self._spawn(self._connect_and_send(peer, data))

    def _send_datagram(self, data: bytes, peer: Peer, *, resolve: bool) -> None:
        address = ip_literal(peer.host)
        if address is not None:
            self._sendto(data, address, peer.port)
        elif resolve and self._lookups < MAX_LOOKUPS:
            self._spawn(self._resolve_and_send(data, peer))
        else:
            self._send_failed(peer, "not an IP address")

    async def _resolve_and_send(self, data: bytes, peer: Peer) -> None:
        try:
            address = await self._resolve(peer.host, peer.port, socket.SOCK_DGRAM)
        except OSError as exc:
            self._send_failed(peer, f"cannot resolve: {exc}")
            return
        self._sendto(data, address, peer.port)

    def _sendto(self, data: bytes, address: str, port: int) -> None:
        """The one way a datagram leaves: to an IP literal, with every error counted here."""
        udp = self._udp
        if udp is None or udp.is_closing():
            return
        destination = _datagram_destination(udp, address, port)
        if destination is None:
            self._send_failed(Peer("UDP", address, port), "no route for that address family or port")
            return
        # asyncio queues datagrams without bound while the kernel's buffer is full.
        if isinstance(udp, asyncio.WriteTransport) and udp.get_write_buffer_size() > MAX_UDP_BUFFER_BYTES:
            self._send_failed(Peer("UDP", address, port), "send buffer full")
            return
        try:
            udp.sendto(data, destination)
        except Exception as exc:  # whatever it is, it must not reach asyncio (which closes the socket)
            self._send_failed(Peer("UDP", address, port), repr(exc))

    def _send_failed(self, peer: Peer, why: str) -> None:
        metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="send_failed").inc()
        event(log, "sip_send_failed", logging.DEBUG, peer=f"{peer.host[:64]}:{peer.port}", error=why[:200])

    async def _resolve(self, host: str, port: int, kind: socket.SocketKind) -> str:
        """A name's first address, looked up on threads of our own: a slow resolver never stalls the
        loop, nor takes the threads the rest of the service shares."""
        if self._lookups >= MAX_LOOKUPS:
            raise OSError(errno.EAGAIN, "too many names being resolved")
        self._lookups += 1
        try:
            infos = await asyncio.get_running_loop().run_in_executor(
                self._resolver, socket.getaddrinfo, host, port, 0, kind
            )
        finally:
            self._lookups -= 1
        if not infos:
            raise OSError(errno.ENOENT, "no address")
        return str(infos[0][4][0])

    async def _connect_and_send(self, peer: Peer, data: bytes, server_name: str | None = None) -> None:
        context = None
        if peer.transport == "TLS":
            if self._tls_client is None:
                self._send_failed(peer, "no TLS client context")
                return
            context = self._tls_client()
        try:
            address = ip_literal(peer.host) or await self._resolve(peer.host, peer.port, socket.SOCK_STREAM)
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    address,
                    peer.port,
                    ssl=context,
                    server_hostname=(server_name or peer.name or peer.host) if context is not None else None,
                ),
                CONNECT_TIMEOUT_S,
            )
        except (OSError, TimeoutError) as exc:
            event(log, "sip_connect_failed", logging.WARNING, peer=f"{peer.host}:{peer.port}", error=str(exc))
            return
        writer.write(data)
        await self._read_connection(reader, writer, peer)

    # TCP and TLS

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, "TCP")

    async def _serve_tls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, "TLS")

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transport: str
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        host, port = writer.get_extra_info("peername")[:2]
        peer = Peer(transport, ip_literal(str(host)) or bare_host(str(host)), int(port))
        source = source_key(peer.host)
        refusal = self._refusal(peer.host, source)
        if refusal is not None:
            metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason=refusal).inc()
            event(log, "sip_connection_refused", logging.DEBUG, peer=f"{peer.host}:{peer.port}", why=refusal)
            writer.close()
            return
        self._accepted += 1
        self._per_source[source] = self._per_source.get(source, 0) + 1
        try:
            if transport == "TLS" and not await self._handshake(writer, peer):
                return
            await self._read_connection(reader, writer, peer)
        finally:
            writer.close()
            self._accepted -= 1
            held = self._per_source.get(source, 0) - 1
            if held > 0:
                self._per_source[source] = held
            else:
                self._per_source.pop(source, None)

    def _refusal(self, host: str, source: str) -> str | None:
        """Why a new connection from `host` is closed at once (a metric reason), or None to take it."""
        if not self._accepts(host):
            return "forbidden"
        if self._accepted >= self.limits.max_connections:
            return "connections_full"
        if self._per_source.get(source, 0) >= self.limits.max_per_source:
            return "connections_full"
        return None

    async def _handshake(self, writer: asyncio.StreamWriter, peer: Peer) -> bool:
        # TLS starts after the checks above: a refused source costs no handshake.
        assert self._tls_server is not None
        try:
            await writer.start_tls(self._tls_server, ssl_handshake_timeout=self.limits.handshake_s)
        except (OSError, TimeoutError) as exc:
            metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="sip", reason="tls_failed").inc()
            event(log, "sip_tls_failed", logging.DEBUG, peer=f"{peer.host}:{peer.port}", error=str(exc)[:200])
            return False
        return True

    async def _read_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        key = (peer.transport, peer.host, peer.port)
        self._connections[key] = writer
        framer = StreamFramer()
        loop = asyncio.get_running_loop()
        idle_s = self.limits.idle_s
        deadline = loop.time() + idle_s
        try:
            while True:
                try:
                    data = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
                except TimeoutError:
                    if self._keeps_open(peer):
                        deadline = loop.time() + idle_s
                        continue
                    event(log, "sip_connection_idle", logging.DEBUG, peer=f"{peer.host}:{peer.port}")
                    return
                if not data:
                    return
                try:
                    messages = framer.feed(data)
                except SipError as exc:
                    self._malformed(exc, peer)
                    return  # the stream cannot be framed any more
                if messages:
                    deadline = loop.time() + idle_s
                for message in messages:
                    self.received(message, peer)
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            if self._connections.get(key) is writer:
                del self._connections[key]
            writer.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _datagram_destination(udp: asyncio.DatagramTransport, address: str, port: int) -> tuple[str, int] | None:
    """`(address, port)` as the socket's family takes it; None when it cannot (IPv6 on an IPv4 socket)."""
    if not 0 < port < 65536:
        return None
    sock = udp.get_extra_info("socket")
    ipv6 = ":" in address
    if sock is not None and sock.family == socket.AF_INET6 and not ipv6:
        return f"::ffff:{address}", port
    if sock is not None and sock.family == socket.AF_INET and ipv6:
        return None
    return address, port


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, endpoint: SipEndpoint) -> None:
        self.endpoint = endpoint

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.endpoint.received(data, Peer("UDP", str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # An ICMP port unreachable for something we sent: the peer is gone; its transactions time out.
        event(log, "sip_udp_error", logging.DEBUG, error=str(exc))
