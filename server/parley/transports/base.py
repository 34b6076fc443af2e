"""The seam between transports and calls: one way to open a call, and one clock to send audio by.

A transport carries one call's audio and signaling, whatever the wire (WebRTC, SIP/RTP, a carrier's
media-stream WebSocket). It:
- hands caller audio to `Call.push_audio(pcm, rate)` at its own rate (the call converts it once);
- pulls the agent's voice from `call.outbound` one 20 ms frame at a time, at its own pace (non-WebRTC
  senders use `send_paced`; aiortc asks for frames itself and paces with the same `FrameClock`);
- passes keypad digits to `Call.dtmf_received`;
- is told about the call (`deliver_event`), about flushed audio (`audio_flushed`: a carrier clears the
  audio it buffered), and to close;
- calls its `hang_up(reason)` when its peer goes away, which ends the call through the registry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import numpy as np

from parley.agent.agentfile import Agent
from parley.audio import FRAME_MS
from parley.call import Call
from parley.call_origin import Origin
from parley.log import CALL_ID, event
from parley.ratelimit import Source
from parley.runtime import CallRefused, Runtime

log = logging.getLogger(__name__)

FRAME_S = FRAME_MS / 1000
MAX_LAG_S = 0.2  # a sender this far behind (the loop stalled) starts a new schedule instead of bursting


HangUp = Callable[[str], None]


class Transport(Protocol):
    """What a call's transport is told. `deliver_event` and `audio_flushed` may come from any thread;
    the coroutines run on the event loop."""

    def deliver_event(self, payload: dict[str, Any]) -> None: ...

    def audio_flushed(self) -> None: ...

    async def close(self) -> None: ...

    async def transfer(self, destination: str) -> None:
        """Hand the caller to `destination` (a sip: URI or a +E.164 number); returns once the transfer
        succeeded (the call then ends as "transferred"); raises LineActionFailed when it did not."""
        ...

    async def send_dtmf(self, digits: str) -> None:
        """Play keypad digits to the far end (RFC 4733 on SIP, the carrier's way on a stream)."""
        ...


class LineActionFailed(Exception):
    """The line could not do what the agent asked (transfer refused, no keypad tones on this line):
    the message is what the model reads, and the call goes on."""


class LineControl:
    """What the agent may do to its call's line, from any thread (a tool worker): hang up, transfer,
    send keypad digits. Each action runs on the event loop; the blocking forms wait for its outcome.
    Made with the call, before its transport exists: the transport is `connect`ed once it does (a tool
    runs only after the call started, so never on a line with none)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, hang_up: HangUp) -> None:
        self._transport: Transport | None = None
        self._loop = loop
        self._hang_up = hang_up

    def connect(self, transport: Transport) -> None:
        self._transport = transport

    def hang_up(self, reason: str) -> None:
        self._loop.call_soon_threadsafe(self._hang_up, reason)

    def transfer(self, destination: str, timeout_s: float) -> None:
        self._wait(lambda transport: transport.transfer(destination), timeout_s, "the transfer")

    def send_dtmf(self, digits: str, timeout_s: float) -> None:
        self._wait(lambda transport: transport.send_dtmf(digits), timeout_s, "sending the digits")

    def _wait(
        self, action: Callable[[Transport], Coroutine[Any, Any, None]], timeout_s: float, what: str
    ) -> None:
        transport = self._transport
        if transport is None:
            raise LineActionFailed(f"{what} is not possible before the call is connected")
        future = asyncio.run_coroutine_threadsafe(action(transport), self._loop)
        try:
            future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise LineActionFailed(f"{what} did not complete within {timeout_s:g} s") from None


class CallSetupFailed(Exception):
    """The call could not be connected, for a reason worth keeping in its record (`outcome`: busy,
    no_answer, rejected, cancelled, failed): the call is recorded as ended with that outcome."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


T = TypeVar("T", bound=Transport)
Connect = Callable[[Call, HangUp], Awaitable[T]]


async def open_call(
    runtime: Runtime,
    kind: str,
    rate: int,
    connect: Connect[T],
    *,
    origin: Origin | None = None,
    agent: Agent | None = None,
    greet: bool = True,
    source: Source | None = None,
) -> tuple[Call, T]:
    """Admit, build and start a call on a transport; the one way every transport opens a call.

    The call is built once, with everything it will have: its `origin` (the parties, the token's and the
    caller's variables), its agent, its line, the tool workers and where its events go.
    `connect(call, hang_up)` builds the transport and does its signaling (it may await; meanwhile the
    call holds a line, so concurrent setups cannot overshoot --max-calls). It cleans up after itself if
    it raises, and whatever it raises propagates; a CallSetupFailed is also kept as the call's record.
    `rate` is the transport's outgoing sample rate. `greet=False` for a transport whose media connects
    after its signaling (WebRTC): it calls `call.greet()` once it does. `source`: who set the call up,
    whose calls are capped at --max-calls-per-source (None: not counted, e.g. an allow-listed trunk).
    Raises CallRefused when the models are not loaded, at capacity, over the source's cap, or shutting down.
    """
    holder = runtime.line_holder(source)
    engines = runtime.admit(kind, holder)
    registry = runtime.registry
    call_id = registry.new_call_id()

    def hang_up(reason: str) -> None:
        registry.end_soon(call_id, reason)

    line = LineControl(asyncio.get_running_loop(), hang_up)
    call = Call(
        call_id,
        kind,
        runtime.settings,
        engines,
        rate,
        agent or runtime.agent(None),
        origin=origin,
        line=line,
        tool_runner=runtime.tools,
        publish=runtime.publisher(call_id),
        recorder=runtime.recordings,
    )
    # The tasks the transport starts while connecting inherit the call's id for their log lines.
    token = CALL_ID.set(call.call_id)
    try:
        with registry.setting_up(call, holder):
            try:
                transport = await connect(call, hang_up)
            except CallSetupFailed as exc:
                call.end(exc.outcome)
                registry.remember_ended(call)
                raise
    finally:
        CALL_ID.reset(token)
    if registry.closing:
        # The service began shutting down while this call was being set up: it must not outlive that.
        await transport.close()
        raise CallRefused("closing", "the service is shutting down")
    line.connect(transport)
    call.attach(transport)
    registry.add(call, transport.close, holder)
    call.start(greet=greet)
    return call, transport


class FrameClock:
    """Deadlines one frame period apart on the monotonic clock, starting at the first tick.

    Deadlines are counted from the start, not from the last wake-up, so sleeping late never accumulates
    into drift. After a stall of more than MAX_LAG_S the schedule restarts: catching up would send a
    burst that a receiver's jitter buffer could only drop.
    """

    def __init__(self, period_s: float = FRAME_S) -> None:
        self.period_s = period_s
        self._start: float | None = None
        self._count = 0

    def delay(self) -> float:
        """Seconds until the next frame is due (advances the schedule by one frame)."""
        now = time.monotonic()
        if self._start is None:
            self._start = now
            return 0.0
        self._count += 1
        due = self._start + self._count * self.period_s
        if now - due > MAX_LAG_S:
            self._start, self._count = now, 0
            return 0.0
        return max(0.0, due - now)

    async def tick(self) -> None:
        delay = self.delay()
        if delay > 0:
            await asyncio.sleep(delay)


async def send_paced(
    pull: Callable[[], np.ndarray], send: Callable[[np.ndarray], None], *, call_id: str = ""
) -> None:
    """Every 20 ms, one frame from `pull()` (silence when the agent is quiet) handed to `send`, until
    cancelled. A failing `send` is logged and the stream goes on: one bad packet must not end a call."""
    clock = FrameClock()
    failures = 0
    while True:
        await clock.tick()
        try:
            send(pull())
        except Exception:
            failures += 1
            if failures == 1 or failures % 500 == 0:
                event(log, "send_failed", logging.WARNING, call_id=call_id, failures=failures)
