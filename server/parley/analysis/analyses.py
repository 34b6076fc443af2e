"""Post-call analyses: the registry's observer that queues each ended call whose agent file has an
`[analysis]`, and the one worker thread per process that asks the LLM about them, in the background of
the live calls (priority.py), and keeps and sends what it learns.

A call in which nothing was said (one that never connected) is not analysed. The queue is bounded:
when the analyses fall behind (a busy service, a slow model), an ended call that finds it full is not
analysed, and is counted (`parley_analyses_total{outcome="dropped"}`), as are those left when the
service stops. An analysis is kept with the call's record (`analysis`, which
`GET /api/calls/<id>` shows) and sent as a signed `call.analyzed` event; with `--record-transcripts
off` both leave out what retells the call (records/redaction.py). Nothing an analysis does reaches a
call: a failure is kept as the analysis's error and counted.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from parley import metrics
from parley.agent.analysis_spec import AnalysisSpec
from parley.analysis.analyst import Analysis, AnalysisStopped, Analyst
from parley.analysis.priority import LiveCall, held_by_calls, in_background, wait_until_free
from parley.engines.llm import LlmEngine
from parley.log import event
from parley.records.redaction import analysis_without_text

log = logging.getLogger(__name__)

EVENT = "call.analyzed"
KEEP_KNOWN = 200  # the analyses of the latest calls, for the calls `GET /api/calls/<id>` finds in memory
STOP_TIMEOUT_S = 10.0
PENDING: dict[str, Any] = {"status": "pending"}

Keep = Callable[[str, dict[str, Any]], None]  # call id, analysis: kept with the call's record
Publish = Callable[[str, str, dict[str, Any]], None]  # call id, event type, data: the events outbox


class EndedCall(Protocol):
    """What an analysis reads of a call that has ended."""

    call_id: str

    @property
    def agent(self) -> _HasAnalysis: ...

    @property
    def conversation(self) -> _HasSnapshot: ...

    @property
    def settings(self) -> _HasRecordTranscripts: ...


class _HasAnalysis(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def analysis(self) -> AnalysisSpec | None: ...


class _HasSnapshot(Protocol):
    def snapshot(self) -> list[dict[str, Any]]: ...


class _HasRecordTranscripts(Protocol):
    @property
    def record_transcripts(self) -> bool: ...


@dataclass(frozen=True)
class _Job:
    call_id: str
    agent: str
    spec: AnalysisSpec
    turns: Sequence[Mapping[str, Any]]  # the conversation as heard
    keep_text: bool


class CallAnalyses:
    """`llm` gives the process's LLM (None while the models load); `calls` the live calls."""

    def __init__(
        self,
        llm: Callable[[], LlmEngine | None],
        calls: Callable[[], Iterable[LiveCall]],
        *,
        keep: Keep,
        publish: Publish,
        queue_size: int,
    ) -> None:
        self._llm = llm
        self._held = held_by_calls(calls)
        self._keep = keep
        self._publish = publish
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max(1, queue_size))
        self._known: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        metrics.ANALYSES_WAITING.set_function(self._queue.qsize)

    # the registry's observer (on the event loop; never blocks)

    def call_added(self, call: EndedCall) -> None:
        pass

    def call_ended(self, call: EndedCall) -> None:
        spec = call.agent.analysis
        if spec is None or self._stopping.is_set():
            return
        turns = call.conversation.snapshot()
        if not any(turn.get("user") or turn.get("agent") for turn in turns):
            return  # nothing was said (a call that never connected): nothing to analyse
        job = _Job(call.call_id, call.agent.name, spec, turns, call.settings.record_transcripts)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            metrics.ANALYSES_TOTAL.labels(outcome="dropped").inc()
            event(log, "analysis_dropped", logging.WARNING, call_id=job.call_id, reason="queue_full")
            return
        self._remember(job.call_id, PENDING)
        self._start()

    # reading

    def known(self, call_id: str) -> dict[str, Any] | None:
        """A recent call's analysis as stored (`{"status": "pending"}` until it is done), or None."""
        with self._lock:
            return self._known.get(call_id)

    def waiting(self) -> int:
        return self._queue.qsize()

    # lifecycle

    def close(self) -> None:
        """Stop: the analysis under way is left unfinished, and so are those queued (counted dropped)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)  # wakes a worker waiting for work; a busy one sees the stop
            thread.join(STOP_TIMEOUT_S)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                metrics.ANALYSES_TOTAL.labels(outcome="dropped").inc()

    # the worker

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="call-analysis", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with in_background(self._held):
            while not self._stopping.is_set():
                job = self._queue.get()
                if job is None:
                    return
                try:
                    self._analyse(job)
                except AnalysisStopped:
                    metrics.ANALYSES_TOTAL.labels(outcome="dropped").inc()
                    return
                except Exception:  # a bug here costs this analysis, never the worker
                    log.exception("analysis_failed", extra={"call_id": job.call_id})
                    metrics.ANALYSES_TOTAL.labels(outcome="failed").inc()

    def _analyse(self, job: _Job) -> None:
        llm = self._llm()
        if llm is None:  # only ended calls are analysed: the models were loaded for them
            raise RuntimeError("no LLM")
        analyst = Analyst(llm, lambda: wait_until_free(self._held, self._stopping), self._stopping.is_set)
        analysis = analyst.analyse(job.spec, job.turns)
        value = self._kept(job, analysis)
        self._remember(job.call_id, value)
        self._keep(job.call_id, value)
        self._publish(job.call_id, EVENT, {"agent": job.agent, "analysis": value})
        metrics.ANALYSES_TOTAL.labels(outcome=analysis.outcome).inc()
        event(
            log,
            "call_analyzed",
            call_id=job.call_id,
            outcome=analysis.outcome,
            seconds=value["seconds"],
            errors=",".join(value["errors"]),
        )

    @staticmethod
    def _kept(job: _Job, analysis: Analysis) -> dict[str, Any]:
        if job.keep_text:
            return analysis.value
        return analysis_without_text(analysis.value, job.spec.schema)

    def _remember(self, call_id: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._known[call_id] = value
            self._known.move_to_end(call_id)
            while len(self._known) > KEEP_KNOWN:
                self._known.popitem(last=False)
