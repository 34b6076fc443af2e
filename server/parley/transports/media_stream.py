"""Carrier media streams: phone calls that a carrier (Twilio, Telnyx) streams to us over a WebSocket.

A call arrives in two requests. The carrier POSTs it to `/<carrier>/voice` (carrier_webhooks.py); we
check the carrier's signature, refuse with a busy signal when no call can be taken, and answer markup
that connects the call to `wss://<public host>/<carrier>/stream`, passing the webhook's query parameters,
the caller's and the called number, and (when a stream secret is set) a token bound to the carrier's call
id as custom parameters. The carrier then opens `/<carrier>/stream` and sends `start`: the token is
checked and the stream becomes a Call (`open_call`, 8 kHz both ways; stream_opening.py), whose custom
parameters are its variables.

Caller audio (G.711, 20 ms per `media` message) goes to `Call.push_audio`; keypad digits to
`Call.dtmf_received`. The agent's voice is pulled from the call's Outbound at real time (`send_paced`, so
the carrier's buffer stays about one frame deep) and sent as mu-law `media`, each chunk (a TTS sentence)
followed by a `mark`. The carrier echoes a mark when the audio before it has played, and the Outbound
counts only such audio as heard (`confirm_by_marks`); a barge-in flushes the Outbound, which sends `clear`.
`stop` or a closed socket ends the call. Bad messages are logged and counted, and the call goes on.

What the agent does to the line: the markup's `<Connect>` names an action URL (Twilio: its `action`
attribute; Telnyx's TeXML `<Connect>` has none, but runs the verbs after it once the stream stops, so a
`<Redirect>` there asks the same URL). When the call ends from our side we close the stream and the
carrier asks `/<carrier>/connect-action` what next: a transfer the agent asked for (kept per carrier call
id in `Handoffs`) is answered `<Dial>`, anything else `<Hangup/>`. Neither stream takes digit events from
us, so keypad digits go out as in-band DTMF tones in place of the agent's audio (dtmf_tones.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from aiohttp import WSCloseCode, WSMsgType, web

from parley import metrics
from parley.audio import alaw_decode, samples_per_frame, ulaw_decode, ulaw_encode
from parley.call import Call
from parley.log import event
from parley.transports.base import HangUp, LineActionFailed, send_paced
from parley.transports.dtmf_tones import KeypadTones
from parley.transports.line import keypad_digits, transfer_destination
from parley.transports.twilio import MULAW, StreamStart

log = logging.getLogger(__name__)

CARRIER_RATE = 8000
FRAME_BYTES = samples_per_frame(CARRIER_RATE)  # G.711: one byte a sample, 160 per 20 ms
MAX_MESSAGE_BYTES = 64 * 1024  # a media message is ~300 bytes, a start with parameters a few KB
CLOSE_TIMEOUT_S = 2.0  # how long a close waits for the carrier's close frame
MEDIA_TIMEOUT_S = 30.0  # a stream with no message for this long is ended
MARK_TIMEOUT_S = 5.0  # a mark not echoed this long after its audio went out is taken as played
MARK_CHECK_FRAMES = 50
OUTBOX_LIMIT = 100  # 2 s of media queued for a socket that does not drain: drop, do not grow
MAX_PARAMETERS = 32
MAX_PARAMETER_CHARS = 1024
LOG_EVERY = 100  # a peer that sends garbage 50 times a second gets a log line now and then, not each time
DTMF_DIGITS = frozenset("0123456789*#ABCD")
HANDOFF_TTL_S = 120.0  # the carrier asks the action URL within a second of the stream closing
MAX_HANDOFFS = 10_000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Carrier(Protocol):
    """One carrier's side of the protocol (twilio.py, telnyx.py)."""

    name: str  # the calls' transport and the routes' prefix
    stream_attributes: Mapping[str, str]  # extra attributes of the markup's <Stream>

    @property
    def signs_webhooks(self) -> bool:
        """Its webhooks are checked (a credential is set): a stream token then proves the carrier."""
        ...

    def webhook_problem(
        self, url: str, headers: Mapping[str, str], body: bytes, params: Sequence[tuple[str, str]], now: float
    ) -> str | None: ...

    def connect_markup(self, stream_url: str, parameters: Mapping[str, str], action_url: str) -> str: ...

    def parse_start(self, message: Mapping[str, Any]) -> StreamStart: ...

    def media(self, stream_id: str, payload: str) -> dict[str, Any]: ...

    def mark(self, stream_id: str, name: str) -> dict[str, Any]: ...

    def clear(self, stream_id: str) -> dict[str, Any]: ...


