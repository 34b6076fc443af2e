"""SIP transactions (RFC 3261 17, with RFC 6026's Accepted state): retransmissions, matching, timers.

Server transactions absorb retransmitted requests by sending the last response again, retransmit a
final non-2xx INVITE response until the ACK (Timer G, H, I) and keep answering a retransmitted request
for a while after a non-INVITE final response (Timer J). Client transactions retransmit their request
over UDP (Timer A, E) until a response, give up with a 408 (Timer B, F), and ACK a non-2xx INVITE
response (17.1.1.3). A 2xx to an INVITE is the dialog's business in both directions (13.3.1.4, 13.2.2.4):
the UAS retransmits it until the ACK, the UAC ACKs every copy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from parley.ratelimit import source_key
from parley.transports.sip.message import SipRequest, SipResponse, make_response, new_tag
from parley.transports.sip.uri import SipError

log = logging.getLogger(__name__)

T1 = 0.5  # RTT estimate (17.1.1.1)
T2 = 4.0  # longest retransmission interval for non-INVITE requests and INVITE responses
T4 = 5.0  # longest time a message stays in the network
TIMEOUT = 64 * T1  # Timers B, F, H, J: 32 s


@dataclass(frozen=True)
class Peer:
    """Where a message came from, or goes: the transport (UDP, TCP or TLS) and the address. `name`, for
    a peer we dial over TLS, is the host its certificate must name (the URI's, before resolution)."""

    transport: str
    host: str
    port: int
    name: str = field(default="", compare=False)

    @property
    def reliable(self) -> bool:
        return self.transport != "UDP"


Send = Callable[[SipRequest | SipResponse, Peer], None]
Key = tuple[str, str, str]


def server_key(request: SipRequest, method: str | None = None) -> Key:
    """Matches a request to its server transaction (17.2.3): branch, sent-by and method; an ACK or a
    CANCEL looks for the INVITE it belongs to by passing method="INVITE"."""
    via = request.top_via
    branch = via.branch or ""
    sent_by = f"{via.host}:{via.port or ''}"
    if not branch.startswith("z9hG4bK"):
        # An RFC 2543 peer: no unique branch, so the dialog and sequence identify the transaction.
        branch = f"{request.call_id}|{request.from_tag}|{request.cseq[0]}|{branch}"
    return branch, sent_by, method or request.method


class _Timed:
    """A transaction's timers (RFC 3261 17's Timers A-K), all cancelled together."""

    _timers: list[asyncio.TimerHandle]

    def _later(self, delay: float, callback: Callable[..., None], *args: object) -> None:
        self._timers.append(asyncio.get_running_loop().call_later(delay, callback, *args))

    def _cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()


class ServerTransaction(_Timed):
    def __init__(self, layer: TransactionLayer, request: SipRequest, peer: Peer) -> None:
        self.layer = layer
        self.request = request
        self.peer = peer
        self.key = server_key(request)
        self.is_invite = request.method == "INVITE"
        # 8.2.6.2: every response but a 100 to a request without a To-tag gets one; the same for all the
        # responses of this transaction (a 180 and the 200 or 487 after it, and the CANCEL's 200, 9.2).
        self.local_tag = new_tag()
        self.last_response: SipResponse | None = None
        self.state = "trying"  # trying | proceeding | accepted | completed | confirmed | terminated
        self._timers: list[asyncio.TimerHandle] = []

    @property
    def final_sent(self) -> bool:
        return self.last_response is not None and self.last_response.status >= 200

    def respond(
        self,
        status: int,
        reason: str | None = None,
        *,
        to_tag: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
        content_type: str | None = None,
    ) -> SipResponse | None:
        """Send a response (None, and nothing sent, once a final one went out). Unless `to_tag` says
        otherwise, a response but 100 carries the transaction's To-tag when the request had none."""
        if self.final_sent or self.state == "terminated":
            return None
        if to_tag is None and status > 100:
            to_tag = self.local_tag
        response = make_response(
            self.request, status, reason, to_tag=to_tag, headers=headers, body=body, content_type=content_type
        )
        self.send_response(response)
        return response

    def send_response(self, response: SipResponse) -> None:
        self.last_response = response
        self.layer.send(response, self.peer)
        if response.status < 200:
            self.state = "proceeding"
        elif self.is_invite and response.status < 300:
            # RFC 6026: the transaction absorbs retransmitted INVITEs; the dialog retransmits the 2xx.
            self.state = "accepted"
            self._later(TIMEOUT, self.terminate)
        elif self.is_invite:
            self.state = "completed"
            if not self.peer.reliable:
                self._later(T1, self._retransmit_final, T1)  # Timer G
            self._later(TIMEOUT, self.terminate)  # Timer H: no ACK came
        else:
            self.state = "completed"
            self._later(0 if self.peer.reliable else TIMEOUT, self.terminate)  # Timer J

    def on_retransmission(self) -> None:
        if self.last_response is not None and self.state in ("proceeding", "completed", "accepted"):
            self.layer.send(self.last_response, self.peer)

    def on_ack(self) -> None:
        """The ACK of a non-2xx final response: stop retransmitting, absorb ACK copies (Timer I)."""
        if self.state == "completed":
            self.state = "confirmed"
            self._cancel_timers()
            self._later(0 if self.peer.reliable else T4, self.terminate)

    def _retransmit_final(self, interval: float) -> None:
        if self.state == "completed" and self.last_response is not None:
            self.layer.send(self.last_response, self.peer)
            self._later(min(2 * interval, T2), self._retransmit_final, min(2 * interval, T2))

    def terminate(self) -> None:
        self.state = "terminated"
        self._cancel_timers()
        self.layer.server_ended(self)


class ClientTransaction(_Timed):
    """One request we sent, until its final response (or a 408 made up at Timer B/F)."""

    def __init__(
        self,
        layer: TransactionLayer,
        request: SipRequest,
        peer: Peer,
        on_provisional: Callable[[SipResponse], None] | None = None,
    ) -> None:
        self.layer = layer
        self.request = request
        self.peer = peer
        self.branch = request.branch or ""
        self.is_invite = request.method == "INVITE"
        self.final: asyncio.Future[SipResponse] = asyncio.get_running_loop().create_future()
        self.ack: SipRequest | None = None  # sent again for every copy of the final response
        self._on_provisional = on_provisional
        self._timers: list[asyncio.TimerHandle] = []
        self._proceeding = False

    def start(self) -> None:
        self.layer.send(self.request, self.peer)
        if not self.peer.reliable:
            self._later(T1, self._retransmit, T1)  # Timer A / E
        self._later(TIMEOUT, self._timeout)  # Timer B / F

    def on_response(self, response: SipResponse) -> None:
        if response.status < 200:
            self._proceeding = True
            if not self.final.done() and self._on_provisional is not None:
                self._on_provisional(response)
            return
        if self.final.done():
            if self.ack is not None:  # a retransmitted final response: our ACK was lost
                self.layer.send(self.ack, self.peer)
            return
        self._cancel_timers()
        if self.is_invite and response.status >= 300:
            self.ack = self._ack_for(response)
            self.layer.send(self.ack, self.peer)
        self.final.set_result(response)
        # Stay a while to absorb copies of the final response (Timer D / K; 2xx copies for RFC 6026).
        linger = TIMEOUT if self.is_invite and not self.peer.reliable else (0 if self.peer.reliable else T4)
        self._later(linger, self.terminate)

    def _ack_for(self, response: SipResponse) -> SipRequest:
        """17.1.1.3: the ACK of a non-2xx response is part of the INVITE's transaction."""
        ack = SipRequest("ACK", self.request.uri)
        ack.headers.add("Via", self.request.headers.get_all("Via")[0])
        for name in ("Route",):
            for value in self.request.headers.get_all(name):
                ack.headers.add(name, value)
        ack.headers.add("Max-Forwards", "70")
        ack.headers.add("From", self.request.required("From"))
        ack.headers.add("To", response.required("To"))
        ack.headers.add("Call-ID", self.request.call_id)
        ack.headers.add("CSeq", f"{self.request.cseq[0]} ACK")
        return ack

    def _retransmit(self, interval: float) -> None:
        if self.final.done() or (self.is_invite and self._proceeding):
            return
        self.layer.send(self.request, self.peer)
        if self.is_invite:
            following = 2 * interval  # Timer A doubles without a cap (17.1.1.2)
        elif self._proceeding:
            following = T2  # 17.1.2.2: in Proceeding, retransmit every T2
        else:
            following = min(2 * interval, T2)  # Timer E
        self._later(following, self._retransmit, following)

    def _timeout(self) -> None:
        if not self.final.done():
            timeout = make_response(self.request, 408, "Request Timeout")
            self.final.set_result(timeout)
        self.terminate()

    def terminate(self) -> None:
        self._cancel_timers()
        if not self.final.done():
            self.final.cancel()
        self.layer.client_ended(self)


class TransactionsFull(Exception):
    """No room for another server transaction: from this source, or at all."""


class TransactionLayer:
    """The transactions of one user agent: which incoming message belongs to which transaction.

    Each server transaction keeps its request and last response for up to Timer H/J (32 s over UDP),
    so their number is capped per source and in all: a peer sending requests with new branches cannot
    grow the table without bound.
    """

    def __init__(self, send: Send, *, max_server: int = 2048, max_server_per_source: int = 0) -> None:
        self.send = send
        self.server: dict[Key, ServerTransaction] = {}
        self.client: dict[tuple[str, str], ClientTransaction] = {}
        self.max_server = max_server
        self.max_server_per_source = max_server_per_source  # 0: no cap per source
        self._per_source: dict[str, int] = {}

    def absorb_ack(self, request: SipRequest) -> None:
        """The ACK of a non-2xx final response ends its INVITE transaction's retransmissions (17.2.1);
        the ACK of a 2xx is the dialog's business."""
        invite = self.server.get(server_key(request, "INVITE"))
        if invite is not None and invite.state in ("completed", "confirmed"):
            invite.on_ack()

    def retransmission(self, request: SipRequest) -> bool:
        """True when `request` belongs to a server transaction already (17.2.3), which answered it."""
        existing = self.server.get(server_key(request))
        if existing is None:
            return False
        existing.on_retransmission()
        return True

    def new_server(self, request: SipRequest, peer: Peer, *, in_dialog: bool = False) -> ServerTransaction:
        """The server transaction of a new request; TransactionsFull when the caps leave no room.

        A request in a call we hold (`in_dialog`) has a quarter more room in all: a flood of strangers
        filling the table must not keep the calls in progress from hanging up.
        """
        source = source_key(peer.host)
        if len(self.server) >= self.max_server + (self.max_server // 4 if in_dialog else 0):
            raise TransactionsFull("too many SIP transactions in progress")
        held = self._per_source.get(source, 0)
        if self.max_server_per_source and held >= self.max_server_per_source:
            raise TransactionsFull("too many SIP transactions in progress from this address")
        tx = ServerTransaction(self, request, peer)
        self.server[tx.key] = tx
        self._per_source[source] = held + 1
        return tx

    def server_transaction(self, request: SipRequest, peer: Peer) -> ServerTransaction | None:
        """The new transaction for a request; None when it was a retransmission or an ACK (a peer
        that needs no admission of its own, such as the benchmark's caller)."""
        if request.method == "ACK":
            self.absorb_ack(request)
            return None
        if self.retransmission(request):
            return None
        return self.new_server(request, peer)

    def invite_transaction(self, request: SipRequest) -> ServerTransaction | None:
        """The INVITE transaction a CANCEL names (9.2: same branch and sent-by, method INVITE)."""
        return self.server.get(server_key(request, "INVITE"))

    def server_ended(self, tx: ServerTransaction) -> None:
        if self.server.get(tx.key) is tx:
            del self.server[tx.key]
            source = source_key(tx.peer.host)
            held = self._per_source.get(source, 0) - 1
            if held > 0:
                self._per_source[source] = held
            else:
                self._per_source.pop(source, None)

    def start_client(
        self,
        request: SipRequest,
        peer: Peer,
        on_provisional: Callable[[SipResponse], None] | None = None,
    ) -> ClientTransaction:
        tx = ClientTransaction(self, request, peer, on_provisional)
        self.client[(tx.branch, request.method)] = tx
        tx.start()
        return tx

    async def request(self, request: SipRequest, peer: Peer) -> SipResponse:
        """Send a non-INVITE request and wait for its final response (408 when none came)."""
        return await self.start_client(request, peer).final

    def on_response(self, response: SipResponse) -> bool:
        """Hand a response to its client transaction; False when none matches (17.1.3)."""
        try:
            key = (response.branch or "", response.cseq[1])
        except SipError:
            return False
        tx = self.client.get(key)
        if tx is None:
            return False
        tx.on_response(response)
        return True

    def client_ended(self, tx: ClientTransaction) -> None:
        key = (tx.branch, tx.request.method)
        if self.client.get(key) is tx:
            del self.client[key]

    def close(self) -> None:
        for server in list(self.server.values()):
            server.terminate()
        for client in list(self.client.values()):
            client.terminate()
