"""A real softphone for the tests: one baresip 1.0.0 process, headless, on loopback, driven over ctrl_tcp.

    with Baresip(directory=tmp_path / "caller", audio=question_wav) as phone:
        phone.dial(agent_uri)
        phone.wait_for_event("CALL_ESTABLISHED", fail_on=("CALL_CLOSED",))
        ...                                   # it says the question once, then silence
        phone.send_dtmf("5")
        phone.hangup()
        phone.wait_for_event("CALL_CLOSED")
        heard, rate = phone.recorded_received()

What baresip 1.0.0 (Debian's baresip-core) does, found by running it (see tests/peers/test_peers.py):

- Microphone: the `aufile` module plays a WAV **once**; at its end baresip reports AUDIO_ERROR
  "end of file" and **closes the call** (CALL_CLOSED "end of file"). So every source WAV carries a long
  silence tail (`write_source_wav`, 5 minutes by default), and the tail bounds how long a call can last.
  aufile loads the whole file when the call's audio starts (answer or 200 OK), so the speech starts with
  the call; the WAV must be mono 16-bit at the codec's rate, 8000 Hz for G.711: a 16 kHz WAV fails the
  call ("input file must have sample-rate 8000 Hz", the call is closed with "No such device").
- Changing the source mid-call works: `set_audio_source(wav)` (the `ausrc aufile,PATH` command) restarts
  aufile with the new file at once, in the running call (and for later calls). For a barge-in test either
  switch when the test decides, or lay the silence out in one WAV (`lead_silence_s`).
- Recording: `sndfile` writes two WAVs per call in `snd_path`: `dump-YYYY-MM-DD-HH-MM-SS-dec.wav` (what
  it received, decoded: what the caller hears) and `...-enc.wav` (what it sends, before the encoder), mono
  int16 at the codec's rate (8000 Hz). The names have a one-second resolution: two calls started in the
  same second on one instance share (and overwrite) a pair. The dec file holds the decoded frames in
  arrival order: a stretch without RTP leaves no gap in it. The files are readable (by soundfile) while the
  call is still running. Recording needs no audio player: none is configured (no sound card at all).
- Control: ctrl_tcp takes netstrings (`LEN:JSON,`) of `{"command": NAME, "params": STR, "token": STR}`
  (NAME is a menu long command without the slash: dial, hangup, accept, sndcode, ausrc, answermode,
  listcalls, help...), answers `{"response": true, "ok": BOOL, "data": STR, "token": STR}`, and pushes
  events `{"event": true, "type": KIND, "class": ..., "accountaor": ..., "direction": ..., "peeruri": ...,
  "id": CALL_ID, "param": ...}`. Single-key menu commands (the statmode toggle "S", digits) are not
  reachable over ctrl_tcp.
- Events seen: CALL_INCOMING (manual answer only), CALL_RINGING, CALL_LOCAL_SDP / CALL_REMOTE_SDP
  (class "other"), CALL_ESTABLISHED, CALL_RTPESTAB, CALL_RTCP, CALL_DTMF_START (param: the digit),
  CALL_DTMF_END (no param), AUDIO_ERROR, CALL_CLOSED (param: the reason), SHUTDOWN, EXIT.
- DTMF: `sndcode DIGITS` sends RFC 4733 telephone-events in the RTP stream (no SIP INFO; 1.0.0 has no way
  to send INFO). The receiving baresip reports CALL_DTMF_START with the digit, then CALL_DTMF_END.
- Addressing: `net_interface 127.0.0.1` makes the SDP say `c=IN IP4 127.0.0.1` (without it, the SDP
  advertises the machine's primary address; `net_interface lo` is refused: "could not get IPv4 address").
  An incoming INVITE's request-URI user must be the account's user, or baresip answers 404 ("UA not
  found"): dial `phone.uri`.
- Ports: a SIP port in use (UDP or TCP) makes baresip exit with 98; a ctrl_tcp port in use does not (it
  runs on without control), so the driver checks the log for that and retries with fresh ports. It
  also listens for SIP over TLS on the SIP port + 1 (always), so the driver takes the two as a pair.
- TLS (`tls_ca_file`): it cannot dial a `sips:` URI (it dials `sip:sips:agent@HOST:PORT` over UDP, to
  which nothing answers); dial `sip:USER@HOST:PORT;transport=tls` (`tls_uri`), and it follows the
  answer's Contact with `;transport=tls` for the ACK and BYE on the same connection. `sip_cafile PEM` in
  the config is loaded ("ua: adding SIP CA") but **not enforced**: a call connects to a server whose
  certificate it does not trust, or with no sip_cafile at all. So a test with it shows encrypted
  signalling, not that the phone authenticated the server.
- SRTP (`media_encryption`, SDES): the `srtp.so` module and `;mediaenc=srtp-mand` on the account make it
  offer RTP/SAVP with one a=crypto line (AES_CM_128_HMAC_SHA1_80); `;mediaenc=srtp` offers RTP/AVP with
  that line (best effort). When the keys agree it logs "SRTP is Enabled (cryptosuite=...)"
  (`srtp_suites()`) and sends CALL_MENC "0,audio,SUITE". An offer refused ends the call in CALL_CLOSED
  with the status, e.g. "488 Not Acceptable Here". Its RTCP is not all protected: a 16-byte RTCP APP
  "PING" when the stream starts and the RTCP BYE ("Adjo") when it ends go out plain, so an SRTP peer that
  checks SRTCP (RFC 3711 requires it) refuses one or two packets per call.
- SIP trace (`sip_trace`, `-s`): each message is logged after a `#` line and a `TLS 127.0.0.1:A ->
  127.0.0.1:B` line (UDP, TCP or TLS), decrypted; `sip_messages()` reads them back.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import soundfile
import soxr

from tests.peers import free_port, free_port_block

BARESIP = "baresip"
MODULE_PATH = Path("/usr/lib/baresip/modules")
CODEC_RATE = 8000  # G.711, the only codecs loaded
DEFAULT_TAIL_S = 300.0  # silence after the speech in a source WAV: aufile closes the call at the file's end
RTP_PORT_COUNT = 16
READY_LINE = "baresip is ready."


class PeerError(AssertionError):
    """The peer did something other than what the test expected (carries its logs for the report)."""


class CommandError(PeerError):
    """baresip answered a ctrl_tcp command with ok=false."""


@dataclass(frozen=True)
class Event:
    """One ctrl_tcp event, e.g. kind="CALL_ESTABLISHED"."""

    kind: str
    param: str
    peer_uri: str
    call_id: str
    direction: str
    at: float  # time.monotonic() when the driver read it
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, message: Mapping[str, Any], at: float) -> Event:
        return cls(
            kind=str(message.get("type", "")),
            param=str(message.get("param", "")),
            peer_uri=str(message.get("peeruri", "")),
            call_id=str(message.get("id", "")),
            direction=str(message.get("direction", "")),
            at=at,
            raw=message,
        )

    def line(self) -> str:
        return f"{self.at:.3f} {self.kind} {self.param!r} peer={self.peer_uri} id={self.call_id}"


# ---------------------------------------------------------------------------------------------- audio


def write_source_wav(
    path: Path | str,
    samples: np.ndarray,
    rate: int,
    *,
    lead_silence_s: float = 0.0,
    tail_silence_s: float = DEFAULT_TAIL_S,
) -> Path:
    """Write audio as the WAV aufile accepts: mono int16 at 8000 Hz, `lead_silence_s` of silence, the
    audio (resampled from `rate`), then `tail_silence_s` of silence (aufile plays once and ends the call
    at the end of the file, so the tail is how long the call may last after the speech).

    `samples`: int16 (or float in [-1, 1]), 1-D, or 2-D (frames, channels) which is mixed down.
    """
    audio = np.asarray(samples)
    if audio.ndim == 2:
        audio = audio.astype(np.float64).mean(axis=1)
    if audio.ndim != 1:
        raise ValueError(f"expected mono or (frames, channels) audio, got shape {audio.shape}")
    if np.issubdtype(audio.dtype, np.floating) and audio.size and float(np.max(np.abs(audio))) <= 1.0:
        audio = audio * 32767.0
    audio = np.clip(np.round(audio.astype(np.float64)), -32768, 32767).astype(np.int16)
    if rate != CODEC_RATE and audio.size:
        audio = np.asarray(soxr.resample(audio, rate, CODEC_RATE, quality="HQ"), dtype=np.int16)
    lead = np.zeros(round(lead_silence_s * CODEC_RATE), dtype=np.int16)
    tail = np.zeros(round(tail_silence_s * CODEC_RATE), dtype=np.int16)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(out, np.concatenate([lead, audio, tail]), CODEC_RATE, subtype="PCM_16", format="WAV")
    return out


def silence_wav(path: Path | str, seconds: float = DEFAULT_TAIL_S) -> Path:
    """A WAV of silence only, for a peer that should just listen."""
    return write_source_wav(path, np.zeros(0, dtype=np.int16), CODEC_RATE, tail_silence_s=seconds)


def synthesize_speech(
    text: str, *, voice: str = "en-us", words_per_minute: int = 150
) -> tuple[np.ndarray, int]:
    """`espeak-ng -v VOICE -s WPM -w out.wav TEXT` as (int16 mono samples, rate); espeak-ng says 22050."""
    with tempfile.TemporaryDirectory(prefix="espeak-") as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(
            ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(wav), text],
            check=True,
            capture_output=True,
            timeout=60,
        )
        data, rate = soundfile.read(wav, dtype="int16", always_2d=False)
    return np.asarray(data, dtype=np.int16), int(rate)


# ---------------------------------------------------------------------------------------------- reaping

_live: weakref.WeakSet[Baresip] = weakref.WeakSet()
_prctl: Any = None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the thread that started it dies (even by SIGKILL)."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _prepare_prctl() -> None:
    # Resolved in the parent: looking symbols up after fork could deadlock on the loader's lock.
    global _prctl
    if _prctl is None and os.uname().sysname == "Linux":
        with contextlib.suppress(OSError, AttributeError):
            _prctl = ctypes.CDLL(None, use_errno=True).prctl


def spawn(args: Sequence[str], *, log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a peer process: stdin closed, stdout+stderr into `log`, in its own session, and killed by
    the kernel if the thread that started it goes away (so a crashed test run leaves nothing behind).
    Start peers from a long-lived thread (the test's thread, not a short-lived worker thread)."""
    _prepare_prctl()
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def reap(process: subprocess.Popen[bytes], *, grace_s: float = 3.0) -> int:
    """SIGTERM, wait `grace_s`, then SIGKILL; returns the exit status (negative: killed by a signal)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
    return int(process.returncode)


@atexit.register
def _reap_all() -> None:
    for phone in list(_live):
        phone.close()


# ---------------------------------------------------------------------------------------------- driver

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STATUS_LINE = re.compile(r"^\[\d+:\d\d:\d\d\] audio=.*$", re.MULTILINE)  # menu's per-100 ms call status
_BLANK_RUNS = re.compile(r"\n\s*\n(\s*\n)+")
_SRTP_ENABLED = re.compile(r"SRTP is Enabled \(cryptosuite=([A-Za-z0-9_]+)\)")


# The `-s` trace: "#", the transport and addresses, then the message's head, which ends in a blank line.
_TRACED = re.compile(r"^#\n(UDP|TCP|TLS) (\S+) -> (\S+)\n(.*?)\r\n\r\n", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class TracedMessage:
    """One SIP message in the `-s` trace: how it went, its start line and headers (not its body)."""

    transport: str  # UDP, TCP or TLS
    source: str  # host:port
    destination: str
    lines: tuple[str, ...]  # the start line, then one header a line

    @property
    def start_line(self) -> str:
        return self.lines[0]

    def header(self, name: str) -> str | None:
        """The first value of header `name` (full names only: the trace shows what baresip wrote)."""
        prefix = name.lower() + ":"
        for line in self.lines[1:]:
            if line.lower().startswith(prefix):
                return line[len(prefix) :].strip()
        return None

    @property
    def method(self) -> str:
        """The method of the request, or of the request a response answers (from CSeq)."""
        return (self.header("CSeq") or " ").split()[-1]

    @property
    def status(self) -> int | None:
        """A response's status code; None for a request."""
        parts = self.start_line.split()
        return int(parts[1]) if parts[0] == "SIP/2.0" and len(parts) > 1 and parts[1].isdigit() else None


