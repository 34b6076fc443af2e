"""What every transport needs to open a call: the settings, the shared engines once loaded, the registry.

One `Runtime` per service process. The models load in a thread at start-up; until they are loaded (or
when loading failed) and while the registry is at capacity, calls are refused with a `CallRefused`
that each transport turns into its own refusal (HTTP 503, SIP 503, a closed WebSocket).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import Any

from parley import metrics
from parley.agent.agentfile import Agent, load_agents
from parley.agent.events import CallEvents, EventOutbox
from parley.agent.opening import opening_of
from parley.agent.tools import ToolRunner
from parley.analysis.analyses import CallAnalyses
from parley.answering import AmdRecords
from parley.config import Settings
from parley.engines import Engines, load_engines
from parley.engines.deadlines import with_deadlines
from parley.engines.llm import LlmEngine
from parley.idle import IdlePrompts
from parley.log import event
from parley.ratelimit import Source, SourceLimiter, source_key
from parley.recording import Recordings
from parley.records import CallRecords, open_records
from parley.registry import CallRegistry
from parley.watchdog import CallWatchdog

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5


class CallRefused(Exception):
    """No call can be opened now. `reason`: loading | load_failed | capacity | source_limit | draining |
    closing | rate_limited."""

    def __init__(self, reason: str, message: str, retry_after_s: float = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after_s = max(1, math.ceil(retry_after_s))


class UnknownAgent(LookupError):
    """A call asked for an agent this service does not have (404 / SIP 404 / stream closed)."""


class Runtime:
    def __init__(self, settings: Settings, engines: Engines | None = None) -> None:
        self.settings = settings
        self.registry = CallRegistry(settings.max_calls, settings.instance_tag)
        self.engines = engines
        self.load_error: str | None = None
        self._owns_engines = engines is None
        self._loader: asyncio.Task[None] | None = None
        self.draining = False  # set by drain(): live calls go on, no new call is admitted
        self.records: CallRecords | None = None
        self.agents = load_agents(settings.agent, settings.system_prompt, settings.greeting)
        # `--llm-model auto` is chosen once, for every agent the service runs (one model serves them all).
        tools = any(agent.offers_tools() for agent in self.agents.values())
        self.settings = settings = dataclasses.replace(settings, llm_model=settings.local_llm(tools=tools))
        self.tools = ToolRunner(settings.webhook_secret)
        self.call_events: CallEvents | None = None
        self.outbox = (
            EventOutbox(settings.events_url, settings.webhook_secret) if settings.events_url else None
        )
        # Post-call analyses, where an agent file asks for them ([analysis]): on the shared LLM, after
        # the live calls' work.
        self.analyses: CallAnalyses | None = None
        if any(agent.analysis is not None for agent in self.agents.values()):
            self.analyses = CallAnalyses(
                self._llm,
                self.registry.active,
                keep=self._keep_analysis,
                publish=self._publish_analysis,
                queue_size=settings.analysis_queue,
            )
            self.registry.observers.append(self.analyses)
        # Call recordings (--record-audio, an agent file's record_audio): written and stored off the calls.
        self.recordings = Recordings(
            settings, settings.resolved_data_dir(), self._keep_recording, max_calls=settings.max_calls
        )
        self.registry.observers.append(self.recordings)
        self.registry.observers.append(AmdRecords(self._keep_amd))  # who answered outbound calls
        # Per source address, shared by every transport: one flood cannot take every line.
        self.setup_limiter = SourceLimiter(
            settings.setup_rate, settings.setup_burst, settings.rate_limit_exempt
        )
        self.idle = IdlePrompts(settings.idle_prompt_after_s)  # off for agents that leave it off
        self.watchdog = CallWatchdog(
            self.registry, settings.max_call_s, settings.max_silence_s, clocked=(self.idle,)
        )
        self.registry.observers += [self.watchdog, self.idle]
        self._call_engines: tuple[Engines, Engines] | None = None
        metrics.CALLS_MAX.set(settings.max_calls)
        metrics.READY.set_function(lambda: float(self.not_ready_reason() is None))
        metrics.STAGE_THREADS_STUCK.set_function(lambda: sum(t.is_alive() for _, t in self.registry.stuck))

    async def open_records(self) -> None:
        """Connect to the call records (and migrate them); from then on every call is recorded.
        A database that cannot be reached stops the start: calls would go unrecorded."""
        # Which process a record came from: calls it left open when it died are closed at its restart.
        records = open_records(self.settings, instance=f"{socket.gethostname()}:{self.settings.port}")
        if records is not None:
            await asyncio.to_thread(records.start)
            self.records = records
            self.registry.observers.append(records)

    async def start_events(self) -> None:
        """Start delivering call events (when --events-url is set): call.started and call.ended here,
        tool.called and call.transferred from the calls themselves."""
        if self.outbox is not None:
            await self.outbox.start()
            self.call_events = CallEvents(self.outbox)
            self.registry.observers.append(self.call_events)

    def publisher(self, call_id: str) -> Callable[[str, dict[str, Any]], None]:
        """Where a call's own events go (tool.called, call.transferred): the events outbox, when started."""
        if self.call_events is None:
            return lambda kind, data: None
        return self.call_events.publisher(call_id, self.settings.record_transcripts)

    def _keep_amd(self, call_id: str, amd: dict[str, Any]) -> None:
        if self.records is not None:
            self.records.keep_after(call_id, "amd", amd)

    def _keep_recording(self, call_id: str, recording: dict[str, Any]) -> None:
        if self.records is not None:
            self.records.keep_after(call_id, "recording", recording)

    def _llm(self) -> LlmEngine | None:
        return self.engines.llm if self.engines is not None else None

    def _keep_analysis(self, call_id: str, analysis: dict[str, Any]) -> None:
        if self.records is not None:
            self.records.keep_after(call_id, "analysis", analysis)

    def _publish_analysis(self, call_id: str, kind: str, data: dict[str, Any]) -> None:
        if self.outbox is not None:
            self.outbox.publish(call_id, kind, data)

    def after_call(self, call_id: str) -> dict[str, Any]:
        """What became known of a call in memory after its turns (`analysis`), for `GET /api/calls/<id>`;
        a call's stored record has it too."""
        analysis = self.analyses.known(call_id) if self.analyses is not None else None
        return {"analysis": analysis} if analysis is not None else {}

    def agent(self, name: str | None) -> Agent:
        """The agent a call asked for by name (None: the default); UnknownAgent if there is none."""
        if not name:
            return next(iter(self.agents.values()))
        agent = self.agents.get(name)
        if agent is None:
            raise UnknownAgent(f"no agent named {name[:64]!r}")
        return agent

    def agent_for_sip_user(self, user: str) -> Agent | None:
        """The agent a SIP request-URI user selects: by name or one of its `sip_users` ("*": any). Without
        agent files every user reaches the default agent; with them, None when none matches."""
        if not self.settings.agent:
            return self.agent(None)
        for agent in self.agents.values():
            if user == agent.name or user in agent.sip_users:
                return agent
        return next((a for a in self.agents.values() if "*" in a.sip_users), None)

    def check_source(self, transport: str, source: str, *, spare: bool = True) -> None:
        """Count a call set-up from `source`; CallRefused ("rate_limited", counted) beyond its rate.
        `spare=False`: counted even from an exempt address (a proxy nobody named forwarded it)."""
        wait_s = self.setup_limiter.check(source, time.monotonic(), spare=spare)
        if wait_s > 0:
            metrics.CALLS_REFUSED_TOTAL.labels(transport=transport, reason="rate_limited").inc()
            raise CallRefused(
                "rate_limited", "too many calls set up from this address, try again later", wait_s
            )

    def start_loading(self) -> None:
        """Load the models in a thread unless they were given (readiness says when they are in)."""
        self.watchdog.start()
        self.recordings.start()
        if self.engines is not None:
            metrics.MODELS_READY.set(1)
            return
        self._loader = asyncio.ensure_future(self._load())

    async def _load(self) -> None:
        try:
            # The default agent's opening: most calls are its (another agent's shares the manners).
            default = next(iter(self.agents.values()))
            opening = opening_of(default, manners=self.settings.phone_manners)
            self.engines = await asyncio.to_thread(load_engines, self.settings, opening)
            metrics.MODELS_READY.set(1)
            event(log, "ready")
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("models_failed_to_load")

    def not_ready_reason(self) -> str | None:
        """Why a call would be refused now, or None when one would be accepted."""
        if self.registry.closing:
            return "shutting down"
        if self.draining:
            return "draining"
        if self.engines is None:
            return self.load_error or "models loading"
        if self.registry.at_capacity():
            return "at capacity"
        if sum(t.is_alive() for _, t in self.registry.stuck) >= self.settings.max_calls:
            return "stage threads stuck"  # a model hangs: send new calls to another instance
        return None

    def line_holder(self, source: Source | None) -> str:
        """What a call from `source` counts against the per-source cap as ("": nothing, it is spared:
        no source given, an exempt network, or the cap is off)."""
        if source is None or self.settings.max_calls_per_source <= 0:
            return ""
        if source.spareable and self.setup_limiter.spares(source.address):
            return ""
        return source_key(source.address)

    def admit(self, transport: str, holder: str = "") -> Engines:
        """The engines for a new call; raises CallRefused (and counts it) when none can be opened now.
        `holder` (from `line_holder`): the source whose calls are capped at --max-calls-per-source."""
        if self.registry.closing:
            refused = CallRefused("closing", "the service is shutting down")
        elif self.draining:
            refused = CallRefused("draining", "this instance is draining, call another")
        elif self.engines is None:
            refused = (
                CallRefused("load_failed", "models failed to load")
                if self.load_error
                else CallRefused("loading", "models are still loading")
            )
        elif self.registry.at_capacity():
            refused = CallRefused("capacity", "at capacity, try again shortly")
        elif holder and self.registry.lines_held_by(holder) >= self.settings.max_calls_per_source:
            refused = CallRefused("source_limit", "this address holds too many calls already")
        else:
            # The calls get the engines under deadlines (a hung model costs one turn); made once.
            if self._call_engines is None or self._call_engines[0] is not self.engines:
                self._call_engines = (
                    self.engines,
                    with_deadlines(self.engines, self.settings.engine_timeout_s),
                )
            return self._call_engines[1]
        metrics.CALLS_REFUSED_TOTAL.labels(transport=transport, reason=refused.reason).inc()
        raise refused

    def drain(self) -> None:
        """Admit no new call (readiness turns 503, SIP answers 503) while live calls go on: before a
        pod stops, so that its calls end by themselves instead of being cut."""
        if not self.draining:
            self.draining = True
            event(log, "draining", calls=len(self.registry.active()))

    async def close(self) -> None:
        """End every call, then release the engines this runtime loaded."""
        await self.registry.end_all("shutdown")
        if self.analyses is not None:  # before the records and the outbox close: what it kept goes out
            await asyncio.to_thread(self.analyses.close)
        await asyncio.to_thread(self.recordings.close)  # before the records close: where each one is
        await self.watchdog.close()
        if self.records is not None:
            self.registry.observers.remove(self.records)
            await asyncio.to_thread(self.records.close)
            self.records = None
        if self.outbox is not None:
            await self.outbox.close()
        self.tools.close()
        if self._loader is not None:
            await self._loader
        if self.engines is not None and self._owns_engines:
            await asyncio.to_thread(self.engines.close)
        metrics.MODELS_READY.set(0)