def count_problem(carrier: str, reason: str) -> None:
    metrics.TRANSPORT_ERRORS_TOTAL.labels(transport=carrier, reason=reason).inc()


class Handoffs:
    """Transfers waiting for the carrier's action request: the destination per carrier call id, taken
    once, forgotten after HANDOFF_TTL_S. Used on the event loop."""

    def __init__(self, ttl_s: float = HANDOFF_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._waiting: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def hold(self, carrier: str, call_id: str, destination: str, now: float) -> None:
        self._expire(now)
        self._waiting[(carrier, call_id)] = (destination, now + self.ttl_s)
        while len(self._waiting) > MAX_HANDOFFS:
            self._waiting.popitem(last=False)

    def take(self, carrier: str, call_id: str, now: float) -> str | None:
        self._expire(now)
        held = self._waiting.pop((carrier, call_id), None)
        return held[0] if held is not None else None

    def _expire(self, now: float) -> None:
        while self._waiting and next(iter(self._waiting.values()))[1] < now:
            self._waiting.popitem(last=False)


class MediaStream:
    """One carrier stream and its call: the call's transport over a media-stream WebSocket."""

    def __init__(
        self,
        call: Call,
        ws: web.WebSocketResponse,
        carrier: Carrier,
        start: StreamStart,
        hang_up: HangUp,
        handoffs: Handoffs,
    ) -> None:
        self.call = call
        self.ws = ws
        self.carrier = carrier
        self.start = start
        self._hang_up = hang_up
        self._handoffs = handoffs
        self._tones = KeypadTones(CARRIER_RATE, FRAME_BYTES)
        self._loop = asyncio.get_running_loop()
        self._decode = ulaw_decode if start.encoding == MULAW else alaw_decode
        self._outbox: deque[str] = deque()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._frames = 0
        self._problems: dict[str, int] = {}

    def begin(self) -> None:
        """Start sending: the paced reply audio and the socket writer."""
        pacing = send_paced(self._pull, self._send, call_id=self.call.call_id)
        self._tasks = [asyncio.ensure_future(self._write()), asyncio.ensure_future(pacing)]

    # the Transport protocol

    def deliver_event(self, payload: dict[str, Any]) -> None:
        """Nothing to show on a phone: operators follow the call through the call API."""

    def audio_flushed(self) -> None:
        """A barge-in flushed the reply (called on the call's VAD thread): the carrier must drop what
        it buffered, at once."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._clear)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._tones.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.close(code=WSCloseCode.OK, message=b"call ended")

    async def transfer(self, destination: str) -> None:
        """Keep the destination for the carrier's action request and end the call: closing the stream
        ends `<Connect>`, and the carrier then asks what next (see the module's docstring)."""
        target = transfer_destination(destination)
        if self._closed:
            raise LineActionFailed("the call has ended")
        self._handoffs.hold(self.carrier.name, self.start.call_id, target.text, time.monotonic())
        event(log, "stream_transfer", call_id=self.call.call_id, carrier=self.carrier.name, to=target.text)
        self._hang_up("transferred")

    async def send_dtmf(self, digits: str) -> None:
        """Play the digits as tones in place of the agent's audio; returns once they have gone out."""
        keys = keypad_digits(digits)
        if self._closed:
            raise LineActionFailed("the call has ended")
        try:
            await self._tones.add(keys)
        except asyncio.CancelledError:
            if self._closed:  # the stream closed under the digits, not the caller giving up
                raise LineActionFailed("the call ended before the digits were sent") from None
            raise

    # from the carrier

    async def run(self) -> str:
        """Read the carrier's messages until the stream ends; returns why it ended."""
        while True:
            try:
                msg = await self.ws.receive(timeout=MEDIA_TIMEOUT_S)
            except TimeoutError:  # a carrier sends media every 20 ms, silence included: this one is gone
                self._problem("media_timeout")
                return "media_timeout"
            if msg.type is WSMsgType.TEXT:
                if not self.handle(msg.data):
                    return "hangup"
            elif msg.type is WSMsgType.BINARY:
                self._problem("binary")
            elif msg.type is WSMsgType.ERROR:  # aiohttp has closed the socket (e.g. 1009, too big)
                too_big = getattr(msg.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG
                self._problem("too_big" if too_big else "stream_error")
                return "stream_error"
            else:
                if not self._closed:  # a carrier sends `stop` first: this one vanished
                    self._problem("closed_without_stop")
                return "hangup"

    def handle(self, text: str) -> bool:
        """One text message from the carrier; False when it ends the stream (`stop`)."""
        message = json_object(text)
        if message is None:
            self._problem("bad_json")
            return True
        kind = message.get("event")
        if kind == "media":
            self._media(message.get("media"))
        elif kind == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            if isinstance(name, str):
                self.call.outbound.mark_played(name)  # False for marks echoed after a clear: expected
            else:
                self._problem("bad_mark")
        elif kind == "dtmf":
            self._dtmf(message.get("dtmf"))
        elif kind == "stop":
            return False
        elif kind == "error":  # Telnyx reports a failed command (e.g. media it could not play)
            self._problem("carrier_error", detail=str(message.get("payload", ""))[:200])
        elif kind in ("connected", "start"):
            self._problem("unexpected_event")
        else:
            self._problem("unknown_event")
        return True

    def _media(self, media: Any) -> None:
        if not isinstance(media, dict) or not isinstance(media.get("payload"), str):
            self._problem("bad_media")
            return
        if media.get("track", "inbound") not in ("inbound", "inbound_track"):
            return  # the other leg's audio, which a both-tracks stream also sends
        try:
            data = base64.b64decode(media["payload"], validate=True)
        except (binascii.Error, ValueError):
            self._problem("bad_media")
            return
        if not data or len(data) % FRAME_BYTES:
            self._problem("bad_frame")
            return
        self.call.push_audio(self._decode(data), CARRIER_RATE)

    def _dtmf(self, dtmf: Any) -> None:
        digit = dtmf.get("digit") if isinstance(dtmf, dict) else None
        if not isinstance(digit, str) or digit.upper() not in DTMF_DIGITS:
            self._problem("bad_dtmf")
            return
        self.call.dtmf_received(digit.upper())

    def _problem(self, reason: str, **fields: Any) -> None:
        count_problem(self.carrier.name, reason)
        seen = self._problems[reason] = self._problems.get(reason, 0) + 1
        if seen == 1 or seen % LOG_EVERY == 0:
            event(
                log,
                "stream_bad_message",
                logging.WARNING,
                call_id=self.call.call_id,
                reason=reason,
                seen=seen,
                **fields,
            )

    # to the carrier

    def _pull(self) -> np.ndarray:
        self._frames += 1
        if self._frames % MARK_CHECK_FRAMES == 0:
            for _ in self.call.outbound.expire_marks(MARK_TIMEOUT_S):
                self._problem("mark_timeout")
        tone = self._tones.next_frame()
        return tone if tone is not None else self.call.outbound.pull_frame()

    def _send(self, frame: np.ndarray) -> None:
        # Digital silence is what the carrier plays when nothing arrives; sending it would only fill
        # its buffer ahead of the next reply. The pauses between keypad tones go out, so that the
        # carrier plays them in time rather than running two tones together.
        if frame.any() or self._tones.playing:
            payload = base64.b64encode(ulaw_encode(frame)).decode()
            self._post(self.carrier.media(self.start.stream_id, payload), media=True)
        for mark in self.call.outbound.take_marks():
            self._post(self.carrier.mark(self.start.stream_id, mark))

    def _clear(self) -> None:
        # Anything still queued here was flushed too; the clear goes out first and alone.
        self._outbox.clear()
        self._post(self.carrier.clear(self.start.stream_id))

    def _post(self, message: dict[str, Any], *, media: bool = False) -> None:
        if self._closed:
            return
        if media and len(self._outbox) >= OUTBOX_LIMIT:
            self._problem("send_backlog")
            return
        self._outbox.append(json.dumps(message, separators=(",", ":")))
        self._wake.set()

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox:
                    await self.ws.send_str(self._outbox.popleft())
        except (ConnectionError, RuntimeError):
            return  # the socket went away: the reader sees it and ends the call


def json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # deep nesting raises RecursionError
        return None
    return value if isinstance(value, dict) else None
