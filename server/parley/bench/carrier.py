"""A scripted phone caller behind a carrier: plays Twilio (or Telnyx) towards the service, the way the
carriers document their voice webhooks and bidirectional media streams.

It posts the call to `/<carrier>/voice` as the carrier would (signed, when given the auth token),
follows the `<Connect><Stream>` of the answer to the WebSocket, and from there acts as the carrier's
media server:
- it sends `connected`, `start` (with the markup's custom parameters), then a `media` message every
  20 ms: mu-law, 8 kHz, the caller's queued clips and silence between them (a phone line always carries
  sound); `dtmf` for keys pressed and `stop` when it hangs up;
- it plays the `media` it receives from a buffer in real time, echoes each `mark` once the audio sent
  before it has played, and on `clear` drops the buffer and echoes the marks still in it at once.

What the caller heard is kept one entry per 20 ms as played (`heard`, as for the other scripted
callers), next to when each `media`, `mark` and `clear` arrived; the call's events come from
`GET /api/calls/<id>/events`. Used by the carrier integration tests.

Given a scenario's `line` (scenarios/line.py), its noise is under every frame and its `media` messages
go through the line's losses, jitter and stalls.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree

import aiohttp
import numpy as np

from parley.audio import rms_dbfs, ulaw_decode, ulaw_encode
from parley.bench.listening import CallFailed, Ears, LineConditions, Mouth
from parley.transports.base import FrameClock

CARRIER_RATE = 8000
FRAME = 160  # 20 ms of 8 kHz mu-law


class CarrierCaller(Ears):
    mic: Mouth

    def __init__(
        self,
        base_url: str,
        *,
        carrier: str = "twilio",
        number: str = "",
        called: str = "+15550199999",
        auth_token: str = "",
        query: str = "",
        line: LineConditions | None = None,
    ) -> None:
        super().__init__(CARRIER_RATE)
        self.base_url = base_url.rstrip("/")
        self.carrier = carrier
        self.number = number or f"+1555{secrets.randbelow(10**7):07d}"
        self.called = called
        self.auth_token = auth_token
        self.query = query
        if line is not None:
            line.codec_for("carrier")  # a carrier's stream is mu-law: a line asking for another is refused
        self.line = line
        self.mic = Mouth(CARRIER_RATE, frame_filter=line.noisy(CARRIER_RATE) if line is not None else None)
        self._line_media: Callable[[str], None] | None = None  # sends a media message through the line
        self.call_sid = ("CA" if carrier == "twilio" else "v3:") + secrets.token_hex(16)
        self.stream_id = ("MZ" if carrier == "twilio" else "") + secrets.token_hex(16)
        self.call_id = ""  # the service's
        self.arrivals: list[tuple[float, float]] = []  # (time, level) of each media message received
        self.marks_played: list[tuple[float, str]] = []
        self.marks_cleared: list[tuple[float, str]] = []
        self.clears: list[float] = []
        self.close_code: int | None = None
        self._playout: deque[np.ndarray | str] = deque()  # audio frames, and mark names behind them
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sequence = 0
        self._chunk = 0

    # the webhook, as the carrier calls it

    async def answer(self) -> tuple[str, dict[str, str]]:
        """POST the call to the voice webhook; returns the stream URL and custom parameters to use."""
        path = f"/{self.carrier}/voice" + (f"?{self.query}" if self.query else "")
        form = {"CallSid": self.call_sid, "AccountSid": "AC0", "From": self.number, "To": self.called}
        headers = {}
        if self.auth_token:
            signed = self.base_url + path + "".join(k + v for k, v in sorted(form.items()))
            digest = hmac.new(self.auth_token.encode(), signed.encode(), hashlib.sha1).digest()
            headers["X-Twilio-Signature"] = base64.b64encode(digest).decode()
        assert self._session is not None
        async with self._session.post(self.base_url + path, data=form, headers=headers) as r:
            body = await r.text()
            if r.status != 200:
                raise CallFailed(f"webhook refused: {r.status} {body}")
        root = ElementTree.fromstring(body)
        reject = root.find("Reject")
        if reject is not None:
            raise CallFailed("rejected: " + reject.attrib.get("reason", ""))
        stream = root.find("./Connect/Stream")
        if stream is None:
            raise CallFailed(f"no <Connect><Stream> in {body}")
        params = {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}
        return stream.attrib["url"], params

    async def connect(self, timeout: float = 20.0) -> str:
        """Place the call and start streaming; returns the service's call id."""
        self._session = aiohttp.ClientSession()
        url, params = await self.answer()
        self._ws = await self._session.ws_connect(url)
        if self.line is not None:
            self._line_media = self.line.impair(self._ws.send_str)
        await self._send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self._send({"event": "start", "start": self._start(params)})
        self._tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._tick())]
        self.call_id = await self._find_call(timeout)
        self._tasks.append(asyncio.ensure_future(self.follow_events(self.base_url, self.call_id)))
        return self.call_id

    def _start(self, params: dict[str, str]) -> dict[str, Any]:
        if self.carrier == "twilio":
            return {
                "accountSid": "AC0",
                "streamSid": self.stream_id,
                "callSid": self.call_sid,
                "tracks": ["inbound"],
                "customParameters": params,
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": CARRIER_RATE, "channels": 1},
            }
        return {
            "call_control_id": self.call_sid,
            "from": self.number,
            "to": self.called,
            "custom_parameters": params,
            "media_format": {"encoding": "PCMU", "sample_rate": CARRIER_RATE, "channels": 1},
        }

    async def _find_call(self, timeout: float) -> str:
        assert self._session is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            async with self._session.get(f"{self.base_url}/api/calls") as r:
                for call in await r.json():
                    if call["caller"] == self.number and call["transport"] == self.carrier:
                        return str(call["id"])
            if self.close_code is not None:
                raise CallFailed(f"the stream was closed: {self.close_code}")
            await asyncio.sleep(0.05)
        raise CallFailed("the call did not start")

    # the media server

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None
        await self._ws.send_str(self._numbered(message))

    def _numbered(self, message: dict[str, Any]) -> str:
        self._sequence += 1
        key = "streamSid" if self.carrier == "twilio" else "stream_id"
        number = "sequenceNumber" if self.carrier == "twilio" else "sequence_number"
        return json.dumps({**message, number: str(self._sequence), key: self.stream_id})

    async def _tick(self) -> None:
        """Every 20 ms: one frame of the caller's voice out, one frame of the agent's played."""
        clock = FrameClock()
        while True:
            await clock.tick()
            now = time.monotonic()
            pcm = self.mic.next_frame(now)
            self._chunk += 1
            media = {"track": "inbound", "chunk": str(self._chunk), "timestamp": str(self._chunk * 20)}
            message = {"event": "media", "media": {**media, "payload": _b64(ulaw_encode(pcm))}}
            if self._line_media is None:
                await self._send(message)
            else:  # numbered as it leaves, so that a message the line loses leaves a gap
                self._line_media(self._numbered(message))
            await self._echo_due_marks()
            frame = self._playout.popleft() if self._playout else np.zeros(FRAME, dtype=np.int16)
            assert isinstance(frame, np.ndarray)
            self.heard.times.append(now)
            self.heard.levels.append(rms_dbfs(frame))
            self.heard.pcm.append(frame)

    async def _echo_due_marks(self) -> None:
        """Marks at the head of the buffer: everything sent before them has played."""
        while self._playout and isinstance(self._playout[0], str):
            name = self._playout.popleft()
            assert isinstance(name, str)
            self.marks_played.append((time.monotonic(), name))
            await self._send({"event": "mark", "mark": {"name": name}})

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            message = json.loads(msg.data)
            kind = message.get("event")
            if kind == "media":
                data = ulaw_decode(base64.b64decode(message["media"]["payload"]))
                self.arrivals.append((time.monotonic(), rms_dbfs(data)))
                self._playout.extend(data[i : i + FRAME] for i in range(0, data.size, FRAME))
            elif kind == "mark":
                self._playout.append(message["mark"]["name"])
            elif kind == "clear":
                self.clears.append(time.monotonic())
                cleared = [item for item in self._playout if isinstance(item, str)]
                self._playout.clear()
                for name in cleared:
                    self.marks_cleared.append((time.monotonic(), name))
                    await self._send({"event": "mark", "mark": {"name": name}})
        self.close_code = self._ws.close_code

    # the caller

    def press(self, digits: str) -> None:
        for digit in digits:
            task = asyncio.ensure_future(
                self._send({"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": digit}})
            )
            self._tasks.append(task)

    async def send_raw(self, text: str) -> None:
        """Anything, as a text message (for tests of what the service does with garbage)."""
        assert self._ws is not None
        await self._ws.send_str(text)

    def first_media_after(self, after: float, min_dbfs: float = -45.0) -> float | None:
        return next((t for t, level in self.arrivals if t >= after and level > min_dbfs), None)

    async def hangup(self) -> None:
        if self.line is not None:
            self.line.close()
        if self._ws is not None and not self._ws.closed:
            with contextlib.suppress(Exception):
                await self._send({"event": "stop", "stop": {"accountSid": "AC0", "callSid": self.call_sid}})
                await self._ws.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> CarrierCaller:
        try:
            await self.connect()
        except BaseException:
            await self.hangup()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.hangup()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
