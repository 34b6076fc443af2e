"""SDP (RFC 4566) for one G.711 audio stream, negotiated by offer/answer (RFC 3264).

We speak PCMU and PCMA at 8 kHz with RFC 4733 telephone-events, 20 ms a packet, over RTP/AVP or, keyed
by SDES (RFC 4568, sdes.py), RTP/SAVP. Everything else an offer carries (video, other codecs, other
profiles) is declined in place, as RFC 3264 6 asks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from parley.transports.sip.sdes import Crypto, SrtpKeys, first_usable, offered

MAX_SDP_BYTES = 32768
MAX_SDP_LINES = 512
CLOCK_RATE = 8000
PTIME_MS = 20
RTP_AVP = "RTP/AVP"
RTP_SAVP = "RTP/SAVP"  # RFC 3711: SRTP, its keys in a=crypto lines
SUPPORTED_CODECS = ("PCMU", "PCMA")
STATIC_PAYLOAD_TYPES = {"PCMU": 0, "PCMA": 8}  # RFC 3551 6: usable without an rtpmap
TELEPHONE_EVENT = "telephone-event"
TELEPHONE_EVENT_FMTP = "0-16"  # the 16 keys and flash (RFC 4733 3.2)
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
# RFC 3264 6.1: the answer mirrors the offer's direction; the same map turns the peer's direction
# into ours.
MIRRORED = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive"}
HELD_ADDRESSES = ("0.0.0.0", "::")  # RFC 3264 8.4: the pre-RFC 3264 way to put a call on hold


class SdpError(ValueError):
    """A malformed session description, or an offer we cannot answer (the UA sends 488)."""


class MediaNotEncrypted(SdpError):
    """An offer whose media would not be encrypted as required, or whose keys came in the clear (488)."""


@dataclass(frozen=True)
class Connection:
    address_type: str  # IP4 or IP6
    address: str


@dataclass(frozen=True)
class Origin:
    username: str
    session_id: str
    session_version: str
    address_type: str
    address: str


@dataclass(frozen=True)
class RtpMap:
    encoding: str
    clock_rate: int
    channels: int = 1


@dataclass
class MediaDescription:
    media: str
    port: int
    proto: str
    formats: list[str]
    rtpmap: dict[int, RtpMap] = field(default_factory=dict)
    fmtp: dict[int, str] = field(default_factory=dict)
    ptime: int | None = None
    direction: str | None = None
    connection: Connection | None = None
    rtcp_port: int | None = None
    crypto: list[str] = field(default_factory=list)  # the a=crypto values, read by sdes.py

    @property
    def is_rtp(self) -> bool:
        return "RTP/" in self.proto

    @property
    def payload_types(self) -> list[int]:
        return [int(f) for f in self.formats] if self.is_rtp else []

    def encoding(self, payload_type: int) -> RtpMap | None:
        """The rtpmap of a payload type, or the static assignment for PCMU/PCMA (RFC 3551 6)."""
        if payload_type in self.rtpmap:
            return self.rtpmap[payload_type]
        for name, static in STATIC_PAYLOAD_TYPES.items():
            if static == payload_type:
                return RtpMap(name, CLOCK_RATE)
        return None


@dataclass
class SessionDescription:
    origin: Origin
    name: str = ""
    connection: Connection | None = None
    direction: str | None = None
    media: list[MediaDescription] = field(default_factory=list)

    def connection_for(self, media: MediaDescription) -> Connection | None:
        return media.connection or self.connection

    def direction_for(self, media: MediaDescription) -> str:
        return media.direction or self.direction or "sendrecv"


@dataclass(frozen=True)
class Negotiated:
    """The agreed stream, from our side: where to send, with what, and which way media flows."""

    remote_address: str
    remote_port: int
    codec: str
    payload_type: int
    telephone_event_pt: int | None
    direction: str  # ours: "sendonly" means we send and the peer does not
    ptime: int = PTIME_MS  # what the peer asked to receive; we always send 20 ms
    remote_rtcp_port: int | None = None
    srtp: SrtpKeys | None = None  # None: plain RTP

    @property
    def sends(self) -> bool:
        """Whether we may send RTP: the peer listens and has not parked the call (hold)."""
        return (
            self.direction in ("sendrecv", "sendonly")
            and self.remote_port != 0
            and self.remote_address not in HELD_ADDRESSES
        )

    @property
    def receives(self) -> bool:
        return self.direction in ("sendrecv", "recvonly")


def parse_sdp(text: str) -> SessionDescription:
    if len(text) > MAX_SDP_BYTES:
        raise SdpError(f"SDP of {len(text)} characters is over the {MAX_SDP_BYTES} limit")
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if len(lines) > MAX_SDP_LINES:
        raise SdpError(f"SDP of {len(lines)} lines is over the {MAX_SDP_LINES} limit")
    lines = [line for line in lines if line.strip()]
    if not lines or lines[0].strip() != "v=0":
        raise SdpError("SDP must start with v=0")
    origin: Origin | None = None
    session = SessionDescription(origin=Origin("-", "0", "0", "IP4", "0.0.0.0"))
    media: MediaDescription | None = None
    for number, line in enumerate(lines[1:], start=2):
        if len(line) < 2 or line[1] != "=":
            raise SdpError(f"SDP line {number} is not <type>=<value>: {line[:60]!r}")
        kind, value = line[0], line[2:].strip()
        try:
            if kind == "o":
                origin = _parse_origin(value)
            elif kind == "s":
                session.name = value
            elif kind == "c" and media is None:
                session.connection = _parse_connection(value)
            elif kind == "c" and media is not None:
                media.connection = _parse_connection(value)
            elif kind == "m":
                media = _parse_media(value)
                session.media.append(media)
            elif kind == "a" and value in DIRECTIONS:
                if media is None:
                    session.direction = value
                else:
                    media.direction = value
            elif kind == "a" and media is not None:
                _parse_media_attribute(media, value)
        except (ValueError, IndexError, OverflowError) as exc:
            raise SdpError(f"SDP line {number} ({line[:60]!r}) is malformed: {exc}") from None
    if origin is None:
        raise SdpError("SDP has no o= line")
    session.origin = origin
    return session


def answer(
    offer: SessionDescription,
    *,
    address: str,
    port: int,
    session_id: int,
    session_version: int,
    supported: Iterable[str] = SUPPORTED_CODECS,
    srtp_key: bytes | None = None,
    require_srtp: bool = False,
) -> tuple[str, Negotiated]:
    """Our answer to an offer, and the stream it agrees on; SdpError if no audio stream is usable.

    One audio stream with a codec we support is accepted, with the offer's first such codec (the
    offerer's preference, RFC 3264 6.1); every other m-line is declined with port 0. An RTP/SAVP stream
    is taken only given `srtp_key` (our master key, offered only when the signalling is secure: RFC 4568
    8.3), and then before any RTP/AVP one; `require_srtp` refuses an offer without one.
    """
    wanted = {name.upper() for name in supported}
    index, crypto = _chosen_stream(offer, wanted, srtp_key is not None, require_srtp)
    lines = _session_lines(address, session_id, session_version)
    negotiated: Negotiated | None = None
    for i, media in enumerate(offer.media):
        codec = _first_codec(media, wanted) if i == index else None
        connection = offer.connection_for(media)
        if codec is None or connection is None:
            lines.append(f"m={media.media} 0 {media.proto} {' '.join(media.formats)}")
            continue
        payload_type, name = codec
        event_pt = _telephone_event(media)
        direction = MIRRORED[offer.direction_for(media)]
        keys = None
        if crypto is not None and srtp_key is not None:
            ours = Crypto(crypto.tag, crypto.suite, srtp_key)  # 7.1.1: the offer's tag and suite, our key
            lines += _audio_lines(port, [(payload_type, name)], event_pt, direction, [ours])
            keys = SrtpKeys(crypto.suite, local=srtp_key, remote=crypto.key)
        else:
            lines += _audio_lines(port, [(payload_type, name)], event_pt, direction)
        negotiated = _negotiated(connection, media, payload_type, name, event_pt, direction, keys)
    assert negotiated is not None  # _chosen_stream found the stream usable
    return _join(lines), negotiated


def _chosen_stream(
    offer: SessionDescription, wanted: set[str], srtp: bool, require_srtp: bool
) -> tuple[int, Crypto | None]:
    """The m-line we accept, by index, with the crypto line we take from it (None for RTP/AVP)."""
    plain: int | None = None
    refused_keys = False
    for index, media in enumerate(offer.media):
        if offer.connection_for(media) is None or _first_codec(media, wanted) is None:
            continue
        if media.proto == RTP_SAVP:
            crypto = first_usable(media.crypto)
            if crypto is not None and srtp:
                return index, crypto
            refused_keys = refused_keys or (crypto is not None and not srtp)
        elif plain is None:
            plain = index
    if refused_keys and (plain is None or require_srtp):
        raise MediaNotEncrypted("SDES keys (RTP/SAVP) are taken only over TLS (sips:), as RFC 4568 8.3 asks")
    if require_srtp:
        raise MediaNotEncrypted(
            "encrypted media is required: the offer has no RTP/SAVP audio stream with a crypto "
            "suite we speak (AES_CM_128_HMAC_SHA1_80 or _32)"
        )
    if plain is None:
        raise SdpError(
            f"the offer has no RTP/AVP audio stream with an address and {' or '.join(sorted(wanted))}"
        )
    return plain, None


def offer(
    *,
    address: str,
    port: int,
    session_id: int,
    session_version: int,
    codecs: Iterable[str] = SUPPORTED_CODECS,
    telephone_event_pt: int | None = 101,
    srtp_key: bytes | None = None,
) -> str:
    """Our offer: one audio stream, over RTP/SAVP with our key in each suite we speak given `srtp_key`."""
    offered_codecs = []
    for name in codecs:
        if name.upper() not in STATIC_PAYLOAD_TYPES:
            raise ValueError(f"cannot offer {name!r}; we speak {', '.join(SUPPORTED_CODECS)}")
        offered_codecs.append((STATIC_PAYLOAD_TYPES[name.upper()], name.upper()))
    lines = _session_lines(address, session_id, session_version)
    crypto = offered(srtp_key) if srtp_key is not None else []
    lines += _audio_lines(port, offered_codecs, telephone_event_pt, "sendrecv", crypto)
    return _join(lines)


def negotiated_from_answer(offer_text: str, answer: SessionDescription) -> Negotiated:
    """The stream agreed by the peer's answer to our offer; SdpError if it declined our audio."""
    ours = parse_sdp(offer_text)
    index = next((i for i, m in enumerate(ours.media) if m.media == "audio" and m.port), None)
    if index is None:
        raise SdpError("our offer has no audio stream")
    if len(answer.media) <= index or answer.media[index].port == 0:
        raise SdpError("the answer declined the audio stream")
    media = answer.media[index]
    if media.proto != ours.media[index].proto:
        raise SdpError(
            f"the answer's {media.proto} stream does not match our {ours.media[index].proto} offer"
        )
    offered_types = set(ours.media[index].payload_types)
    wanted = {m.encoding.upper() for pt in offered_types if (m := ours.media[index].encoding(pt))}
    codec = _first_codec(media, wanted, only=offered_types)
    connection = answer.connection_for(media)
    if codec is None or connection is None:
        raise SdpError("the answer has no connection address or none of the codecs we offered")
    keys = _answered_keys(ours.media[index], media) if media.proto == RTP_SAVP else None
    event_pt = _telephone_event(media)
    direction = MIRRORED[answer.direction_for(media)]
    return _negotiated(connection, media, codec[0], codec[1], event_pt, direction, keys)


