"""SIP dialogs (RFC 3261 12): the peer-to-peer relationship a call's in-dialog requests travel in."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from parley.transports.sip.message import SipRequest, SipResponse, new_branch
from parley.transports.sip.transactions import Peer
from parley.transports.sip.uri import NameAddr, SipError, SipUri, bare_host, default_port

DialogId = tuple[str, str, str]  # Call-ID, local tag, remote tag


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: str  # our From/To value, without the tag
    remote_uri: str
    remote_target: str  # the peer's Contact URI: where in-dialog requests go (12.1)
    route_set: list[str]
    local_contact: str  # our Contact value
    via_host: str  # our sent-by for in-dialog requests
    transport: str
    fallback: Peer  # the address the dialog's signalling came from, used when the target is unusable
    local_seq: int = field(default_factory=lambda: random.randint(1, 2**31 - 1))
    remote_seq: int | None = None
    confirmed: bool = False

    @property
    def id(self) -> DialogId:
        return (self.call_id, self.local_tag, self.remote_tag)

    @classmethod
    def as_uas(
        cls, invite: SipRequest, local_tag: str, local_contact: str, via_host: str, source: Peer
    ) -> Dialog:
        """The dialog a 2xx to `invite` creates on our side (12.1.1)."""
        contact = invite.headers.get_all("Contact")
        target = str(NameAddr.parse(contact[0]).uri) if contact else invite.uri
        return cls(
            call_id=invite.call_id,
            local_tag=local_tag,
            remote_tag=invite.from_tag or "",
            local_uri=_without_tag(invite.required("To")),
            remote_uri=_without_tag(invite.required("From")),
            remote_target=target,
            route_set=invite.headers.get_all("Record-Route"),
            local_contact=local_contact,
            via_host=via_host,
            transport=source.transport,
            fallback=source,
            local_seq=random.randint(1, 2**31 - 1),
            remote_seq=invite.cseq[0],
        )

    @classmethod
    def as_uac(
        cls, invite: SipRequest, response: SipResponse, local_contact: str, via_host: str, peer: Peer
    ) -> Dialog:
        """The dialog a 2xx to our `invite` creates (12.1.2): the route set is Record-Route reversed."""
        contact = response.headers.get_all("Contact")
        target = str(NameAddr.parse(contact[0]).uri) if contact else invite.uri
        return cls(
            call_id=invite.call_id,
            local_tag=invite.from_tag or "",
            remote_tag=response.to_tag or "",
            local_uri=_without_tag(invite.required("From")),
            remote_uri=_without_tag(response.required("To")),
            remote_target=target,
            route_set=list(reversed(response.headers.get_all("Record-Route"))),
            local_contact=local_contact,
            via_host=via_host,
            transport=peer.transport,
            fallback=peer,
            local_seq=invite.cseq[0],
            confirmed=True,
        )

    def accepts(self, request: SipRequest) -> bool:
        """12.2.2: a request whose CSeq is lower than the last one is out of order (answered 500)."""
        number = request.cseq[0]
        if request.method in ("ACK", "CANCEL"):
            return True
        if self.remote_seq is not None and number < self.remote_seq:
            return False
        self.remote_seq = number
        return True

    def next_hop(self) -> Peer:
        """Where in-dialog requests go: the first route (loose routing), else the remote target."""
        uri_text = str(NameAddr.parse(self.route_set[0]).uri) if self.route_set else self.remote_target
        try:
            uri = SipUri.parse(uri_text)
        except SipError:
            return self.fallback
        if uri.scheme == "tel" or not uri.host:
            return self.fallback
        transport = "TLS" if uri.scheme == "sips" else uri.params.get("transport", self.transport).upper()
        host = bare_host(uri.host)
        return Peer(transport, host, uri.port or default_port(transport), name=host)

    def request(self, method: str, *, body: bytes = b"", content_type: str | None = None) -> SipRequest:
        """A new in-dialog request (12.2.1.1) with the next local CSeq."""
        if method != "ACK":
            self.local_seq += 1
        return self._build(method, self.local_seq, body, content_type)

    def ack(self, invite_cseq: int, *, body: bytes = b"", content_type: str | None = None) -> SipRequest:
        """The ACK of a 2xx (13.2.2.4): a transaction of its own, with the INVITE's CSeq number."""
        return self._build("ACK", invite_cseq, body, content_type)

    def _build(self, method: str, cseq: int, body: bytes, content_type: str | None) -> SipRequest:
        request = SipRequest(method, self.remote_target)
        request.headers.add("Via", f"SIP/2.0/{self.transport} {self.via_host};branch={new_branch()};rport")
        request.headers.add("Max-Forwards", "70")
        request.headers.add("From", f"{self.local_uri};tag={self.local_tag}")
        request.headers.add("To", f"{self.remote_uri};tag={self.remote_tag}")
        request.headers.add("Call-ID", self.call_id)
        request.headers.add("CSeq", f"{cseq} {method}")
        for route in self.route_set:
            request.headers.add("Route", route)
        if method in ("INVITE", "ACK") or method == "UPDATE":
            request.headers.add("Contact", self.local_contact)
        if content_type is not None:
            request.headers.add("Content-Type", content_type)
        request.body = body
        return request


def _without_tag(value: str) -> str:
    addr = NameAddr.parse(value)
    addr.params.pop("tag", None)
    return str(addr)
