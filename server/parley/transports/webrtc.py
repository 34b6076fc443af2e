"""WebRTC transport (aiortc): Opus in and out, events to the page over a data channel.

Caller audio arrives as 48 kHz Opus frames and is turned into 16 kHz mono for the call; reply audio is
pulled from the call's Outbound in 20 ms frames, paced by the track's clock (the tracks: webrtc_tracks.py;
the offer's checks and the ICE servers: webrtc_signaling.py). The `events` data channel that the page
opens carries the call's JSON events.

A browser has no telephone line behind it, so what the agent does to the line reaches the page as events
(spec: "WebRTC: a page event"): `{"type": "transfer", "to": ...}` before the call ends as transferred,
`{"type": "dtmf_out", "digits": ...}`, and `{"type": "hangup", "reason": ...}` just before the call's
final state, whoever ended it; the events are through before the peer connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)

from parley import metrics
from parley.call import Call
from parley.limits import BadJson, MessageGuard, parse_json
from parley.log import event
from parley.transports.base import Connect, HangUp, LineActionFailed
from parley.transports.line import keypad_digits, transfer_destination
from parley.transports.opus_inbound import InlineDecoding, decode_inline
from parley.transports.opus_packets import first_audio_codec
from parley.transports.webrtc_signaling import SignalingError, validate_offer_sdp
from parley.transports.webrtc_tracks import OutboundTrack, audio_frames, set_jitter_prefetch

log = logging.getLogger(__name__)

EVENTS_LABEL = "events"
MAX_PENDING_EVENTS = 200
LOG_EVERY = 100  # a page that floods bad messages gets a log line now and then, not one each
MEDIA_CHECK_S = 1.0  # how often a call's inbound audio is checked for having stopped
EVENTS_DRAIN_S = 0.5  # how long a close waits for the last events to be acknowledged by the page
INBOUND_JITTER_FRAMES = 1


def answering(offer_sdp: str, ice_servers: list[RTCIceServer]) -> Connect[WebRtcPeer]:
    """How `open_call` connects a browser's offer: answer it (SignalingError if it cannot be used)."""

    async def connect(call: Call, hang_up: HangUp) -> WebRtcPeer:
        peer = WebRtcPeer(call, ice_servers, hang_up)
        try:
            peer.answer_sdp = await peer.answer(offer_sdp)
        except BaseException:
            await peer.close()
            raise
        return peer

    return connect