def _answered_keys(ours: MediaDescription, theirs: MediaDescription) -> SrtpKeys:
    """RFC 4568 7.1.2: the answer takes one of our crypto lines, by its tag and suite, with its own key."""
    answered = first_usable(theirs.crypto)
    if len(theirs.crypto) != 1 or answered is None:
        raise SdpError("the RTP/SAVP answer needs exactly one crypto line we speak")
    mine = {c.tag: c for value in ours.crypto if (c := first_usable([value])) is not None}
    offered_line = mine.get(answered.tag)
    if offered_line is None or offered_line.suite != answered.suite:
        raise SdpError(f"the answer's crypto tag {answered.tag} is not one we offered with that suite")
    return SrtpKeys(answered.suite, local=offered_line.key, remote=answered.key)


def _first_codec(
    media: MediaDescription, wanted: set[str], only: set[int] | None = None
) -> tuple[int, str] | None:
    if media.media != "audio" or media.proto not in (RTP_AVP, RTP_SAVP) or media.port == 0:
        return None
    for payload_type in media.payload_types:
        encoding = media.encoding(payload_type)
        if encoding is None or (only is not None and payload_type not in only):
            continue
        name = encoding.encoding.upper()
        if name in wanted and encoding.clock_rate == CLOCK_RATE and encoding.channels == 1:
            return payload_type, name
    return None


