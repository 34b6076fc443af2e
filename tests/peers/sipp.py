"""SIPp 3.6 (Debian's sip-tester) for the tests: load (`run_sipp`), a background UAS (`SippUas`), and RTP
pcaps of our own audio and digits for SIPp to play (`write_rtp_pcap`, `write_play_scenario`).

    result = run_sipp("uac", agent_target, calls=5, rate=5, timeout_s=30)
    assert result.ok, result.describe()

What SIPp 3.6.1 does, found by running it (see tests/peers/test_peers.py):

- Exit status: 0 all calls succeeded; 1 at least one failed; 97 exit on internal command; 99 normal exit
  without calls processed; 255 (-1) fatal error, and also the global `-timeout` with `-timeout_error`
  (without `-timeout_error`, -timeout does not stop a call waiting on its retransmissions: a UAC to a dead
  port took 32 s, not 3); 254 (-2) its SIP port is in use. A UAS stopped by SIGUSR1 (soft exit, lets calls
  end) or SIGTERM exits 0.
- Counts: `-trace_stat -stf FILE` writes a ";"-separated CSV (header, then one row per `-fd` period and
  one at exit); the last row's `SuccessfulCall(C)` / `FailedCall(C)` are the totals. The final screen
  (stdout when not a terminal, and `-trace_screen -screen_file`) has the same numbers ("Successful call").
  `-trace_err -error_file FILE` holds the unexpected messages and aborted calls (absent if none).
- `uac_pcap` plays `pcap/g711a.pcap` (PCMA, 236 packets of 30 ms, ~7 s) then `pcap/dtmf_2833_1.pcap`
  (RFC 2833 "1", another SSRC), paths relative to the working directory. Debian installs them in
  /usr/share/sip-tester/ (with dtmf_2833_0..9, pound, star), not under pcap/: without a `pcap` folder in
  the working directory SIPp fails at once ("Can't open PCAP file 'pcap/g711a.pcap'", exit 1). The driver
  runs SIPp in a working directory with `pcap -> /usr/share/sip-tester`.
- Playing a pcap needs root or CAP_NET_RAW: SIPp sends the RTP through a raw IPv4 socket ("Can't create raw
  IPv4 socket (need to run as root?)", exit 255, as nobody; as nobody with ambient CAP_NET_RAW it works).
  The RTP leaves from the -mi address and the -mp port, to the address and port of the answer's SDP.
- The built-in `uas` answers any request-URI with `m=audio <-mp> RTP/AVP 0` at the -i address; with
  `-rtp_echo` it sends received RTP back (a loop for checking a phone's audio path).
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np
import soxr

from tests.peers import free_port, free_port_block, is_free
from tests.peers.baresip import PeerError, reap, spawn

SIPP = "sipp"
PCAP_DIR = Path("/usr/share/sip-tester")  # Debian's sip-tester: g711a.pcap, dtmf_2833_*.pcap
BUILT_IN = (
    "uac",
    "uac_pcap",
    "uas",
    "regexp",
    "branchc",
    "branchs",
    "3pcc-C-A",
    "3pcc-C-B",
    "3pcc-A",
    "3pcc-B",
)
EXIT_MEANING = {
    0: "all calls succeeded",
    1: "at least one call failed",
    97: "exit on internal command",
    99: "normal exit without calls processed",
    255: "fatal error (or the global timeout with -timeout_error)",
    254: "fatal error binding a socket",
}


def can_play_pcap() -> bool:
    """SIPp's pcap play needs root or CAP_NET_RAW (a raw socket)."""
    if os.geteuid() == 0:
        return True
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 13))  # CAP_NET_RAW
    except OSError:
        pass
    return False


