"""Prometheus metrics, all in one place (prefix `parley_`). Names follow DESIGN.md "Metrics"."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 10.0)
_FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)

# Calls
CALLS_ACTIVE = Gauge("parley_calls_active", "Calls in progress", ["transport"], registry=REGISTRY)
CALLS_TOTAL = Counter("parley_calls_total", "Calls ended", ["transport", "outcome"], registry=REGISTRY)
CALLS_REFUSED_TOTAL = Counter(
    "parley_calls_refused_total",
    "Calls refused before they started (loading, load_failed, capacity, closing, forbidden, ...)",
    ["transport", "reason"],
    registry=REGISTRY,
)
CALL_DURATION = Histogram(
    "parley_call_duration_seconds",
    "Call length",
    buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)

# Turns
TURNS_TOTAL = Counter("parley_turns_total", "User turns opened", registry=REGISTRY)
TURN_REVISIONS_TOTAL = Counter(
    "parley_turn_revisions_total", "Confirmed reopens of a turn (the user had only paused)", registry=REGISTRY
)
REOPEN_CANDIDATES_TOTAL = Counter(
    "parley_reopen_candidates_total", "Reopen candidates by outcome", ["outcome"], registry=REGISTRY
)
COMMITS_TOTAL = Counter(
    "parley_commits_total",
    "Agent replies ended, by what went into the history",
    ["outcome"],
    registry=REGISTRY,
)

# Barge-in
BARGE_INS_TOTAL = Counter("parley_barge_ins_total", "Confirmed interruptions of the agent", registry=REGISTRY)
FALSE_INTERRUPTIONS_TOTAL = Counter(
    "parley_false_interruptions_total",
    "Candidate interruptions that were blips or backchannels (the agent resumed)",
    registry=REGISTRY,
)
INTERRUPTION_LATENCY = Histogram(
    "parley_interruption_latency_seconds",
    "From the audio that decided speech onset arriving to the agent's outbound audio stopping",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)

# Latency
STAGE_LATENCY = Histogram(
    "parley_stage_latency_seconds",
    "Time spent in a stage, per turn",
    ["stage"],
    buckets=(*_FAST_BUCKETS, 2.0, 5.0),
    registry=REGISTRY,
)
RESPONSE_LATENCY = Histogram(
    "parley_response_latency_seconds",
    "End of the user's speech to the first reply audio frame sent",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)

# Health
QUEUE_DEPTH = Gauge(
    "parley_queue_depth", "Items waiting in stage queues (all calls)", ["stage"], registry=REGISTRY
)
FRAMES_DROPPED_TOTAL = Counter(
    "parley_frames_dropped_total", "Audio frames dropped", ["reason"], registry=REGISTRY
)
TRANSPORT_ERRORS_TOTAL = Counter(
    "parley_transport_errors_total",
    "Bad or failed input at a transport, by a bounded reason (malformed, rtp_timeout, no_ack, ...)",
    ["transport", "reason"],
    registry=REGISTRY,
)
SIP_DIALOGS = Gauge("parley_sip_dialogs", "SIP dialogs (calls) the user agent holds", registry=REGISTRY)
SIP_TRANSACTIONS = Gauge(
    "parley_sip_transactions", "SIP transactions in progress (retransmission state)", registry=REGISTRY
)
DTMF_DIGITS_TOTAL = Counter(
    "parley_dtmf_digits_total", "Keypad digits received", ["transport"], registry=REGISTRY
)
ENGINE_ERRORS_TOTAL = Counter("parley_engine_errors_total", "Engine failures", ["engine"], registry=REGISTRY)
CALL_THREADS = Gauge(
    "parley_call_threads", "Stage threads of calls still alive (0 when no call runs)", registry=REGISTRY
)
CALL_THREADS.set_function(lambda: sum(t.name.startswith("c-") for t in threading.enumerate()))
MODELS_READY = Gauge("parley_models_ready", "1 once every model is loaded", registry=REGISTRY)

for _outcome in ("confirmed", "cancelled", "timeout"):
    REOPEN_CANDIDATES_TOTAL.labels(outcome=_outcome)
for _outcome in ("committed", "superseded", "interrupted"):
    COMMITS_TOTAL.labels(outcome=_outcome)
for _stage in ("vad", "stt", "llm", "tts"):
    QUEUE_DEPTH.labels(stage=_stage)


def exposition() -> bytes:
    return generate_latest(REGISTRY)