def _telephone_event(media: MediaDescription) -> int | None:
    # RFC 4733 2.1: events use the audio's clock, so only telephone-event/8000 goes with G.711.
    for payload_type in media.payload_types:
        encoding = media.rtpmap.get(payload_type)
        if encoding and encoding.encoding.lower() == TELEPHONE_EVENT and encoding.clock_rate == CLOCK_RATE:
            return payload_type
    return None


def _negotiated(
    connection: Connection,
    media: MediaDescription,
    payload_type: int,
    codec: str,
    event_pt: int | None,
    direction: str,
    srtp: SrtpKeys | None,
) -> Negotiated:
    return Negotiated(
        remote_address=connection.address,
        remote_port=media.port,
        codec=codec,
        payload_type=payload_type,
        telephone_event_pt=event_pt,
        direction=direction,
        ptime=media.ptime or PTIME_MS,
        remote_rtcp_port=media.rtcp_port,
        srtp=srtp,
    )


def _session_lines(address: str, session_id: int, session_version: int) -> list[str]:
    address_type = "IP6" if ":" in address else "IP4"
    return [
        "v=0",
        f"o=parley {session_id} {session_version} IN {address_type} {address}",
        "s=parley",
        f"c=IN {address_type} {address}",
        "t=0 0",
    ]