@dataclass(frozen=True)
class SippResult:
    returncode: int
    successful: int | None  # None: no statistics (SIPp died before writing them)
    failed: int | None
    created: int | None
    error_log: str  # -trace_err: unexpected messages, aborted calls
    output: str  # stdout+stderr (the final screen), tail
    stats: Mapping[str, str] = field(repr=False)  # the last -trace_stat row by column name
    args: tuple[str, ...] = field(repr=False, default=())

    @property
    def ok(self) -> bool:
        """Every call succeeded (exit 0, no failed call)."""
        return self.returncode == 0 and not self.failed

    def describe(self) -> str:
        meaning = EXIT_MEANING.get(self.returncode, "killed or unknown")
        return (
            f"sipp exit {self.returncode} ({meaning}): successful={self.successful} failed={self.failed} "
            f"created={self.created}\n$ {' '.join(self.args)}\n--- errors ---\n{self.error_log[-4000:]}\n"
            f"--- output ---\n{self.output[-3000:]}"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _screen_count(screen: str, label: str) -> int | None:
    # "  Successful call        |        0                  |        5" -> the cumulative (last) column
    for line in reversed(screen.splitlines()):
        if line.strip().startswith(label) and "|" in line:
            return _int(line.rsplit("|", 1)[1].strip())
    return None


def _collect(workdir: Path, returncode: int, args: Sequence[str]) -> SippResult:
    stats: dict[str, str] = {}
    text = _read(workdir / "stats.csv")
    rows = list(csv.reader(text.splitlines(), delimiter=";"))
    if len(rows) >= 2:
        header, last = rows[0], rows[-1]
        stats = dict(zip(header, last, strict=False))
    output = _read(workdir / "sipp.log")
    screen = _read(workdir / "screen.log") or output
    successful = _int(stats.get("SuccessfulCall(C)"))
    failed = _int(stats.get("FailedCall(C)"))
    if successful is None:
        successful = _screen_count(screen, "Successful call")
    if failed is None:
        failed = _screen_count(screen, "Failed call")
    return SippResult(
        returncode=returncode,
        successful=successful,
        failed=failed,
        created=_int(stats.get("TotalCallCreated")),
        error_log=_read(workdir / "errors.log"),
        output=output[-20000:],
        stats=stats,
        args=tuple(args),
    )


def _prepare_workdir(directory: Path | str | None) -> tuple[Path, bool]:
    own = directory is None
    workdir = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="sipp-"))
    workdir.mkdir(parents=True, exist_ok=True)
    link = workdir / "pcap"  # uac_pcap plays "pcap/g711a.pcap" relative to the working directory
    if PCAP_DIR.is_dir() and not link.exists():
        link.symlink_to(PCAP_DIR)
    for name in ("stats.csv", "errors.log", "screen.log", "sipp.log", "messages.log"):
        (workdir / name).unlink(missing_ok=True)
    return workdir, own


def _sipp_args(
    scenario: str,
    target: str,
    *,
    workdir: Path,
    local_port: int,
    media_port: int,
    service: str | None,
    trace_messages: bool,
    extra_args: Sequence[str],
) -> list[str]:
    if scenario in BUILT_IN:
        args = [SIPP, "-sn", scenario]
    else:
        path = Path(scenario)
        if not path.is_file():
            raise FileNotFoundError(f"no SIPp scenario {scenario!r} (built-in: {', '.join(BUILT_IN)})")
        args = [SIPP, "-sf", str(path.resolve())]
    if target:
        args.append(target)
    args += ["-i", "127.0.0.1", "-p", str(local_port), "-mi", "127.0.0.1", "-mp", str(media_port), "-nostdin"]
    if service is not None:
        args += ["-s", service]
    args += [
        "-trace_stat",
        "-stf",
        str(workdir / "stats.csv"),
        "-trace_err",
        "-error_file",
        str(workdir / "errors.log"),
    ]
    args += ["-trace_screen", "-screen_file", str(workdir / "screen.log")]
    if trace_messages:
        args += ["-trace_msg", "-message_file", str(workdir / "messages.log")]
    return args + list(extra_args)


