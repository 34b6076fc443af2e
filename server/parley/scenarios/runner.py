"""One scenario played as one real call: the caller dials over the chosen transport, speaks each turn
when its timing says (after the agent's reply is over, into it, or at once), and keeps what came back
(bench/listening.py's ears, one entry per 20 ms, and the call's events); then findings.py puts the
call's record and those ears together, and the expectations judge them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import numpy as np

from parley.bench.caller import Caller
from parley.bench.carrier import CarrierCaller
from parley.bench.listening import SPEECH_DBFS, CallFailed
from parley.bench.sip_caller import SipCaller
from parley.scenarios import expectations
from parley.scenarios.chat import ChatError, ChatModel
from parley.scenarios.findings import Played, fill_in
from parley.scenarios.judge import judge
from parley.scenarios.line import CallerLine
from parley.scenarios.llm_caller import LlmCallerPlayer
from parley.scenarios.results import ScenarioResult, Span, TurnResult
from parley.scenarios.scenario import Scenario, ScenarioError, Turn
from parley.scenarios.tool_mocks import ToolMocks
from parley.scenarios.voices import render, spoken_text
from parley.transports.sip.uri import SipUri

AnyCaller = Caller | SipCaller | CarrierCaller

REPLY_WAIT_S = 30.0  # the longest a reply may take to come (and end) before the turn is failed
SETTLE_S = 1.5  # a reply is over once this passes with nothing new (an unfinished sentence is held longer)
END_WAIT_S = 20.0  # how long the agent has to end the call itself once its last reply is over
POLL_S = 0.5


@dataclass(frozen=True)
class Target:
    """Where the calls go: the service's base URL, its SIP URI, the bearer token, the mocks (when the
    service was started by `parley test`), and the transport when the scenario names none."""

    base_url: str
    sip_uri: str = ""
    token: str = ""
    mocks: ToolMocks | None = None
    transport: str = "sip"
    default_agent: str = ""  # the agent a scenario that names none reaches (its SIP user)


class ScenarioRun:
    def __init__(
        self,
        scenario: Scenario,
        target: Target,
        *,
        caller_chat: ChatModel | None = None,
        judge_chat: ChatModel | None = None,
        on_turn: Callable[[int], None] = lambda index: None,
    ) -> None:
        self.scenario = scenario
        self.target = target
        self.transport = scenario.transport or target.transport
        self.caller_chat = caller_chat
        self.judge_chat = judge_chat
        self.on_turn = on_turn
        self.line = CallerLine(scenario.line, scenario.seed)
        self.result = ScenarioResult(scenario.name, str(scenario.path), self.transport, scenario.seed)
        self.caller: AnyCaller | None = None
        self.t0 = 0.0
        self.wall_t0 = 0.0
        self.last_speech_end = 0.0  # when the caller last finished saying (or pressing) something
        self.reply_due = False  # the agent owes a reply to what the caller last did
        self.hung_up = False
        self.details: dict[str, Any] = {}
        self._windows: list[tuple[float, TurnResult]] = []  # (when its action began, the turn)
        self._backchannels: set[int] = set()
        self._clips: dict[int, np.ndarray] = {}  # each scripted turn's speech, made before the call
        self._ended: asyncio.Future[None] | None = None  # done once the service has ended the call

    async def run(self) -> ScenarioResult:
        """Play the scenario; the result carries every failure (or the error that stopped the run)."""
        if self.scenario.tools and self.target.mocks is None:
            self.result.error = (
                "this scenario mocks tools, which needs the service `parley test` starts (no --url)"
            )
            return self.result
        if self.target.mocks is not None:
            self.target.mocks.use(self.scenario.tools)
        try:
            # Speech and noise are made before the call, off the event loop: making them would hold up
            # the caller's 20 ms packets, and the mock webhook's answers to the service.
            await asyncio.to_thread(self.line.prepare)
            for index, turn in enumerate(self.scenario.turns, start=1):
                if turn.say or turn.wav:
                    self._clips[index] = await asyncio.to_thread(self._clip, turn)
            async with asyncio.timeout(self.scenario.max_call_s):
                await self._call()
        except TimeoutError:
            self.result.error = f"the call ran past max_call_s ({self.scenario.max_call_s:g} s)"
        except (CallFailed, ScenarioError, ChatError, OSError, aiohttp.ClientError) as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"
        finally:
            await self._hang_up()
        if self.result.call_id:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError):
                await self._collect()
        if not self.result.error and self.scenario.expect.judge is not None and self.judge_chat is not None:
            self.result.judge = await judge(
                self.scenario.expect.judge.rubric, self.result.turns, self.result.greeting, self.judge_chat
            )
        expectations.judge_result(self.scenario, self.result)
        return self.result

    # the call

    async def _call(self) -> None:
        caller = self.caller = self._new_caller()
        if isinstance(caller, Caller):
            call_id = await caller.connect(
                agent=self.scenario.agent or None, context=dict(self.scenario.context) or None
            )
        else:
            call_id = await caller.connect()
        self.result.call_id = call_id
        self.t0, self.wall_t0 = time.monotonic(), time.time()
        self.last_speech_end = self.t0
        ended = self._ended = asyncio.ensure_future(self._follow_state())
        try:
            self.reply_due = self.scenario.greeting
            for index, turn in enumerate(self.scenario.turns, start=1):
                if ended.done():
                    return
                self.on_turn(index)
                await self._play(index, turn)
                if turn.hangup:
                    return
            if self.scenario.llm_caller is not None and self.caller_chat is not None:
                await self._converse(len(self.scenario.turns) + 1, ended)
            if ended.done():
                return
            if self.reply_due:
                await self._reply_over(self.last_speech_end)
            if self.scenario.expect.outcome not in ("", "hangup"):
                # The agent is expected to end the call (a goodbye, a transfer, an idle caller).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(ended), END_WAIT_S)
        finally:
            ended.cancel()

    def _new_caller(self) -> AnyCaller:
        scenario, target = self.scenario, self.target
        codec = self.line.codec_for(self.transport)
        if self.transport == "sip":
            if not target.sip_uri:
                raise ScenarioError("--transport sip with --url needs --sip-uri")
            uri = SipUri.parse(target.sip_uri)
            user = scenario.agent or target.default_agent or uri.user or "parley"
            sip_uri = f"sip:{user}@{uri.host}" + (f":{uri.port}" if uri.port else "")
            # Over SIP a call's context travels in the X- headers the agent file names (sip_headers).
            if any(not key.startswith("x_") for key in scenario.context):
                raise ScenarioError(
                    "over sip, [caller] context keys are X- headers: name them x_customer_id ..."
                )
            headers = {key.replace("_", "-"): value for key, value in scenario.context.items()}
            return SipCaller(
                target.base_url,
                sip_uri,
                codec=codec or "PCMU",
                token=target.token,
                line=self.line,
                headers=headers,
            )
        if self.transport == "carrier":
            query = {**({"agent": scenario.agent} if scenario.agent else {}), **scenario.context}
            return CarrierCaller(target.base_url, query=urlencode(query), line=self.line)
        if self.transport == "webrtc":
            return Caller(target.base_url, token=target.token, line=self.line)
        raise ScenarioError(f"unknown transport {self.transport!r} (webrtc, sip or carrier)")

    async def _play(self, index: int, turn: Turn, *, by_llm: bool = False) -> TurnResult:
        caller = self.caller
        assert caller is not None
        await self._wait_for_timing(turn)
        result = TurnResult(index, _action(turn), by_llm=by_llm)
        self.result.turns.append(result)
        begun = time.monotonic()
        if turn.say or turn.wav:
            clip = self._clips.pop(index, None)
            if clip is None:
                clip = await asyncio.to_thread(self._clip, turn)
            result.said = spoken_text(turn)
            self._windows.append((begun, result))
            started, finished = await caller.say(clip)
            result.spoke = Span(started - self.t0, finished - self.t0)
            self.last_speech_end = finished
            self.reply_due = not turn.backchannel or self.reply_due
            if turn.backchannel:
                self._backchannels.add(index)
        elif turn.press:
            if isinstance(caller, Caller):
                raise ScenarioError(
                    f"turn {index}: key presses go over sip or carrier (a page has no keypad)"
                )
            self._windows.append((begun, result))
            caller.press(turn.press)
            self.last_speech_end = time.monotonic()
            self.reply_due = True
        elif turn.silence_s:
            self._windows.append((begun, result))
            await asyncio.sleep(turn.silence_s)
            self.reply_due = False
        elif turn.hangup:
            self._windows.append((begun, result))
            await self._hang_up()
        return result

    def _clip(self, turn: Turn) -> np.ndarray:
        return self.line.level(render(turn, self.scenario.voice))

    async def _wait_for_timing(self, turn: Turn) -> None:
        caller = self.caller
        assert caller is not None
        if turn.when == "at_once":
            return
        if turn.when == "during_reply":
            try:
                began = await caller.wait_for_audio(after=self.last_speech_end, timeout=REPLY_WAIT_S)
            except TimeoutError:
                return  # nothing to speak over: the turn's expectations will show what followed
            await asyncio.sleep(max(0.0, began + turn.after_s - time.monotonic()))
            return
        if self.reply_due:
            await self._reply_over(self.last_speech_end)
            self.reply_due = False
        else:
            with contextlib.suppress(TimeoutError):
                await caller.wait_for_silence(after=time.monotonic(), hold_s=0.5, timeout=REPLY_WAIT_S)
        if turn.after_s:
            await asyncio.sleep(turn.after_s)

    async def _reply_over(self, after: float) -> bool:
        """Wait until the agent has answered what the caller did at `after` and is listening again: a
        reply was done (agent_done) and the call's state has stayed "listening" with no reply audio at
        the caller for SETTLE_S (an agent may answer the first half of a sentence the caller paused in,
        then the whole of it; a tool may run between a hold phrase and the answer). False if no reply
        came within REPLY_WAIT_S."""
        caller = self.caller
        assert caller is not None
        deadline = time.monotonic() + REPLY_WAIT_S
        if await self._event_at("agent_done", after, deadline) is None:
            return False
        quiet_since: float | None = None
        while time.monotonic() < deadline and not self._over():
            now = time.monotonic()
            sounding = any(
                t > now - 0.3 and level > SPEECH_DBFS
                for t, level in zip(caller.heard.times[-20:], caller.heard.levels[-20:], strict=False)
            )
            if self._state() != "listening" or sounding:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= SETTLE_S:
                return True
            await asyncio.sleep(0.05)
        return True

    def _state(self) -> str:
        """The call's state as its events last said."""
        assert self.caller is not None
        for _, payload in reversed(self.caller.events):
            if payload.get("type") == "state":
                return str(payload.get("state"))
        return ""

    async def _event_at(self, kind: str, after: float, deadline: float) -> float | None:
        """When the first `kind` event at or after `after` arrived at the caller (None by `deadline`)."""
        caller = self.caller
        assert caller is not None
        while time.monotonic() < deadline and not self._over():
            for at, payload in caller.events:
                if at >= after and payload.get("type") == kind:
                    return at
            await asyncio.sleep(0.02)
        return None

    def _over(self) -> bool:
        """The service has ended the call: nothing more will come to wait for."""
        return self._ended is not None and self._ended.done()

    async def _converse(self, first_index: int, ended: asyncio.Future[None]) -> None:
        """The LLM caller's part: it answers what the agent said last, until it is done."""
        spec, chat = self.scenario.llm_caller, self.caller_chat
        assert spec is not None and chat is not None
        player = LlmCallerPlayer(spec, chat)
        index = first_index
        while not ended.done():
            if self.reply_due:
                await self._reply_over(self.last_speech_end)
                self.reply_due = False
            line = await player.next_line(self._last_reply())
            if line is None:
                return
            self.on_turn(index)
            await self._play(index, Turn(say=line, voice=spec.voice, when="at_once"), by_llm=True)
            index += 1

    def _last_reply(self) -> str:
        """What the agent said since the caller last spoke, as it was done (agent_done carries the text
        as heard)."""
        assert self.caller is not None
        said = [
            str(p.get("text") or "")
            for at, p in self.caller.events
            if at >= self.last_speech_end and p.get("type") == "agent_done"
        ]
        return " ".join(s for s in said if s)

    async def _follow_state(self) -> None:
        """Returns once the service says the call has ended (whoever ended it)."""
        while True:
            await asyncio.sleep(POLL_S)
            with contextlib.suppress(aiohttp.ClientError, OSError, ValueError):
                details = await self._get_call()
                if details.get("state") == "ended":
                    self.details = details
                    return

    async def _get_call(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.target.token}"} if self.target.token else {}
        url = f"{self.target.base_url.rstrip('/')}/api/calls/{self.result.call_id}"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(url, headers=headers) as response,
        ):
            if response.status != 200:
                raise aiohttp.ClientError(f"GET {url}: {response.status}")
            body: dict[str, Any] = await response.json()
            return body

    async def _hang_up(self) -> None:
        if self.caller is not None and not self.hung_up:
            self.hung_up = True
            with contextlib.suppress(Exception):
                await self.caller.hangup()

    # what happened

    async def _collect(self) -> None:
        """Once the service has ended the call: its record, matched to the turns, and what the caller
        measured (findings.py)."""
        ended_at = time.monotonic()
        deadline = ended_at + 10.0
        details = self.details
        while details.get("state") != "ended" and time.monotonic() < deadline:
            details = await self._get_call()
            if details.get("state") != "ended":
                await asyncio.sleep(POLL_S)
        assert self.caller is not None
        mocked = None
        if self.target.mocks is not None:
            mocked = [
                {"name": c.name, "arguments": c.arguments, "result": c.answered}
                for c in self.target.mocks.calls_of(self.result.call_id)
            ]
        played = Played(self.caller, self.t0, self.wall_t0, ended_at, self._windows, self._backchannels)
        fill_in(self.result, details, played, mocked)


def _action(turn: Turn) -> str:
    if turn.say:
        return f'said "{spoken_text(turn)}"' + (" (backchannel)" if turn.backchannel else "")
    if turn.wav:
        return f"played {turn.wav}"
    if turn.press:
        return f"pressed {turn.press}"
    if turn.silence_s:
        return f"stayed quiet {turn.silence_s:g} s"
    return "hung up"