def _audio_lines(
    port: int,
    codecs: list[tuple[int, str]],
    event_pt: int | None,
    direction: str,
    crypto: Iterable[Crypto] = (),
) -> list[str]:
    formats = [str(pt) for pt, _ in codecs] + ([str(event_pt)] if event_pt is not None else [])
    keys = [f"a=crypto:{line}" for line in crypto]
    lines = [f"m=audio {port} {RTP_SAVP if keys else RTP_AVP} {' '.join(formats)}", *keys]
    lines += [f"a=rtpmap:{pt} {name}/{CLOCK_RATE}" for pt, name in codecs]
    if event_pt is not None:
        lines += [
            f"a=rtpmap:{event_pt} {TELEPHONE_EVENT}/{CLOCK_RATE}",
            f"a=fmtp:{event_pt} {TELEPHONE_EVENT_FMTP}",
        ]
    return [*lines, f"a=ptime:{PTIME_MS}", f"a={direction}"]


def _join(lines: list[str]) -> str:
    return "\r\n".join(lines) + "\r\n"


def _parse_origin(value: str) -> Origin:
    parts = value.split()
    if len(parts) != 6 or parts[3] != "IN" or parts[4] not in ("IP4", "IP6"):
        raise ValueError("o= needs: username sess-id sess-version IN IP4|IP6 address")
    return Origin(parts[0], parts[1], parts[2], parts[4], parts[5])


def _parse_connection(value: str) -> Connection:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise ValueError("c= needs: IN IP4|IP6 address")
    return Connection(parts[1], _ip_literal(parts[1], parts[2]))


def _ip_literal(address_type: str, text: str) -> str:
    """The c= address as an IP literal. RFC 4566 5.7 also allows a name, but resolving one would block
    the event loop on DNS for every packet, and a name lets anyone aim our audio anywhere."""
    shown = repr(text[:60])
    try:
        address = ipaddress.ip_address(text.partition("/")[0])  # a multicast one carries /ttl (5.7)
    except ValueError:
        raise ValueError(f"{shown} is not an IP address; media goes only to IP literals") from None
    if address.version != (4 if address_type == "IP4" else 6):
        raise ValueError(f"{shown} is not an {address_type} address")
    if address.is_multicast or "/" in text:
        raise ValueError(f"{shown} is multicast; we send unicast RTP only")
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        raise ValueError(f"{shown} names an interface, which is ours to choose")
    return str(address)


def _parse_media(value: str) -> MediaDescription:
    parts = value.split()
    if len(parts) < 4:
        raise ValueError("m= needs: media port proto format...")
    port = int(parts[1].split("/")[0])
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} is outside 0..65535")
    media = MediaDescription(media=parts[0], port=port, proto=parts[2], formats=parts[3:])
    if any(not 0 <= pt <= 127 for pt in media.payload_types):
        raise ValueError("RTP payload types lie in 0..127")
    return media


def _parse_media_attribute(media: MediaDescription, value: str) -> None:
    name, _, rest = value.partition(":")
    if name == "rtpmap":
        pt, encoding = rest.split(None, 1)
        parts = encoding.strip().split("/")
        channels = int(parts[2]) if len(parts) > 2 else 1
        media.rtpmap[int(pt)] = RtpMap(parts[0], int(parts[1]), channels)
    elif name == "fmtp":
        pt, _, params = rest.partition(" ")
        media.fmtp[int(pt)] = params.strip()
    elif name == "ptime":
        media.ptime = round(float(rest))
    elif name == "crypto":
        media.crypto.append(rest)
    elif name == "rtcp":
        port = int(rest.split()[0])
        if not 0 < port <= 0xFFFF:
            raise ValueError(f"RTCP port {port} is outside 1..65535")
        media.rtcp_port = port