def run_sipp(
    scenario: str,
    target: str,
    *,
    local_port: int | None = None,
    calls: int = 1,
    rate: float = 1.0,
    limit: int | None = None,
    timeout_s: float = 60.0,
    service: str | None = None,
    media_port: int | None = None,
    trace_messages: bool = False,
    directory: Path | str | None = None,
    extra_args: Sequence[str] = (),
) -> SippResult:
    """Run SIPp to completion: `calls` calls at `rate` per second, at most `limit` at once (default: all),
    all on 127.0.0.1, and parse its statistics.

    - `scenario`: "uac", "uac_pcap", "uas" (any built-in) or the path of a scenario XML.
    - `target`: "HOST:PORT" to call ("" for a UAS).
    - `service`: the request-URI user ([service], "service" by default; baresip answers only its own).
    - `timeout_s`: SIPp's global timeout (-timeout with -timeout_error: exit 255); the process is killed
      15 s after that if it has not exited.
    - `directory`: working directory and logs (default: a temporary one, removed).
    """
    workdir, own = _prepare_workdir(directory)
    try:
        args = _sipp_args(
            scenario,
            target,
            workdir=workdir,
            local_port=local_port or free_port(udp=True, tcp=True),
            media_port=media_port or free_port_block(4, udp=True),
            service=service,
            trace_messages=trace_messages,
            extra_args=extra_args,
        )
        args += ["-m", str(calls), "-r", f"{rate:g}", "-l", str(limit or calls)]
        args += ["-timeout", f"{max(1, round(timeout_s))}s", "-timeout_error"]
        process = spawn(args, log=workdir / "sipp.log", cwd=workdir)
        try:
            returncode = process.wait(timeout_s + 15)
        except subprocess.TimeoutExpired:
            returncode = reap(process, grace_s=2)
        finally:
            reap(process)
        result = _collect(workdir, returncode, args)
        if trace_messages:
            result = _with_messages(result, workdir)
        return result
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def _with_messages(result: SippResult, workdir: Path) -> SippResult:
    messages = _read(workdir / "messages.log")
    return SippResult(
        returncode=result.returncode,
        successful=result.successful,
        failed=result.failed,
        created=result.created,
        error_log=result.error_log + ("\n--- messages ---\n" + messages[-20000:] if messages else ""),
        output=result.output,
        stats=result.stats,
        args=result.args,
    )


class SippUas:
    """SIPp as a background UAS on 127.0.0.1 (built-in "uas" by default: 180, 200 with SDP, waits for
    BYE). A context manager; `stop()` ends it (SIGUSR1: soft exit, then SIGTERM/SIGKILL) and returns its
    result. `rtp_echo`: send received RTP back to its sender.
    """

    def __init__(
        self,
        scenario: str = "uas",
        *,
        local_port: int | None = None,
        media_port: int | None = None,
        rtp_echo: bool = False,
        trace_messages: bool = False,
        directory: Path | str | None = None,
        extra_args: Sequence[str] = (),
        start_timeout_s: float = 5.0,
    ) -> None:
        self.scenario = scenario
        self.local_port = local_port or 0
        self.media_port = media_port or 0
        self.rtp_echo = rtp_echo
        self.trace_messages = trace_messages
        self.extra_args = tuple(extra_args)
        self.start_timeout_s = start_timeout_s
        self.workdir, self._own = _prepare_workdir(directory)
        self.process: subprocess.Popen[bytes] | None = None
        self.args: list[str] = []
        self.result: SippResult | None = None

    def __enter__(self) -> SippUas:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def uri(self, user: str = "agent") -> str:
        return f"sip:{user}@127.0.0.1:{self.local_port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.local_port}"

    def start(self) -> SippUas:
        fixed_port = bool(self.local_port)
        for _attempt in range(5):
            self.local_port = self.local_port if fixed_port else free_port(udp=True, tcp=True)
            self.media_port = self.media_port or free_port_block(4, udp=True)
            self.args = _sipp_args(
                self.scenario,
                "",
                workdir=self.workdir,
                local_port=self.local_port,
                media_port=self.media_port,
                service=None,
                trace_messages=self.trace_messages,
                extra_args=[*(["-rtp_echo"] if self.rtp_echo else []), *self.extra_args],
            )
            self.process = spawn(self.args, log=self.workdir / "sipp.log", cwd=self.workdir)
            deadline = time.monotonic() + self.start_timeout_s
            while time.monotonic() < deadline and self.process.poll() is None:
                if not is_free(self.local_port, udp=True):  # bound: listening
                    return self
                time.sleep(0.02)
            code = self.process.poll()
            if code is None:  # still not bound after start_timeout_s
                reap(self.process)
                break
            if code != 254 or fixed_port:  # 254: its port was taken meanwhile, try another
                break
        output = _read(self.workdir / "sipp.log")
        self.stop()
        raise PeerError(f"sipp UAS did not start: {' '.join(self.args)}\n{output[-3000:]}")

    def stop(self, *, grace_s: float = 5.0) -> SippResult:
        """End it (calls in progress may finish within `grace_s`), reap it, and parse its statistics."""
        if self.result is not None:
            return self.result
        returncode = -1
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(grace_s)
            returncode = reap(self.process)
        self.result = _collect(self.workdir, returncode, self.args)
        if self.trace_messages:
            self.result = _with_messages(self.result, self.workdir)
        if self._own:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.result


