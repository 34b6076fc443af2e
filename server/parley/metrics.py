"""Prometheus metrics, all in one place (prefix `parley_`), as the README's "Metrics" table lists them.

Labels are bounded (transport, outcome, stage, reason, engine): never a call id, a turn id or a peer
address. The label values a dashboard or an alert reads are created at import with a zero, so that a
rate() or a sum() has a series to work on before the first event (a fresh pod is not "no data").
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# 10 ms .. 5 s, dense where the targets are: interruption p95 <= 0.15 s, response p50 <= 1.2 s.
VOICE_BUCKETS = (
    0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.6, 0.8, 1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
)  # fmt: skip
# Finer below 10 ms where the work is that quick: one VAD chunk takes ~0.2 ms, and pausing the agent once
# the VAD has heard the caller takes ~1 ms (the 70-90 ms before it are the audio reaching the VAD).
FINE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, *VOICE_BUCKETS)

TRANSPORTS = ("webrtc", "sip", "twilio", "telnyx")
STAGES = ("vad", "stt", "llm_first_token", "tts_first_audio", "denoise")
ENGINES = ("vad", "stt", "llm", "tts", "denoise")
QUEUES = ("vad", "stt", "llm", "tts", "records", "denoise")

# Calls
CALLS_ACTIVE = Gauge("parley_calls_active", "Calls in progress", ["transport"], registry=REGISTRY)
CALLS_TOTAL = Counter("parley_calls_total", "Calls ended", ["transport", "outcome"], registry=REGISTRY)
CALLS_REFUSED_TOTAL = Counter(
    "parley_calls_refused_total",
    "Calls refused before they started (loading, load_failed, capacity, closing, forbidden, ...)",
    ["transport", "reason"],
    registry=REGISTRY,
)
DIAL_REFUSED_TOTAL = Counter(
    "parley_dial_refused_total",
    "Dial-outs the destination policy refused (host: not a --dial-trunks trunk, prefix, rate)",
    ["reason"],
    registry=REGISTRY,
)
VARIABLES_DROPPED_TOTAL = Counter(
    "parley_variables_dropped_total",
    "Variables a caller tried to set that the agent file does not declare (or a call token bound)",
    ["transport"],
    registry=REGISTRY,
)
CALLS_MAX = Gauge(
    "parley_calls_max", "Calls this instance accepts at once (--max-calls): capacity", registry=REGISTRY
)
READY = Gauge(
    "parley_ready",
    "1 while this instance accepts calls (models loaded, below capacity, not draining): /readyz is 200",
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
TURN_END_VERDICTS_TOTAL = Counter(
    "parley_turn_end_verdicts_total",
    "The end-of-turn model's verdicts at a turn's first pause: complete (the turn ends early, its reply "
    "unheld) or incomplete (silence decides)",
    ["outcome"],
    registry=REGISTRY,
)
UNFINISHED_HOLDS_TOTAL = Counter(
    "parley_unfinished_holds_total",
    "Turns whose transcript stopped mid-sentence ('... a table for') or mid-number ('... number is 47.'): "
    "their reply held longer, in case the caller goes on",
    registry=REGISTRY,
)
SPECULATIVE_REPLIES_TOTAL = Counter(
    "parley_speculative_replies_total",
    "Replies started at a turn's first pause: used (the turn ended there) or wasted (the caller went on)",
    ["outcome"],
    registry=REGISTRY,
)
SPECULATION_WASTED_SECONDS = Histogram(
    "parley_speculation_wasted_seconds",
    "How long a wasted speculative reply ran before the caller's speech cancelled it",
    buckets=VOICE_BUCKETS,
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
    buckets=FINE_BUCKETS,
    registry=REGISTRY,
)

# Latency
STAGE_LATENCY = Histogram(
    "parley_stage_latency_seconds",
    "Time spent in a stage, per turn",
    ["stage"],
    buckets=FINE_BUCKETS,
    registry=REGISTRY,
)
RESPONSE_LATENCY = Histogram(
    "parley_response_latency_seconds",
    "End of the user's speech to the first reply audio frame sent",
    buckets=VOICE_BUCKETS,
    registry=REGISTRY,
)

# Health
QUEUE_DEPTH = Gauge(
    "parley_queue_depth",
    "Items waiting in stage queues (all calls), and call-record events waiting to be written",
    ["stage"],
    registry=REGISTRY,
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
EVENTS_TOTAL = Counter(
    "parley_events_total",
    "Events for --events-url by type and outcome (delivered, failed after retries, dropped at overflow)",
    ["type", "outcome"],
    registry=REGISTRY,
)
TOOL_CALLS_TOTAL = Counter(
    "parley_tool_calls_total",
    "Tool calls by outcome (ok, error, skipped: asked for a revision that was superseded)",
    ["outcome"],
    registry=REGISTRY,
)
REPLIES_REGENERATED_TOTAL = Counter(
    "parley_replies_regenerated_total",
    "Replies written again before any of them was heard, by the failure shape their opening had (refusal, "
    "condolence, non_answer: talk about itself; invented_number: a tool call with a number nobody said; "
    "repeated_call: a call the conversation already holds; not_looked_up: words where a lookup of the "
    "caller's number was due; pipeline/reply_guard.py)",
    ["reason"],
    registry=REGISTRY,
)
LLM_PROMPT_TOKENS_TOTAL = Counter(
    "parley_llm_prompt_tokens_total",
    "Prompt tokens of replies the in-process llama.cpp LLM found kept from the conversation's last turn "
    "(kept) or had to read (read): reading costs ~10 ms a token on 2 cores",
    ["outcome"],
    registry=REGISTRY,
)
IDLE_PROMPTS_TOTAL = Counter(
    "parley_idle_prompts_total",
    "Lines said to callers who went quiet (prompt: 'Are you still there?'; closing: the last, before the "
    "call ends as idle)",
    ["type"],
    registry=REGISTRY,
)
AMD_TOTAL = Counter(
    "parley_amd_total",
    "Who answered the agent's outbound calls (amd.py): human, machine (voicemail), ivr, unknown",
    ["result"],
    registry=REGISTRY,
)
AMD_DECISION_SECONDS = Histogram(
    "parley_amd_decision_seconds",
    "From the answer to the answering-machine verdict (seconds of the callee's audio)",
    buckets=(0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 8.0),
    registry=REGISTRY,
)
ANALYSES_TOTAL = Counter(
    "parley_analyses_total",
    "Post-call analyses (analysis/) by outcome: ok, invalid (an answer not of its schema), failed (the LLM "
    "failed), dropped (the queue was full, or the service stopped first)",
    ["outcome"],
    registry=REGISTRY,
)
ANALYSES_WAITING = Gauge(
    "parley_analyses_waiting", "Ended calls waiting for their post-call analysis", registry=REGISTRY
)
RECORDINGS_TOTAL = Counter(
    "parley_recordings_total",
    "Call recordings (recording/) by outcome: ok (stored), failed (the file or the store failed), dropped "
    "(the writer fell behind); the call goes on either way",
    ["outcome"],
    registry=REGISTRY,
)
ENGINE_ERRORS_TOTAL = Counter("parley_engine_errors_total", "Engine failures", ["engine"], registry=REGISTRY)
CALL_THREADS = Gauge(
    "parley_call_threads", "Stage threads of calls still alive (0 when no call runs)", registry=REGISTRY
)
CALL_THREADS.set_function(lambda: sum(t.name.startswith("c-") for t in threading.enumerate()))
MODELS_READY = Gauge("parley_models_ready", "1 once every model is loaded", registry=REGISTRY)
STAGE_THREADS_STUCK = Gauge(
    "parley_stage_threads_stuck",
    "Stage threads of ended calls that did not stop (a model that never returns), until they do",
    registry=REGISTRY,
)
HTTP_ERRORS_TOTAL = Counter(
    "parley_http_errors_total",
    "HTTP requests refused, by reason (malformed, unauthorised, too_large, rate_limited, ...: the status)",
    ["reason"],
    registry=REGISTRY,
)
HTTP_ERROR_REASONS = {
    400: "malformed",
    401: "unauthorised",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_type",
    421: "misdirected",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
}
RECORD_EVENTS_DROPPED_TOTAL = Counter(
    "parley_record_events_dropped_total",
    "Call-record events not stored (queue_full: the database is too slow; write_failed)",
    ["reason"],
    registry=REGISTRY,
)

for _transport in TRANSPORTS:
    CALLS_ACTIVE.labels(transport=_transport)
    CALLS_REFUSED_TOTAL.labels(transport=_transport, reason="capacity")
    CALLS_REFUSED_TOTAL.labels(transport=_transport, reason="rate_limited")
    CALLS_TOTAL.labels(transport=_transport, outcome="hangup")
    CALLS_TOTAL.labels(transport=_transport, outcome="idle")  # idle.py
for _line in ("prompt", "closing"):
    IDLE_PROMPTS_TOTAL.labels(type=_line)
for _result in ("human", "machine", "ivr", "unknown"):  # amd.py's RESULTS
    AMD_TOTAL.labels(result=_result)
for _outcome in ("voicemail", "machine"):  # answering.py: a message left, or hung up on a machine
    CALLS_TOTAL.labels(transport="sip", outcome=_outcome)
for _outcome in ("ok", "failed", "dropped"):  # recording/recordings.py
    RECORDINGS_TOTAL.labels(outcome=_outcome)
for _reason in ("host", "prefix", "rate"):
    DIAL_REFUSED_TOTAL.labels(reason=_reason)
for _outcome in ("ok", "invalid", "failed", "dropped"):  # analysis/analyses.py
    ANALYSES_TOTAL.labels(outcome=_outcome)
for _reason in ("refusal", "condolence", "non_answer", "invented_number", "repeated_call", "not_looked_up"):
    REPLIES_REGENERATED_TOTAL.labels(reason=_reason)
for _outcome in ("confirmed", "cancelled", "timeout"):
    REOPEN_CANDIDATES_TOTAL.labels(outcome=_outcome)
for _outcome in ("committed", "superseded", "interrupted"):
    COMMITS_TOTAL.labels(outcome=_outcome)
for _outcome in ("used", "wasted"):
    SPECULATIVE_REPLIES_TOTAL.labels(outcome=_outcome)
for _stage in STAGES:
    STAGE_LATENCY.labels(stage=_stage)
for _queue in QUEUES:
    QUEUE_DEPTH.labels(stage=_queue)
    if _queue != "records":
        FRAMES_DROPPED_TOTAL.labels(reason=f"{_queue}_queue_full")
for _engine in ENGINES:
    ENGINE_ERRORS_TOTAL.labels(engine=_engine)
for _transport, _reason in (
    ("webrtc", "ice_failed"),
    ("webrtc", "ice_timeout"),
    ("sip", "malformed"),
    ("sip", "rtp_timeout"),
    ("sip", "no_ack"),
    ("sip", "rtp_foreign"),
    ("sip", "srtp_unauthenticated"),
    ("sip", "srtcp_unauthenticated"),
    ("sip", "send_failed"),
    ("sip", "rate_limited"),
    ("sip", "transactions_full"),
    ("sip", "connections_full"),
    ("sip", "forbidden"),
    ("sip", "tls_failed"),
):
    TRANSPORT_ERRORS_TOTAL.labels(transport=_transport, reason=_reason)
for _reason in ("queue_full", "write_failed"):
    RECORD_EVENTS_DROPPED_TOTAL.labels(reason=_reason)


def exposition() -> bytes:
    return generate_latest(REGISTRY)
