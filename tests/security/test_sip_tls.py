"""SIP over TLS (issue 42, item 7, the transport half): calls whose signalling a trunk on the internet
carries encrypted, and the setting that refuses any other.

The service gets a self-signed certificate for 127.0.0.1 and localhost (conftest.py's `certificate`); the
caller is Python's ssl client trusting exactly that certificate (tls_peer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from parley.app import create_app
from parley.bench.service import free_port
from parley.config import Settings, SettingsError
from tests.doubles import make_engines
from tests.security.conftest import LOCAL, Start, dialled_over_tls, rtp_packet, sdp_audio_port
from tests.security.tls_peer import Certificate, callee, start_tls, tls_wire
from tests.sip_wire import SipWire, branch, offer, text, token


def options(wire: SipWire, target: str, call_id: str) -> str:
    return text(
        [
            f"OPTIONS {target} SIP/2.0",
            f"Via: {wire.via(branch())}",
            "Max-Forwards: 70",
            f"From: <sip:check@{wire.here}>;tag={token()}",
            f"To: <{target}>",
            f"Call-ID: {call_id}",
            "CSeq: 1 OPTIONS",
        ]
    )


@pytest.mark.parametrize(
    ("target", "contact"),
    [
        # RFC 3261 12.1.1: a SIPS Request-URI gets a SIPS Contact; a sip: one over TLS gets
        # transport=tls (what baresip dials and can route to).
        ("sips:agent@{host}:{port}", "<sips:parley@{host}:{port}>"),
        ("sip:agent@{host}:{port};transport=tls", "<sip:parley@{host}:{port};transport=tls>"),
    ],
)
async def test_options_and_a_call_over_tls(
    start: Start, certificate: Certificate, target: str, contact: str
) -> None:
    service, tls_port = await start_tls(start, certificate)
    wire = await tls_wire(service, tls_port, certificate)
    target = target.format(host=LOCAL, port=tls_port)
    call_id = f"{token()}@tls"
    wire.send(options(wire, target, call_id))
    assert (await wire.final(method="OPTIONS", call_id=call_id)).status == 200

    rtp = await service.rtp()
    d = service.dialogue(wire)
    d.target = target
    wire.send(d.invite(offer(rtp.port)))
    ok = await wire.response(200, call_id=d.call_id, timeout=10.0)
    assert ok.top_via.transport == "TLS"
    assert ok.headers.get("Contact") == contact.format(host=LOCAL, port=tls_port)
    d.learn(ok)
    wire.send(d.ack())
    for sequence in range(10):
        rtp.send(rtp_packet(sequence), sdp_audio_port(ok.body))
    deadline = time.monotonic() + 5.0
    while not rtp.packets:
        assert time.monotonic() < deadline, "no RTP from the agent within 5 s"
        await asyncio.sleep(0.02)
    wire.send(d.request("BYE"))
    assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200
    await service.still_serves()


async def test_the_agent_hangs_up_over_the_callers_own_tls_connection(
    start: Start, certificate: Certificate
) -> None:
    # The caller has no certificate and may sit behind NAT: its Contact cannot be reached over TLS,
    # the connection its INVITE came on can (RFC 5923).
    service, tls_port = await start_tls(start, certificate)
    wire = await tls_wire(service, tls_port, certificate)
    rtp = await service.rtp()
    d = service.dialogue(wire)
    d.target = f"sips:agent@{LOCAL}:{tls_port}"
    wire.send(d.invite(offer(rtp.port)))
    ok = await wire.response(200, call_id=d.call_id, timeout=10.0)
    d.learn(ok)
    wire.send(d.ack())
    call_id = ok.headers.get("X-Parley-Call-Id")
    token_headers = service.auth
    response = await service.client.delete(f"/api/calls/{call_id}", headers=token_headers)
    assert response.status == 200
    bye = await wire.request("BYE", call_id=d.call_id)
    assert bye.top_via.transport == "TLS"
    await service.still_serves()


async def test_a_plain_invite_is_refused_when_encryption_is_required(
    start: Start, certificate: Certificate
) -> None:
    service, tls_port = await start_tls(start, certificate, sip_require_encryption=True)
    before = await service.counter("parley_calls_refused_total", transport="sip", reason="unencrypted")
    for transport in ("UDP", "TCP"):
        wire = await service.wire(transport)
        rtp = await service.rtp()
        d = service.dialogue(wire)
        wire.send(d.invite(offer(rtp.port)))
        refused = await wire.final(method="INVITE", call_id=d.call_id)
        assert refused.status == 403
        assert f"sips:agent@{LOCAL}:{tls_port}" in (refused.headers.get("Warning") or "")
    refusals = await service.counter("parley_calls_refused_total", transport="sip", reason="unencrypted")
    assert refusals - before == 2  # the counters are the process's, shared by every test
    assert await service.options() == 200  # health checks stay plain
    # Over TLS the same INVITE is not refused for its transport.
    wire = await tls_wire(service, tls_port, certificate)
    rtp = await service.rtp()
    d = service.dialogue(wire)
    d.target = f"sips:agent@{LOCAL}:{tls_port}"
    wire.send(d.invite(offer(rtp.port)))
    answered = await wire.final(method="INVITE", call_id=d.call_id, timeout=10.0)
    assert answered.status != 403
    if answered.status == 200:
        d.learn(answered)
        wire.send(d.ack())
        wire.send(d.request("BYE"))
        assert (await wire.final(method="BYE", call_id=d.call_id)).status == 200


async def test_plain_bytes_on_the_tls_port_are_closed_and_tls_still_serves(
    start: Start, certificate: Certificate
) -> None:
    service, tls_port = await start_tls(start, certificate)
    reader, writer = await asyncio.open_connection(LOCAL, tls_port, local_addr=("127.0.0.2", 0))
    writer.write(b"OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\n\r\n" * 4)
    try:
        # A TLS alert may come first; then the listener closes the connection.
        with contextlib.suppress(ConnectionError):
            while await asyncio.wait_for(reader.read(100), 5.0):
                pass
    finally:
        writer.close()
    failed = await service.counter("parley_transport_errors_total", transport="sip", reason="tls_failed")
    assert failed >= 1
    wire = await tls_wire(service, tls_port, certificate)
    call_id = f"{token()}@tls"
    wire.send(options(wire, f"sips:agent@{LOCAL}:{tls_port}", call_id))
    assert (await wire.final(method="OPTIONS", call_id=call_id)).status == 200
    await service.still_serves()


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"sip_require_encryption": True}, "needs --sip-tls"),
        (
            {"sip_tls": f"{LOCAL}:0", "sip_tls_cert_file": "/nonexistent.pem", "sip_tls_key_file": "/k.pem"},
            "not a file",
        ),
        ({"sip_tls": f"{LOCAL}:0"}, "cert-file"),
    ],
)
def test_tls_settings_that_cannot_work_stop_the_start(settings: dict[str, object], error: str) -> None:
    with pytest.raises(SettingsError, match=error):
        create_app(Settings(sip=f"{LOCAL}:{free_port()}", **settings), engines=make_engines())  # type: ignore[arg-type]


async def test_a_sips_destination_is_dialled_over_tls_to_a_peer_whose_certificate_is_checked(
    start: Start, certificate: Certificate
) -> None:
    async with dialled_over_tls(start, certificate) as (service, wire, invite, port):
        rtp = await service.rtp()
        assert invite.top_via.transport == "TLS" and invite.uri == f"sips:bob@localhost:{port}"
        assert invite.top_via.port is None  # no TLS listener of ours to name
        wire.reply(
            invite,
            200,
            to_tag=token(),
            headers=[f"Contact: <sips:bob@{LOCAL}:{port}>"],
            body=offer(rtp.port),
            content_type="application/sdp",
        )
        ack = await wire.request("ACK")
        assert ack.call_id == invite.call_id


async def test_a_sips_destination_whose_certificate_is_not_trusted_gets_no_invite(
    start: Start, certificate: Certificate
) -> None:
    server, accepted = await callee(certificate)
    port = int(server.sockets[0].getsockname()[1])
    service = await start(dial_trunks=(f"localhost:{port}",))  # the system's CAs: a self-signed peer fails
    try:
        response = await service.client.post(
            "/api/calls/sip", json={"to": f"sips:bob@localhost:{port}"}, headers=service.auth
        )
        assert response.status == 202
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(accepted.get(), 2.0)
        await service.still_serves()
    finally:
        server.close()