def start_sipp_uas(
    scenario: str = "uas",
    *,
    local_port: int | None = None,
    rtp_echo: bool = False,
    directory: Path | str | None = None,
    extra_args: Sequence[str] = (),
) -> SippUas:
    """A started `SippUas`: call `.stop()` on it (or use `with SippUas(...) as uas:`)."""
    uas = SippUas(
        scenario, local_port=local_port, rtp_echo=rtp_echo, directory=directory, extra_args=extra_args
    )
    return uas.start()


# ---------------------------------------------------------------------------------------------- pcap

# G.711 encoders (the ITU/Sun reference algorithm), kept apart from the server's own so that a bug there
# cannot hide in a test that uses the same code on both ends.
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])


def alaw_encode(pcm: np.ndarray) -> bytes:
    x = pcm.astype(np.int32) >> 3
    mask = np.where(x >= 0, 0xD5, 0x55)
    x = np.where(x >= 0, x, -x - 1)
    seg = np.searchsorted(_ALAW_SEG_END, x, side="left")
    low = np.where(seg < 2, x >> 1, x >> np.maximum(seg, 1)) & 0x0F
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | low)
    return bytes((code ^ mask).astype(np.uint8).tobytes())


def ulaw_encode(pcm: np.ndarray) -> bytes:
    x = pcm.astype(np.int32) >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    x = np.minimum(np.abs(x), 8159) + (0x84 >> 2)
    seg = np.searchsorted(_ULAW_SEG_END, x, side="left")
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | ((x >> (np.minimum(seg, 7) + 1)) & 0x0F))
    return bytes((code ^ mask).astype(np.uint8).tobytes())


CODECS = {"PCMU": (0, ulaw_encode), "PCMA": (8, alaw_encode)}
DTMF_EVENTS = {**{str(d): d for d in range(10)}, "*": 10, "#": 11, "A": 12, "B": 13, "C": 14, "D": 15}
TELEPHONE_EVENT_PT = 101


def _frame(payload: bytes, *, src_port: int, dst_port: int) -> bytes:
    """Ethernet + IPv4 + UDP around `payload` (SIPp reads the UDP header and what follows)."""
    udp = struct.pack("!HHHH", src_port, dst_port, 8 + len(payload), 0) + payload
    total = 20 + len(udp)
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0, bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1])
    )
    words = struct.unpack("!10H", header)
    checksum = sum(words)
    checksum = (checksum & 0xFFFF) + (checksum >> 16)
    checksum = ~((checksum & 0xFFFF) + (checksum >> 16)) & 0xFFFF
    header = header[:10] + struct.pack("!H", checksum) + header[12:]
    ethernet = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00"
    return ethernet + header + udp


