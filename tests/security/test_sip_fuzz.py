"""The SIP listener under a mutation corpus: thousands of real datagrams and TCP streams, made from valid
messages with one to three defects each, from a source of their own, while a real call runs.

After every hundred inputs the listener must still answer an OPTIONS from another source and the call
that runs meanwhile must still be up and still get the agent's RTP. A decoy socket, named in the corpus
as a Via `maddr`/`received` and as an SDP `c=` address, must never receive a datagram: parley answers
only the source of a request and sends media only where the caller's own RTP comes from.

The corpus is drawn from a seeded generator: the same inputs on every run, so a failure here is a failure
on every machine. Bounded in count and time, on loopback only, against the service the test started.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable

from parley.app import RUNTIME, SIP
from parley.transports.sip.message import SipRequest, make_response, parse_message
from tests.security.conftest import LOCAL, Service, Start, rtp_packet, sdp_audio_port
from tests.sip_wire import RtpPeer, SipWire, branch, offer, token

SEED = 20261207
UDP_INPUTS = 3000
TCP_INPUTS = 1000
CHECK_EVERY = 100
FUZZER = "127.0.0.2"  # the fuzzer's own source: whatever it earns (rate limits, caps) is its own
DECOY = "127.0.0.9"  # an address the corpus aims replies and media at; nothing may arrive there

NASTY_VALUES = [
    "",
    " ",
    "\x00",
    "\u00e9" * 12,
    "a" * 4000,
    "<sip:x@[::1",
    "sip:",
    "1 INVITE x",
    "-1",
    "4294967296 INVITE",
    "99999999999999999999",
    '"unterminated',
    "<sip:a@b>;tag=" + "t" * 300,
    "\u202e\u0301",
    "%00%0d%0a",
    ";;;;",
    "SIP/2.0/UDP",
    "SIP/2.0/UDP " + DECOY + ";branch=z9hG4bK1;maddr=" + DECOY,
]
VIA_PARAMS = [
    f";maddr={DECOY}",
    ";maddr=\u00e9vil.example",
    ";maddr=evil.example",
    f";received={DECOY}",
    ";rport=0",
    ";rport=99999",
    ";rport=x",
    ";received=\u00e9",
    ";ttl=999",
    ";branch=",
]
SDP_DEFECTS = [
    ("c=IN IP4 127.0.0.1", "c=IN IP4 evil.example"),
    ("c=IN IP4 127.0.0.1", "c=IN IP4 \u00e9vil.example"),
    ("c=IN IP4 127.0.0.1", f"c=IN IP4 {DECOY}"),
    ("c=IN IP4 127.0.0.1", "c=IN IP6 ::ffff:127.0.0.9"),
    ("c=IN IP4 127.0.0.1", "c=IN IP4 0.0.0.0"),
    ("m=audio ", "m=audio 99999"),
    ("m=audio ", "m=audio -1 "),
    ("RTP/AVP", "RTP/SAVP"),
    ("a=ptime:20", "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:!!!!"),
    ("a=ptime:20", "a=rtcp:0"),
    ("a=rtpmap:0 PCMU/8000", "a=rtpmap:0 PCMU/0"),
    ("v=0", "v=1"),
]
METHODS = ["INVITE", "OPTIONS", "REGISTER", "MESSAGE", "SUBSCRIBE", "BYE", "CANCEL", "ACK", "INFO", "NOTIFY"]


class Corpus:
    """Valid messages from the fuzzer's address, each given one to three defects."""

    def __init__(self, seed: int, target: str, fuzz_port: int, decoy_port: int) -> None:
        self.random = random.Random(seed)
        self.target = target
        self.fuzz_port = fuzz_port
        self.decoy_port = decoy_port
        self.kinds: Counter[str] = Counter()

    def message(self, transport: str) -> bytes:
        r = self.random
        method = r.choice(METHODS)
        lines, body = self._valid(method, transport)
        mutators: list[Callable[[list[str], str], tuple[list[str], str]]] = [
            self._nasty_header,
            self._via_param,
            self._drop_line,
            self._duplicate_line,
            self._sdp_defect,
            self._length_defect,
            self._compact_names,
        ]
        for _ in range(r.randint(1, 3)):
            mutate = r.choice(mutators)
            self.kinds[mutate.__name__.strip("_")] += 1
            lines, body = mutate(lines, body)
        head = "\r\n".join(lines)
        raw = (head + "\r\n\r\n" + body).encode("utf-8", "surrogatepass")
        return self._byte_defect(raw)

    def _valid(self, method: str, transport: str) -> tuple[list[str], str]:
        r = self.random
        body = offer(self.decoy_port) if method == "INVITE" else ""
        via = f"SIP/2.0/{transport} {FUZZER}:{self.fuzz_port};branch={branch()};rport"
        to_tag = f";tag={token()}" if method in ("BYE", "INFO", "NOTIFY") or r.random() < 0.1 else ""
        lines = [
            f"{method} {self.target} SIP/2.0",
            f"Via: {via}",
            "Max-Forwards: 70",
            f"From: <sip:fuzz@{FUZZER}:{self.fuzz_port}>;tag={token()}",
            f"To: <{self.target}>{to_tag}",
            f"Call-ID: {token()}@fuzz",
            f"CSeq: {r.randint(1, 9)} {method}",
            f"Contact: <sip:fuzz@{FUZZER}:{self.fuzz_port}>",
        ]
        if body:
            lines.append("Content-Type: application/sdp")
        if r.random() < 0.1:  # a response, which matches no transaction of ours
            lines[0] = f"SIP/2.0 {r.choice([100, 180, 200, 401, 486, 503])} Whatever"
        lines.append(f"Content-Length: {len(body.encode())}")
        return lines, body

    def _nasty_header(self, lines: list[str], body: str) -> tuple[list[str], str]:
        at = self.random.randrange(1, len(lines))
        name = lines[at].split(":", 1)[0]
        lines[at] = f"{name}: {self.random.choice(NASTY_VALUES)}"
        return lines, body

    def _via_param(self, lines: list[str], body: str) -> tuple[list[str], str]:
        for i, line in enumerate(lines):
            if line.startswith("Via:"):
                param = self.random.choice(VIA_PARAMS).replace("{decoy_port}", str(self.decoy_port))
                lines[i] = line + param
                if "maddr" in param or "received" in param:
                    lines[i] = lines[i].replace(f"{FUZZER}:{self.fuzz_port}", f"{DECOY}:{self.decoy_port}")
        return lines, body

    def _drop_line(self, lines: list[str], body: str) -> tuple[list[str], str]:
        del lines[self.random.randrange(1, len(lines))]
        return lines, body

    def _duplicate_line(self, lines: list[str], body: str) -> tuple[list[str], str]:
        at = self.random.randrange(1, len(lines))
        lines.insert(at, lines[at])
        return lines, body

    def _sdp_defect(self, lines: list[str], body: str) -> tuple[list[str], str]:
        if not body:
            return lines, body
        old, new = self.random.choice(SDP_DEFECTS)
        body = body.replace(old, new, 1)
        return [line for line in lines if not line.startswith("Content-Length")] + [
            f"Content-Length: {len(body.encode('utf-8', 'surrogatepass'))}"
        ], body

    def _length_defect(self, lines: list[str], body: str) -> tuple[list[str], str]:
        value = self.random.choice(["0", "99999", "-5", "1" * 30, str(len(body) + 7), "x"])
        return [
            line if not line.startswith("Content-Length") else f"Content-Length: {value}" for line in lines
        ], body

    def _compact_names(self, lines: list[str], body: str) -> tuple[list[str], str]:
        compact = {"Via:": "v:", "From:": "f:", "To:": "t:", "Call-ID:": "i:", "Content-Length:": "l:"}
        return [
            next((line.replace(k, v, 1) for k, v in compact.items() if line.startswith(k)), line)
            for line in lines
        ], body

    def _byte_defect(self, raw: bytes) -> bytes:
        r = self.random
        shape = r.random()
        if shape < 0.70:
            return raw
        self.kinds["bytes"] += 1
        data = bytearray(raw)
        if shape < 0.80:
            for _ in range(r.randint(1, 8)):
                data[r.randrange(len(data))] = r.randrange(256)
        elif shape < 0.88:
            del data[r.randrange(len(data)) :]
        elif shape < 0.94:
            data = bytearray(raw.replace(b"\r\n", r.choice([b"\n", b"\r", b"\r\r\n"])))
        else:
            data[r.randrange(len(data)) : r.randrange(len(data))] = r.randbytes(r.randint(1, 64))
        return bytes(data)