class WebRtcPeer:
    """One browser (or WHIP client) and its call: the call's transport over WebRTC."""

    def __init__(self, call: Call, ice_servers: list[RTCIceServer], on_gone: HangUp) -> None:
        self.call = call
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers))
        self._on_gone = on_gone
        self._loop = asyncio.get_running_loop()
        self._channel: RTCDataChannel | None = None
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._heard_track = False
        self._audio_at = 0.0  # when the caller's last audio frame arrived (monotonic), 0 before the first
        self.inbound: InlineDecoding | None = None  # the caller's audio, decoded as it arrives
        settings = call.settings
        self._inbound = MessageGuard(
            settings.max_dc_message_bytes, settings.max_dc_messages_per_s, time.monotonic()
        )
        self._problems: dict[str, int] = {}
        self.answer_sdp = ""
        self._track = OutboundTrack(call.outbound)
        self.pc.addTrack(self._track)
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)

    async def answer(self, offer_sdp: str) -> str:
        validate_offer_sdp(offer_sdp)
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
            answer = await self.pc.createAnswer()
            await self.pc.setLocalDescription(answer)
            if first_audio_codec(self.pc.localDescription.sdp) == "opus":
                self._track.encode_opus()
        except Exception as exc:  # aiortc's SDP handling also asserts on malformed or inconsistent offers
            raise SignalingError(f"the offer could not be used: {str(exc) or 'malformed SDP'}") from exc
        self._spawn(self._watch_connect())
        return str(self.pc.localDescription.sdp)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._drain_events()
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        try:
            await self.pc.close()
        except Exception as exc:
            # aiortc's close stops transceivers, then SCTP, then the transports, and gives up at the first
            # that fails: after an answer that failed half-way (an offer whose BUNDLE names a section with
            # no mid, found by the fuzzer) its SCTP has no transport. Stop what it left running. (Logged
            # without the traceback, whose frames would keep the peer connection alive with the record.)
            event(log, "peer_close_failed", logging.WARNING, call_id=self.call.call_id, error=repr(exc))
            await self._stop_transports()
        if self.inbound is not None:
            self.inbound.close()  # a receiver that never started never told it the end
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_transports(self) -> None:
        """Each DTLS transport and the ICE transport under it, whatever state the peer connection is in."""
        dtls = [t.receiver.transport for t in self.pc.getTransceivers()]
        if self.pc.sctp is not None:
            dtls.append(self.pc.sctp.transport)
        for transport in [t for t in dtls if t is not None]:
            for layer in (transport, transport.transport):
                with contextlib.suppress(Exception):
                    await layer.stop()
        self.pc.remove_all_listeners()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # media

    @property
    def connected(self) -> bool:
        return bool(self.pc.connectionState == "connected")

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self._heard_track:  # one caller: one audio track is heard
            return
        self._heard_track = True
        settings = self.call.settings
        if settings.media_timeout_s:
            self._spawn(self._watch_media(settings.media_timeout_s, settings.connect_timeout_s))
        self.inbound = InlineDecoding(self._heard, self._track_ends)
        if not decode_inline(self.pc, track, self.inbound):
            self.inbound = None
            set_jitter_prefetch(self.pc, INBOUND_JITTER_FRAMES)
            self._spawn(self._pump_inbound(track))

    def _heard(self, mono: np.ndarray, rate: int) -> None:
        self._audio_at = time.monotonic()
        self.call.push_audio(mono, rate)

    async def _pump_inbound(self, track: MediaStreamTrack) -> None:
        """The track's frames as aiortc decodes them, where its decoder could not be replaced."""
        async for rate, mono in audio_frames(track):
            self._heard(mono, rate)
        self._track_ended()

    def _track_ends(self) -> None:
        # Told from within aiortc's receiver stop: acted on once that is through.
        self._loop.call_soon(self._track_ended)

    def _track_ended(self) -> None:
        if not self._closed:
            self._on_gone("hangup")

    async def _watch_media(self, idle_s: float, connect_s: float) -> None:
        """A browser sends audio every 20 ms, silence included: a peer that sends nothing for `idle_s` has
        vanished (a dead network, a suspended laptop), where ICE consent would take 30 s to say so. One
        check a second: a timeout on every frame's wait cost ~8 % of a call's media CPU (py-spy)."""
        deadline = time.monotonic() + connect_s + idle_s  # the first frame waits for the connection too
        while not self._closed:
            await asyncio.sleep(MEDIA_CHECK_S)
            if self._audio_at:
                deadline = self._audio_at + idle_s
            if time.monotonic() > deadline and not self._closed:
                metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="webrtc", reason="media_timeout").inc()
                event(log, "media_timeout", logging.WARNING, call_id=self.call.call_id, idle_s=idle_s)
                self._on_gone("media_timeout")
                return

    # events

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_LABEL:
            return
        self._channel = channel

        def flush_pending() -> None:
            while self._pending and channel.readyState == "open":
                channel.send(self._pending.popleft())

        channel.on("open", flush_pending)
        channel.on("message", self._on_page_message)
        if channel.readyState == "open":
            flush_pending()

    def _on_page_message(self, message: str | bytes) -> None:
        """A message from the page: `{"type": "ping"}` (any `id` is echoed) is answered with a `pong`;
        anything else gets an `error` event. Bounded in size and rate (--max-dc-message-bytes,
        --max-dc-messages-per-s); a page that goes on flooding has its channel closed (the call goes on)."""
        size = len(message.encode("utf-8", "replace") if isinstance(message, str) else message)
        refused = self._inbound.admit(size, time.monotonic())
        if refused is not None:
            self._page_problem(f"dc_{refused}", size=size)
            if refused == "too_big":
                self._answer_error(f"message too large (limit {self._inbound.max_bytes} bytes)")
            channel = self._channel
            if self._inbound.flooding and channel is not None and channel.readyState == "open":
                event(log, "data_channel_closed", logging.WARNING, call_id=self.call.call_id, reason="flood")
                channel.close()
            return
        try:
            payload = parse_json(message)
        except BadJson as exc:
            self._page_problem("dc_bad_message")
            self._answer_error(str(exc))
            return
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "ping":
            ident = payload.get("id")
            pong: dict[str, Any] = {"type": "pong"}
            if isinstance(ident, str | int) and not isinstance(ident, bool) and len(str(ident)) <= 64:
                pong["id"] = ident
            self.deliver_event(pong)
            return
        self._page_problem("dc_bad_message")
        if not isinstance(kind, str):
            self._answer_error('expected a JSON object with a "type"')
        else:
            self._answer_error(f"unknown message type {kind[:32]!r}")

    def _answer_error(self, message: str) -> None:
        self.deliver_event({"type": "error", "error": message})

    def _page_problem(self, reason: str, **fields: Any) -> None:
        metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="webrtc", reason=reason).inc()
        seen = self._problems[reason] = self._problems.get(reason, 0) + 1
        if seen == 1 or seen % LOG_EVERY == 0:
            event(
                log, "page_bad_message", logging.WARNING, call_id=self.call.call_id, reason=reason, seen=seen,
                **fields,
            )  # fmt: skip

    def audio_flushed(self) -> None:
        """Nothing to do: the next frame the track pulls is already silence."""

    async def transfer(self, destination: str) -> None:
        """The page is told where the caller is transferred (it decides what to do), and the call ends."""
        target = transfer_destination(destination)
        if self._closed:
            raise LineActionFailed("the call has ended")
        self.deliver_event({"type": "transfer", "to": target.text})
        event(log, "webrtc_transfer", call_id=self.call.call_id, to=target.text)
        self._on_gone("transferred")

    async def send_dtmf(self, digits: str) -> None:
        """No keypad line to play them on: the page is shown the digits."""
        keys = keypad_digits(digits)
        if self._closed:
            raise LineActionFailed("the call has ended")
        self.deliver_event({"type": "dtmf_out", "digits": keys})

    def deliver_event(self, payload: dict[str, Any]) -> None:
        """Send an event to the page (from any thread); queued until the data channel opens.

        The call's final state is preceded by a `hangup` event with the reason it ended (agent_hangup,
        transferred, ...): the page tears down on the state, so the reason has to come first.
        """
        if payload.get("type") == "state" and payload.get("state") == "ended" and self.call.end_reason:
            self._deliver_text(json.dumps({"type": "hangup", "reason": self.call.end_reason}))
        self._deliver_text(json.dumps(payload))

    def _deliver_text(self, message: str) -> None:
        if self._loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._send_event(message)
        else:
            self._loop.call_soon_threadsafe(self._send_event, message)

    def _send_event(self, message: str) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            try:
                channel.send(message)
            except Exception:  # the transport went away under us: the call is ending anyway
                log.debug("event_send_failed", extra={"call_id": self.call.call_id})
        elif not self._closed:
            self._pending.append(message)

    async def _drain_events(self) -> None:
        """Wait (bounded) until the page has the events sent so far. Closing the peer connection aborts
        the SCTP association (an ABORT chunk, aiortc's RTCSctpTransport.stop), which drops whatever is
        still queued or unacknowledged: without this the hang-up event would race the close."""
        await asyncio.sleep(0)  # events handed over from other threads (call_soon_threadsafe) go first
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return
        deadline = time.monotonic() + EVENTS_DRAIN_S
        while channel.readyState == "open" and time.monotonic() < deadline:
            # aiortc has no "drained" signal: bufferedAmount counts what the channel has not handed to
            # SCTP yet; the association's queues hold chunks until sent and acknowledged (SACK).
            sctp = channel.transport
            in_flight = getattr(sctp, "_outbound_queue", None) or getattr(sctp, "_sent_queue", None)
            if channel.bufferedAmount == 0 and not in_flight:
                return
            await asyncio.sleep(0.01)

    # connection

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        event(log, "webrtc_state", logging.DEBUG, call_id=self.call.call_id, state=state)
        if state == "connected":
            self.call.greet()  # not before: an offer that never connects costs no synthesis
        elif state == "failed" and not self._closed:
            metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="webrtc", reason="ice_failed").inc()
            self._on_gone("ice_failed")
        elif state == "closed" and not self._closed:
            self._on_gone("hangup")

    async def _watch_connect(self) -> None:
        await asyncio.sleep(self.call.settings.connect_timeout_s)
        if self.pc.connectionState != "connected" and not self._closed:
            metrics.TRANSPORT_ERRORS_TOTAL.labels(transport="webrtc", reason="ice_timeout").inc()
            self._on_gone("ice_timeout")