def write_rtp_pcap(
    path: Path | str,
    samples: np.ndarray,
    rate: int,
    *,
    codec: str = "PCMA",
    dtmf: str = "",
    digit_ms: int = 100,
    gap_ms: int = 100,
    tail_ms: int = 200,
    ssrc: int = 0x5EED1234,
    src_port: int = 40000,
    dst_port: int = 40002,
) -> float:
    """Write a libpcap file (Ethernet/IPv4/UDP/RTP, 20 ms packets) that SIPp's `play_pcap_audio` plays:
    `samples` (int16 mono at `rate`, resampled to 8 kHz) in `codec` ("PCMA" or "PCMU"), then each digit
    of `dtmf` as RFC 4733 telephone-events (payload type 101, `digit_ms` long, end packet sent 3 times,
    `gap_ms` of silence after each), then `tail_ms` of silence. One SSRC, continuous sequence numbers and
    timestamps. Returns the duration in seconds (for the scenario's pause). Addresses and ports in the
    file do not matter: SIPp sends to the SDP's address from its own -mi/-mp.
    """
    payload_type, encode = CODECS[codec]
    audio = np.asarray(samples, dtype=np.int16)
    if rate != 8000 and audio.size:
        audio = np.asarray(soxr.resample(audio, rate, 8000, quality="HQ"), dtype=np.int16)
    audio = np.concatenate([audio, np.zeros((-audio.size) % 160, dtype=np.int16)])
    silence = encode(np.zeros(160, dtype=np.int16))
    packets: list[tuple[int, bytes]] = []  # (RTP timestamp, RTP packet); sent at timestamp / 8000 s
    seq = 0
    timestamp = 0

    def rtp(pt: int, marker: bool, ts: int, payload: bytes) -> bytes:
        nonlocal seq
        header = struct.pack(
            "!BBHII", 0x80, (0x80 if marker else 0) | pt, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc
        )
        seq += 1
        return header + payload

    first = True
    for start in range(0, audio.size, 160):
        packets.append((timestamp, rtp(payload_type, first, timestamp, encode(audio[start : start + 160]))))
        timestamp += 160
        first = False
    for digit in dtmf.upper():
        event = DTMF_EVENTS[digit]
        steps = max(1, digit_ms // 20)
        for step in range(1, steps + 1):  # duration grows by 160 per packet, same timestamp
            payload = struct.pack("!BBH", event, 10, step * 160)
            packets.append(
                (timestamp + (step - 1) * 160, rtp(TELEPHONE_EVENT_PT, step == 1, timestamp, payload))
            )
        end = struct.pack("!BBH", event, 0x80 | 10, steps * 160)
        for repeat in range(3):
            packets.append(
                (timestamp + (steps - 1 + repeat) * 160, rtp(TELEPHONE_EVENT_PT, False, timestamp, end))
            )
        timestamp += (steps + 2) * 160
        for _ in range(max(1, gap_ms // 20)):
            packets.append((timestamp, rtp(payload_type, False, timestamp, silence)))
            timestamp += 160
    for _ in range(tail_ms // 20):
        packets.append((timestamp, rtp(payload_type, False, timestamp, silence)))
        timestamp += 160

    out = Path(path)
    with open(out, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))  # libpcap, LINKTYPE_ETHERNET
        base = 1_700_000_000
        for ts, packet in packets:
            frame = _frame(packet, src_port=src_port, dst_port=dst_port)
            micros = ts * 125  # 8000 Hz -> us
            f.write(
                struct.pack("<IIII", base + micros // 1_000_000, micros % 1_000_000, len(frame), len(frame))
            )
            f.write(frame)
    return timestamp / 8000


def play_scenario_xml(pcap: Path | str, *, play_ms: int, codec: str = "PCMA", hold_ms: int = 500) -> str:
    """A UAC scenario: INVITE offering `codec` + telephone-event/8000, ACK, play `pcap` (absolute path),
    wait `play_ms` + `hold_ms`, BYE."""
    payload_type, _ = CODECS[codec]
    return f"""<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="uac playing {Path(pcap).name}">
  <send retrans="500">
    <![CDATA[

      INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag09[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP {payload_type} {TELEPHONE_EVENT_PT}
      a=rtpmap:{payload_type} {codec}/8000
      a=rtpmap:{TELEPHONE_EVENT_PT} telephone-event/8000
      a=fmtp:{TELEPHONE_EVENT_PT} 0-15
      a=ptime:20

    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="183" optional="true"/>
  <recv response="200" rtd="true"/>
  <send>
    <![CDATA[

      ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag09[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
  <nop>
    <action>
      <exec play_pcap_audio="{Path(pcap).resolve()}"/>
    </action>
  </nop>
  <pause milliseconds="{play_ms + hold_ms}"/>
  <send retrans="500">
    <![CDATA[

      BYE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag09[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
  <recv response="200" crlf="true"/>
</scenario>
"""


def write_play_scenario(
    path: Path | str, pcap: Path | str, *, play_ms: int, codec: str = "PCMA", hold_ms: int = 500
) -> Path:
    """`play_scenario_xml` written to `path`, for `run_sipp(path, ...)`."""
    out = Path(path)
    out.write_text(play_scenario_xml(pcap, play_ms=play_ms, codec=codec, hold_ms=hold_ms))
    return out