def tls_uri(user: str, host: str, port: int) -> str:
    """A URI baresip 1.0 dials over TLS: it cannot dial `sips:` URIs, but takes `transport=tls`."""
    return f"sip:{user}@{host}:{port};transport=tls"


class Baresip:
    """One baresip process with its own config folder, on 127.0.0.1, G.711 only, no sound devices, no
    STUN/ICE, one account that never registers. A sync context manager: the process is reaped on exit.

    - `audio`: the WAV it says on every call (see `write_source_wav`); default: silence.
    - `auto_answer`: answer incoming calls at once (no CALL_INCOMING then); else `accept()`.
    - `codecs`: preference order, e.g. ("PCMA",) to offer/accept A-law only; default PCMU then PCMA.
    - `directory`: where config, logs and recordings go (pass `tmp_path / "name"` so pytest keeps them);
      default: a temporary folder removed on close.
    - `sip_trace`: `-s`, every SIP message in the log (`log_text()`).
    - `tls_ca_file`: `sip_cafile`, the PEM certificate(s) to trust when it calls over TLS (`tls_uri`);
      baresip 1.0 loads it but connects whatever the server presents (see above).
    - `media_encryption`: the account's `mediaenc`, e.g. "srtp-mand" (SDES-SRTP only) or "srtp" (offered,
      plain RTP accepted); default: plain RTP.

    Blocking calls (`wait_for_event`) must not run on an event loop that serves the other end of the
    call: in async tests use `wait_for_event_async`. Commands return within milliseconds (baresip answers
    them before the far end does anything).
    """

    def __init__(
        self,
        *,
        user: str = "peer",
        auto_answer: bool = False,
        audio: Path | str | None = None,
        codecs: Sequence[str] | None = None,
        directory: Path | str | None = None,
        sip_trace: bool = True,
        tls_ca_file: Path | str | None = None,
        media_encryption: str | None = None,
        start_timeout_s: float = 10.0,
    ) -> None:
        self.user = user
        self.tls_ca_file = Path(tls_ca_file).resolve() if tls_ca_file is not None else None
        self.media_encryption = media_encryption
        self.auto_answer = auto_answer
        self.codecs = tuple(codecs) if codecs else None
        self.sip_trace = sip_trace
        self.start_timeout_s = start_timeout_s
        self._own_directory = directory is None
        self.directory = (
            Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="baresip-"))
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.recordings_dir = self.directory / "recordings"
        self.log_path = self.directory / "baresip.log"
        self.events_path = self.directory / "events.jsonl"
        self.audio = Path(audio).resolve() if audio is not None else None
        self.sip_port = 0
        self.ctrl_port = 0
        self.rtp_ports = (0, 0)
        self.process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._events: list[Event] = []
        self._cursor = 0
        self._responses: dict[str, Mapping[str, Any]] = {}
        self._reader_done = False
        self._tokens = itertools.count(1)
        self._closed = False

    # -- lifecycle

    def __enter__(self) -> Baresip:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def uri(self) -> str:
        """What to dial to reach this phone (the user part must be the account's)."""
        return f"sip:{self.user}@127.0.0.1:{self.sip_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        if self.process is not None:
            raise RuntimeError("already started")
        self.recordings_dir.mkdir(parents=True, exist_ok=True)
        if self.audio is None:
            self.audio = silence_wav(self.directory / "silence.wav")
        _live.add(self)
        failures: list[str] = []
        for _attempt in range(5):
            self.sip_port = free_port_block(2, udp=True, tcp=True, step=1)  # SIP, then TLS on + 1
            self.ctrl_port = free_port(udp=False, tcp=True)
            rtp = free_port_block(RTP_PORT_COUNT, udp=True)
            self.rtp_ports = (rtp, rtp + RTP_PORT_COUNT - 1)
            self._write_config()
            self.log_path.write_text("")
            args = [BARESIP, "-f", str(self.directory)] + (["-s"] if self.sip_trace else [])
            self.process = spawn(args, log=self.log_path)
            outcome = self._wait_ready()
            if outcome == "ready":
                try:
                    self._connect()
                except OSError as error:
                    log = self.log_text()
                    self.close()
                    raise PeerError(
                        f"cannot connect to ctrl_tcp: {error}\n--- baresip log ---\n{log}"
                    ) from error
                return
            failures.append(f"attempt on SIP {self.sip_port}/ctrl {self.ctrl_port}: {outcome}")
            reap(self.process)
            if outcome != "port in use":
                break
        log = self.log_text()
        self.close()
        raise PeerError("baresip did not start: " + "; ".join(failures) + f"\n--- baresip log ---\n{log}")

    def _write_config(self) -> None:
        config = f"""\
# Written by tests/peers/baresip.py: headless, loopback only, G.711 only, controlled over ctrl_tcp.
poll_method		epoll
sip_listen		127.0.0.1:{self.sip_port}
net_interface		127.0.0.1
rtp_ports		{self.rtp_ports[0]}-{self.rtp_ports[1]}
rtcp_mux		no
jitter_buffer_delay	5-10
audio_source		aufile,{self.audio}
module_path		{MODULE_PATH}
module			g711.so
module			aufile.so
module			sndfile.so
module_app		account.so
module_app		menu.so
module_app		ctrl_tcp.so
ctrl_tcp_listen		127.0.0.1:{self.ctrl_port}
snd_path		{self.recordings_dir}
"""
        if self.tls_ca_file is not None:
            config += f"sip_cafile\t\t{self.tls_ca_file}\n"
        if self.media_encryption:
            config += "module\t\t\tsrtp.so\n"
        (self.directory / "config").write_text(config)
        account = f"<sip:{self.user}@127.0.0.1>;regint=0"
        if self.auto_answer:
            account += ";answermode=auto"
        if self.codecs:
            account += ";audio_codecs=" + ",".join(self.codecs)
        if self.media_encryption:
            account += f";mediaenc={self.media_encryption}"
        (self.directory / "accounts").write_text(account + "\n")
        # baresip writes default `contacts`, `current_contact` and `uuid` files next to these when absent.

    def _wait_ready(self) -> str:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "Address already in use" in text and ("ctrl_tcp" in text or self.process.poll() is not None):
                return "port in use"
            if self.process.poll() is not None:
                return f"exited with {self.process.returncode}"
            if READY_LINE in text:
                return "ready"
            time.sleep(0.02)
        return f"no {READY_LINE!r} within {self.start_timeout_s} s"

    def _connect(self) -> None:
        self._sock = socket.create_connection(("127.0.0.1", self.ctrl_port), timeout=5)
        self._sock.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, name=f"baresip-ctrl-{self.pid}", daemon=True)
        self._reader.start()

    def close(self) -> None:
        """Reap the process (SIGTERM: it hangs up its calls; SIGKILL after 3 s). Idempotent."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        if self.process is not None:
            reap(self.process)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._reader is not None:
            self._reader.join(2)
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- ctrl_tcp

    def _read_loop(self) -> None:
        assert self._sock is not None
        buffer = b""
        with open(self.events_path, "a") as events_log:
            while True:
                try:
                    chunk = self._sock.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                buffer += chunk
                while True:
                    colon = buffer.find(b":")
                    if colon < 0:
                        break
                    length = int(buffer[:colon])
                    end = colon + 1 + length
                    if len(buffer) < end + 1:  # the body and its trailing ","
                        break
                    body, buffer = buffer[colon + 1 : end], buffer[end + 1 :]
                    message = json.loads(body)
                    at = time.monotonic()
                    if message.get("event"):
                        events_log.write(json.dumps({"at": round(at, 3), **message}) + "\n")
                        events_log.flush()
                    with self._cond:
                        if message.get("event"):
                            self._events.append(Event.from_json(message, at))
                        elif message.get("response"):
                            self._responses[str(message.get("token", ""))] = message
                        self._cond.notify_all()
        with self._cond:
            self._reader_done = True
            self._cond.notify_all()

    def command(self, name: str, params: str | None = None, *, timeout: float = 5.0) -> str:
        """Run a menu long command (e.g. "dial", "sip:x@127.0.0.1:5060"); returns its `data` text."""
        if self._sock is None:
            raise RuntimeError("not started")
        token = str(next(self._tokens))
        request: dict[str, str] = {"command": name, "token": token}
        if params is not None:
            request["params"] = params
        body = json.dumps(request).encode()
        with self._send_lock:
            self._sock.sendall(str(len(body)).encode() + b":" + body + b",")
        deadline = time.monotonic() + timeout
        with self._cond:
            while token not in self._responses:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._reader_done:
                    raise PeerError(self.describe(f"no answer to {name} {params or ''}"))
                self._cond.wait(min(remaining, 0.2))
            response = self._responses.pop(token)
        data = str(response.get("data", ""))
        if not response.get("ok"):
            raise CommandError(self.describe(f"{name} {params or ''} failed: {data.strip()}"))
        return data

    def dial(self, uri: str) -> None:
        """Call `uri` (e.g. "sip:agent@127.0.0.1:5080"); then wait for CALL_ESTABLISHED."""
        self.command("dial", uri)

    def accept(self) -> None:
        """Answer the ringing incoming call (manual answer mode)."""
        self.command("accept")

    def hangup(self) -> None:
        """Hang up the current call (sends BYE, or CANCEL while ringing)."""
        self.command("hangup")

    def send_dtmf(self, digits: str) -> None:
        """Send digits (0-9 * # A-D) as RFC 4733 telephone-events in the current call's RTP."""
        if not re.fullmatch(r"[0-9*#A-Da-d]+", digits):
            raise ValueError(f"not DTMF digits: {digits!r}")
        self.command("sndcode", digits)

    def set_audio_source(self, wav: Path | str) -> None:
        """Switch the microphone to another WAV (see `write_source_wav`) now, in the running call, and for
        later calls."""
        self.command("ausrc", f"aufile,{wav}")

    def set_auto_answer(self, enabled: bool) -> None:
        self.command("answermode", "auto" if enabled else "manual")

    # -- events

    @property
    def events(self) -> list[Event]:
        """Every event so far (a copy)."""
        with self._cond:
            return list(self._events)

    def received_dtmf(self) -> str:
        """The digits the far end sent so far, from CALL_DTMF_START events."""
        return "".join(e.param for e in self.events if e.kind == "CALL_DTMF_START")

    def skip_pending_events(self) -> None:
        """Make the next `wait_for_event` look only at events arriving from now on."""
        with self._cond:
            self._cursor = len(self._events)

    def _scan(self, kind: str, fail_on: Iterable[str]) -> Event | None:
        # Under self._cond. Events are read in order: each wait starts after the last event it returned.
        failing = set(fail_on)
        while self._cursor < len(self._events):
            event = self._events[self._cursor]
            self._cursor += 1
            if event.kind == kind:
                return event
            if event.kind in failing:
                raise PeerError(self.describe(f"{event.kind} {event.param!r} while waiting for {kind}"))
        return None

    def wait_for_event(self, kind: str, timeout: float = 10.0, *, fail_on: Iterable[str] = ()) -> Event:
        """The next `kind` event (e.g. "CALL_ESTABLISHED"), after the one the previous wait returned.

        Raises PeerError (with the logs) on timeout, if the process or its control connection ends, or at
        once if an event in `fail_on` comes first (e.g. fail_on=("CALL_CLOSED",) for an answer)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self._scan(kind, fail_on)
                if found is not None:
                    return found
                if self._reader_done:
                    raise PeerError(self.describe(f"baresip went away while waiting for {kind}"))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PeerError(self.describe(f"no {kind} within {timeout} s"))
                self._cond.wait(min(remaining, 0.2))

    async def wait_for_event_async(
        self, kind: str, timeout: float = 10.0, *, fail_on: Iterable[str] = ()
    ) -> Event:
        """`wait_for_event` that keeps the event loop running (poll every 10 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                found = self._scan(kind, fail_on)
                done = self._reader_done
            if found is not None:
                return found
            if done:
                raise PeerError(self.describe(f"baresip went away while waiting for {kind}"))
            if time.monotonic() >= deadline:
                raise PeerError(self.describe(f"no {kind} within {timeout} s"))
            await asyncio.sleep(0.01)

    # -- recordings and logs

    def recording_paths(self, direction: str = "dec") -> list[Path]:
        """sndfile's files, oldest call first: "dec" = received (heard), "enc" = sent."""
        return sorted(
            self.recordings_dir.glob(f"dump-*-{direction}.wav"), key=lambda p: (p.name, p.stat().st_mtime)
        )

    def _read_recording(self, direction: str, call: int) -> tuple[np.ndarray, int]:
        paths = self.recording_paths(direction)
        if not paths:
            raise PeerError(self.describe(f"no {direction} recording in {self.recordings_dir}"))
        data, rate = soundfile.read(paths[call], dtype="int16", always_2d=False)
        return np.asarray(data, dtype=np.int16), int(rate)

    def recorded_received(self, call: int = -1) -> tuple[np.ndarray, int]:
        """What this phone heard in a call (default: the latest), decoded: (int16 mono, 8000)."""
        return self._read_recording("dec", call)

    def recorded_sent(self, call: int = -1) -> tuple[np.ndarray, int]:
        """What this phone said in a call (its source, before the encoder): (int16 mono, 8000)."""
        return self._read_recording("enc", call)

    def log_text(self, max_chars: int | None = 20000) -> str:
        """baresip's stdout+stderr, without colour codes and the per-call status lines (the last
        `max_chars`)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        text = _ANSI.sub("", text).replace("\r", "\n")
        text = _BLANK_RUNS.sub("\n\n", _STATUS_LINE.sub("", text))
        return text[-max_chars:] if max_chars else text

    def srtp_suites(self) -> list[str]:
        """The SRTP crypto suite of each stream whose keys agreed, as it logged them so far."""
        return _SRTP_ENABLED.findall(self.log_text(max_chars=None))

    def sip_messages(self) -> list[TracedMessage]:
        """Every SIP message it sent or received so far, oldest first (needs `sip_trace`)."""
        try:
            # Bytes, not read_text: universal newlines would turn the messages' CRLFs into LFs.
            text = _ANSI.sub("", self.log_path.read_bytes().decode(errors="replace"))
        except FileNotFoundError:
            return []
        return [
            TracedMessage(transport, source, destination, tuple(head.split("\r\n")))
            for transport, source, destination, head in _TRACED.findall(text)
        ]

    def event_log_text(self) -> str:
        return "\n".join(e.line() for e in self.events)

    def describe(self, problem: str) -> str:
        """`problem` with the events and the log tail, for an assertion message."""
        return (
            f"baresip {self.user} (pid {self.pid}, SIP 127.0.0.1:{self.sip_port}): {problem}\n"
            f"--- events ---\n{self.event_log_text()}\n--- log ({self.log_path}) ---\n{self.log_text(6000)}"
        )