class Decoy(asyncio.DatagramProtocol):
    """A bystander's UDP port: counts whatever parley sends it."""

    def __init__(self) -> None:
        self.arrived: list[tuple[bytes, tuple[str, int]]] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.arrived.append((data, (str(addr[0]), int(addr[1]))))


class LiveCall:
    """A real call that runs through the whole fuzz run: ACKed, sending RTP, hearing the agent."""

    def __init__(self, service: Service, wire: SipWire, rtp: RtpPeer) -> None:
        self.service, self.wire, self.rtp = service, wire, rtp
        self.dialogue = service.dialogue(wire)
        self.their_port = 0
        self.sequence = 0

    async def answer(self) -> None:
        self.wire.send(self.dialogue.invite(offer(self.rtp.port)))
        ok = await self.wire.response(200, call_id=self.dialogue.call_id, timeout=10.0)
        self.dialogue.learn(ok)
        self.wire.send(self.dialogue.ack())
        self.their_port = sdp_audio_port(ok.body)
        self.speak(10)

    def speak(self, packets: int) -> None:
        for _ in range(packets):
            self.rtp.send(rtp_packet(self.sequence), self.their_port)
            self.sequence += 1

    async def still_hears_the_agent(self) -> None:
        before = len(self.rtp.packets)
        self.speak(5)
        deadline = time.monotonic() + 5.0
        while len(self.rtp.packets) <= before:
            assert time.monotonic() < deadline, "the live call stopped getting the agent's RTP"
            await asyncio.sleep(0.02)
        assert not [bye for bye in self.wire.requests("BYE") if bye.call_id == self.dialogue.call_id]

    async def hang_up(self) -> None:
        self.wire.send(self.dialogue.request("BYE"))
        assert (await self.wire.final(method="BYE", call_id=self.dialogue.call_id)).status == 200


