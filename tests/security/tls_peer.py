"""The TLS side of the security tests: a self-signed certificate for the service, a raw SIP peer over
TLS, and a TLS listener standing in for a callee the service dials.

Shared by test_sip_tls.py, test_srtp.py and test_baresip_tls_srtp.py; the `certificate` fixture that
writes the files lives in conftest.py.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from parley.bench.service import free_port
from tests.sip_wire import LOCAL, SipWire

if TYPE_CHECKING:  # conftest.py imports this module: a runtime import back would be circular
    from tests.security.conftest import Service, Start


@dataclass(frozen=True)
class Certificate:
    cert_file: str
    key_file: str


def write_certificate(folder: Path) -> Certificate:
    """A self-signed certificate for localhost and 127.0.0.1 (its own CA, so a peer can trust exactly
    it), in PEM files in `folder`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOCAL))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return Certificate(str(cert_file), str(key_file))


class TlsWire(SipWire):
    """A raw peer over one TLS connection: SipWire's text and parsing, on a socket ssl encrypts."""

    @classmethod
    async def open_tls(cls, server_port: int, cafile: str) -> TlsWire:
        context = ssl.create_default_context(cafile=cafile)
        wire = cls(server_port, "TLS")
        reader, wire._writer = await asyncio.open_connection(
            LOCAL, server_port, ssl=context, server_hostname="localhost"
        )
        wire.port = int(wire._writer.get_extra_info("sockname")[1])
        wire._reader_task = asyncio.ensure_future(wire._read_stream(reader))
        return wire

    @classmethod
    def over(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> TlsWire:
        """The wire of a connection the service opened to us."""
        wire = cls(0, "TLS")
        wire._writer = writer
        wire.port = int(writer.get_extra_info("sockname")[1])
        wire._reader_task = asyncio.ensure_future(wire._read_stream(reader))
        return wire

    @property
    def contact(self) -> str:
        return f"<sips:caller@{self.here}>"


async def start_tls(start: Start, certificate: Certificate, **settings: object) -> tuple[Service, int]:
    """The service with a TLS listener (and its plain ones) presenting `certificate`: (it, the TLS port)."""
    tls_port = free_port()
    service = await start(
        sip_tls=f"{LOCAL}:{tls_port}",
        sip_tls_cert_file=certificate.cert_file,
        sip_tls_key_file=certificate.key_file,
        **settings,
    )
    return service, tls_port


async def tls_wire(service: Service, tls_port: int, certificate: Certificate) -> TlsWire:
    """A TLS connection to the service's listener, trusting exactly `certificate` (closed with it)."""
    wire = await TlsWire.open_tls(tls_port, certificate.cert_file)
    service.wires.append(wire)
    return wire


async def callee(certificate: Certificate) -> tuple[asyncio.Server, asyncio.Queue[TlsWire]]:
    """A TLS listener with the test's certificate: each connection the service opens, as a wire."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate.cert_file, certificate.key_file)
    accepted: asyncio.Queue[TlsWire] = asyncio.Queue()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(TlsWire.over(reader, writer))

    server = await asyncio.start_server(on_connection, LOCAL, 0, ssl=context)
    return server, accepted