async def _check(service: Service, call: LiveCall, decoy: Decoy, done: int) -> None:
    assert await service.options() == 200, f"no answer to OPTIONS after {done} inputs"
    await call.still_hears_the_agent()
    assert not decoy.arrived, (
        f"parley sent {len(decoy.arrived)} datagram(s) to the decoy: {decoy.arrived[:2]}"
    )


class FuzzPeer(asyncio.DatagramProtocol):
    """The fuzzer's socket: counts the status of every answer, to show the inputs reached the handlers,
    and answers the BYEs of the calls its INVITEs opened, so that they end at once with the test."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.statuses[data[8:11].decode("latin-1") if data.startswith(b"SIP/2.0 ") else "request"] += 1
        if data.startswith(b"BYE ") and self.transport is not None:
            bye = parse_message(data)
            assert isinstance(bye, SipRequest)
            self.transport.sendto(make_response(bye, 200).to_bytes(), (str(addr[0]), int(addr[1])))


async def test_thousands_of_defective_sip_inputs_never_stop_the_listener_nor_a_live_call(
    start: Start,
) -> None:
    service = await start(max_calls=40)
    loop = asyncio.get_running_loop()
    decoy_transport, _ = await loop.create_datagram_endpoint(Decoy, local_addr=(DECOY, 0))
    decoy: Decoy = decoy_transport.get_protocol()  # type: ignore[assignment]
    decoy_port = int(decoy_transport.get_extra_info("sockname")[1])
    fuzzer, _ = await loop.create_datagram_endpoint(FuzzPeer, local_addr=(FUZZER, 0))
    answers: FuzzPeer = fuzzer.get_protocol()  # type: ignore[assignment]
    fuzz_port = int(fuzzer.get_extra_info("sockname")[1])
    call = LiveCall(service, await service.wire(), await service.rtp())
    tcp_writers: list[asyncio.StreamWriter] = []
    try:
        await call.answer()
        corpus = Corpus(SEED, service.target, fuzz_port, decoy_port)
        started = time.monotonic()
        for done in range(1, UDP_INPUTS + 1):
            fuzzer.sendto(corpus.message("UDP"), (LOCAL, service.sip_port))
            if done % 20 == 0:
                await asyncio.sleep(0.005)  # let the listener breathe: a flood has its own tests
            if done % CHECK_EVERY == 0:
                await _check(service, call, decoy, done)
        udp_s = time.monotonic() - started

        # TCP: messages written on connections from the fuzzer's address, several per write at times
        # (pipelining), a fresh connection whenever the listener closed the last one.
        writer: asyncio.StreamWriter | None = None
        reconnects = 0
        for done in range(1, TCP_INPUTS + 1):
            if writer is None or writer.is_closing():
                _, writer = await asyncio.open_connection(LOCAL, service.sip_port, local_addr=(FUZZER, 0))
                tcp_writers.append(writer)
                reconnects += 1
            data = corpus.message("TCP")
            if corpus.random.random() < 0.2:
                data += corpus.message("TCP")
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                writer = None
            if done % 10 == 0:
                await asyncio.sleep(0.005)
            if done % CHECK_EVERY == 0:
                await _check(service, call, decoy, UDP_INPUTS + done)
        total_s = time.monotonic() - started

        await _check(service, call, decoy, UDP_INPUTS + TCP_INPUTS)
        await call.hang_up()
        await service.call_completes()
        await service.call_completes("TCP")
        await service.client.app[RUNTIME].registry.end_all("fuzzed")  # while the fuzzer answers BYEs
        print(
            f"\nSIP fuzz: {UDP_INPUTS} datagrams in {udp_s:.1f} s, {TCP_INPUTS} TCP messages on "
            f"{reconnects} connections, {total_s:.1f} s in all; defects drawn: {dict(corpus.kinds)}; "
            f"UDP answers by status: {dict(sorted(answers.statuses.items()))}; "
            f"decoy received {len(decoy.arrived)}"
        )
        # The corpus reached past the parser: INVITEs were taken up (100), requests were handled (a 2xx,
        # 481 or 405/501) and defects were refused (400), not only dropped unread.
        assert answers.statuses["100"] and answers.statuses["400"], answers.statuses
        assert answers.statuses["481"] + answers.statuses["405"] + answers.statuses["501"], answers.statuses
    finally:
        fuzzer.close()
        decoy_transport.close()
        for w in tcp_writers:
            w.close()
    ua = service.client.app[SIP]
    # What the corpus opened (calls that never got an ACK, transactions) ends with the service; the
    # tables stay bounded meanwhile.
    assert len(ua.layer.server) <= 2 * (UDP_INPUTS + TCP_INPUTS)
    assert len(service.client.app[RUNTIME].registry.active()) <= 40
