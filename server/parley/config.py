"""Settings: one typed object, made in one place (flags > environment > config file > defaults).

Every field is a `parley serve` flag (`--field-name`) and an environment variable (`PARLEY_FIELD_NAME`);
settings_sources.py reads them. No other module reads the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from parley.settings_option import opt as _opt
from parley.sip_settings import SipSettings
from parley.turn_settings import TurnSettings

ENV_PREFIX = "PARLEY_"
ENV_ALIASES = {"cache_dir": "PARLEY_CACHE"}  # the cache folder's variable: PARLEY_CACHE
DATABASE_SCHEMES = ("postgresql://", "postgres://")

# "Gladly tell stories...": without it Qwen2.5-Coder-0.5B refused one story request in three
# ("I'm sorry, but I can't assist with that."); with it, none, and the same right answers. Not "a voice
# assistant": the model called itself one in its non-answers ("As a voice assistant, I don't have ..."),
# and without the words answered as many questions right (58 plain and phone-line questions, each as a
# call's first and all in one conversation: 44 and 48 against 45 and 48; 2026-12-07).
DEFAULT_SYSTEM_PROMPT = (
    "You are Parley, answering the phone, friendly and quick. Answer every question "
    "directly and helpfully, and gladly tell stories, give recipes and recommendations. "
    "Reply in English, in one or two short spoken sentences. No lists, no markdown."
)
DEFAULT_GREETING = "Hello, this is Parley. How can I help you today?"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "parley"


def default_data_dir() -> Path:
    """Where call records live by default: $XDG_DATA_HOME/parley, else ~/.local/share/parley."""
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base) if base else Path.home() / ".local" / "share") / "parley"


@dataclass(frozen=True)
class Settings(TurnSettings, SipSettings):
    """Every setting; the turn-taking ones and the SIP ones (groups of their own) are in turn_settings.py
    and sip_settings.py."""

    # service
    host: str = field(default="127.0.0.1", metadata=_opt("address the HTTP server binds to"))
    port: int = field(default=8080, metadata=_opt("HTTP port"))
    token: str = field(
        default="",
        metadata=_opt(
            "bearer token required on /offer, /whip, /api and /metrics (empty: none, on loopback only)"
        ),
    )
    insecure_open: bool = field(
        default=False,
        metadata=_opt(
            "serve on a non-loopback address with no token and SIP with no credentials (a lab only: "
            "anyone who reaches it may call, dial out, drain and read transcripts)"
        ),
    )
    max_calls: int = field(default=16, metadata=_opt("calls accepted at once; beyond it 503 + Retry-After"))
    max_body_bytes: int = field(default=65536, metadata=_opt("largest accepted signaling body (bytes)"))
    web_dir: str = field(default="", metadata=_opt("folder served at / (default: the repository's web/)"))
    log_level: str = field(default="info", metadata=_opt("debug, info, warning, error"))
    debug_audio_dir: str = field(
        default="", metadata=_opt("write every user utterance here as a WAV (for debugging; '' = off)")
    )
    # WebRTC
    ice_addresses: tuple[str, ...] = field(
        default=(), metadata=_opt("local addresses offered as ICE host candidates (comma list)", "webrtc")
    )
    ice_servers: tuple[str, ...] = field(
        default=(), metadata=_opt("STUN/TURN URLs (comma list; turn:user:pass@host:port)", "webrtc")
    )
    # carrier media streams
    public_url: str = field(
        default="",
        metadata=_opt(
            "https:// base URL carriers reach this service at, e.g. behind a TLS proxy: signatures are "
            "checked against it and stream URLs built from it ('' = from the request)",
            "carriers",
        ),
    )
    twilio_auth_token: str = field(
        default="",
        metadata=_opt(
            "Twilio auth token: /twilio/voice needs a valid X-Twilio-Signature ('' = unchecked)", "carriers"
        ),
    )
    telnyx_public_key: str = field(
        default="",
        metadata=_opt(
            "Telnyx public key (base64): /telnyx/voice needs a valid Ed25519 signature ('' = unchecked)",
            "carriers",
        ),
    )
    stream_secret: str = field(
        default="",
        metadata=_opt(
            "secret for the per-call stream tokens the webhooks mint; the same on every instance of a fleet "
            "('' = a random one per process when a carrier credential is set, else streams need no token)",
            "carriers",
        ),
    )
    stream_start_timeout_s: float = field(
        default=10.0,
        metadata=_opt("a media stream that sends no start message within this is closed", "carriers"),
    )
    # engines
    device: str = field(default="auto", metadata=_opt("where models run", "engines", ("auto", "cpu", "cuda")))
    cache_dir: str = field(
        default="", metadata=_opt("model cache folder (default ~/.cache/parley)", "engines")
    )
    vad_model: str = field(
        default="silero", metadata=_opt("'silero' or a path to a silero ONNX file", "engines")
    )
    stt_model: str = field(
        default="base",
        metadata=_opt(
            "'base' or 'tiny.en' (packaged), a faster-whisper size/hub name, or a CTranslate2 folder",
            "engines",
        ),
    )
    stt_language: str = field(default="en", metadata=_opt("spoken language ('' detects)", "engines"))
    # Two workers of one core each on 2 cores: Whisper's decoding waits on its threads more than it
    # computes, so a transcription on one thread took less than on two (0.18 against 0.20 s), and a
    # second caller's turn is not held up behind the first's batch.
    stt_workers: int = field(
        default=2, metadata=_opt("parallel STT batches (the cores are shared among them)", "engines")
    )
    stt_max_batch: int = field(default=8, metadata=_opt("utterances transcribed together at most", "engines"))
    llm_model: str = field(
        default="qwen2.5-0.5b",
        metadata=_opt(
            "'qwen2.5-0.5b', 'qwen2.5-coder-1.5b' or 'smollm2-135m' (packaged), a causal-LM hub name, "
            "or a local folder",
            "engines",
        ),
    )
    llm_runtime: str = field(
        default="auto",
        metadata=_opt(
            "how a local LLM runs (auto: llama.cpp on a CPU for a packaged model or .gguf, else CTranslate2)",
            "engines",
            ("auto", "ctranslate2", "llamacpp", "transformers"),
        ),
    )
    llm_url: str = field(
        default="", metadata=_opt("OpenAI-compatible endpoint (…/v1) instead of a local LLM", "engines")
    )
    llm_api_key: str = field(default="", metadata=_opt("API key for --llm-url", "engines"))
    llm_endpoint_model: str = field(default="", metadata=_opt("model name sent to --llm-url", "engines"))
    llm_workers: int = field(
        default=1,
        metadata=_opt(
            "LLM replicas, sharing the cores (1: every core for one batch, which later replies join)",
            "engines",
        ),
    )
    llm_threads: int = field(
        default=0,
        metadata=_opt(
            "threads of the llama.cpp LLM (0: every core, one while Whisper or Piper computes)",
            "engines",
        ),
    )
    llm_max_batch: int = field(
        default=8,
        metadata=_opt(
            "replies of different calls decoded together (1: one at a time); llama.cpp keeps as many "
            "conversations (~50 MB of KV cache each for Qwen2.5-0.5B)",
            "engines",
        ),
    )
    llm_max_tokens: int = field(default=80, metadata=_opt("longest reply, in tokens", "engines"))
    llm_temperature: float = field(default=0.0, metadata=_opt("0 = greedy", "engines"))
    tts_voice: str = field(
        default="joe",
        metadata=_opt("'joe' (packaged Piper voice) or a path to a Piper .onnx voice", "engines"),
    )
    # conversation
    system_prompt: str = field(
        default=DEFAULT_SYSTEM_PROMPT, metadata=_opt("the LLM's instructions", "agent")
    )
    greeting: str = field(
        default=DEFAULT_GREETING, metadata=_opt("said at call start ('' for none)", "agent")
    )
    # Off: on Qwen2.5-Coder-0.5B the manners and examples cost right answers (58 questions in one
    # conversation: 43 against 48) for fewer refusals the reply guard catches anyway (see agent/manners.py).
    phone_manners: bool = field(
        default=False,
        metadata=_opt(
            "open every agent's prompt with the phone manners and worked examples of agent/manners.py "
            "('off': the agent's prompt alone, e.g. for an endpoint whose template takes one system message)",
            "agent",
        ),
    )
    history_turns: int = field(
        default=3,
        metadata=_opt(
            "past turns sent to the LLM (to an endpoint: N to 2N-1, so that its prompt cache serves)", "agent"
        ),
    )
    yield_to_tts_ms: int = field(
        default=400,
        metadata=_opt(
            "the LLM pauses up to this long for the first audio of a reply (CPU: they share cores)", "agent"
        ),
    )
    speak_ahead_ms: int = field(
        default=1500,
        metadata=_opt(
            "a reply's audio is made at most this far ahead of what the caller has heard (0: as fast as "
            "it comes): a reply cut short leaves less made for nothing, a long one leaves cores to others",
            "agent",
        ),
    )
    max_reply_sentences: int = field(
        default=2,
        metadata=_opt("a reply stops after this many sentences (spoken replies stay short)", "agent"),
    )
    # agents that act
    agent: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "agent file (TOML), or NAME=FILE; repeatable, the first is the default (none: --system-prompt)",
            "agent",
        ),
    )
    events_url: str = field(
        default="",
        metadata=_opt("POST call events here (call.started, tool.called, ...; '' = none)", "agent"),
    )
    webhook_secret: str = field(
        default="",
        metadata=_opt("signs tool webhooks and events (X-Parley-Signature); set it from the env", "agent"),
    )
    # operations
    log_format: str = field(
        default="text", metadata=_opt("log lines as key=value text or JSON", "operations", ("text", "json"))
    )
    log_transcripts: bool = field(
        default=False,
        metadata=_opt(
            "log what callers and the agent said at info level too (else only at debug)", "operations"
        ),
    )
    log_numbers: bool = field(
        default=False,
        metadata=_opt("log phone numbers whole (else masked to their last 3 digits)", "operations"),
    )
    data_dir: str = field(
        default="", metadata=_opt("folder for call records (default ~/.local/share/parley)", "operations")
    )
    database: str = field(
        default="",
        metadata=_opt(
            "where call records go: '' = SQLite in --data-dir, postgresql://... (a fleet shares one), 'off'",
            "operations",
        ),
    )
    record_transcripts: bool = field(
        default=True,
        metadata=_opt(
            "keep what was said in call records and call.ended/tool.called events ('off': no text, "
            "digits, tool arguments or results, caller-set variables; numbers masked)",
            "operations",
        ),
    )
    retention_days: float = field(
        default=30.0,
        metadata=_opt("call records older than this are deleted (0: kept forever)", "operations"),
    )
    # access and limits
    call_token_secret: str = field(
        default="",
        metadata=_opt(
            "signs short-lived call tokens (`parley token`) that a page may present instead of --token "
            "('' = none); from PARLEY_CALL_TOKEN_SECRET or --call-token-secret-file",
            "access",
        ),
    )
    call_token_ttl_s: float = field(
        default=300.0, metadata=_opt("how long a call token from `parley token` is valid", "access")
    )
    turn_urls: tuple[str, ...] = field(
        default=(),
        metadata=_opt("TURN URLs the page gets time-limited credentials for (GET /api/ice)", "access"),
    )
    turn_secret: str = field(
        default="",
        metadata=_opt(
            "coturn's static-auth-secret (use-auth-secret), to mint TURN credentials for the page", "access"
        ),
    )
    turn_ttl_s: float = field(
        default=3600.0, metadata=_opt("TURN credentials handed to the page are valid this long", "access")
    )
    trusted_proxies: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "addresses or CIDR networks of proxies whose X-Forwarded-For names the caller (and whose "
            "X-Forwarded-Proto/-Host name the public URL); anyone else's X-Forwarded-* is ignored",
            "access",
        ),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "Host header values served besides localhost, loopback, the bound address and --public-url's "
            "host ('*': any); bound to every address (0.0.0.0, ::) with none given, any Host is served",
            "access",
        ),
    )
    allowed_origins: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "browser origins (https://shop.example.com) besides the service's own that may post offers "
            "and use the API ('*': any)",
            "access",
        ),
    )
    metrics_token: str = field(
        default="",
        metadata=_opt(
            "bearer token a scraper presents on /metrics instead of --token ('' = --token guards it)",
            "access",
        ),
    )
    setup_rate: float = field(
        default=1.0,
        metadata=_opt(
            "call set-ups per second per source address (offers, SIP INVITEs, carrier streams; 0: no limit)",
            "limits",
        ),
    )
    # At or under --max-calls: one source's burst alone must not be able to take every line.
    setup_burst: int = field(
        default=8, metadata=_opt("call set-ups a source may make at once before --setup-rate", "limits")
    )
    max_calls_per_source: int = field(
        default=4,
        metadata=_opt(
            "calls one source address (IPv6: its /64) may hold at once (0: no cap); --rate-limit-exempt "
            "networks, --sip-allow trunks and carriers whose webhooks are signed are spared",
            "limits",
        ),
    )
    rate_limit_exempt: tuple[str, ...] = field(
        # Loopback is this host: its own proxy, PBX or tools (a proxy in front should be named in
        # --trusted-proxies, so that the callers behind it are counted one by one).
        default=("127.0.0.0/8", "::1"),
        metadata=_opt(
            "addresses or CIDR networks the set-up rate limit spares (a carrier; --sip-allow trunks are "
            "spared too)",
            "limits",
        ),
    )
    max_sdp_bytes: int = field(default=16384, metadata=_opt("largest SDP offer accepted (bytes)", "limits"))
    max_m_lines: int = field(
        default=4, metadata=_opt("media sections (m= lines) an offer may have", "limits")
    )
    max_ice_candidates: int = field(default=64, metadata=_opt("ICE candidates an offer may carry", "limits"))
    max_dc_message_bytes: int = field(
        default=4096, metadata=_opt("largest data-channel message taken from the page (bytes)", "limits")
    )
    max_dc_messages_per_s: float = field(
        default=20.0, metadata=_opt("data-channel messages per second taken from the page", "limits")
    )
    connect_timeout_s: float = field(
        default=15.0, metadata=_opt("a WebRTC call whose media does not connect within this ends", "limits")
    )
    media_timeout_s: float = field(
        default=20.0,
        metadata=_opt("a WebRTC caller that sends no audio for this long has vanished (0: never)", "limits"),
    )
    max_call_s: float = field(default=3600.0, metadata=_opt("longest call (0: no limit)", "limits"))
    max_silence_s: float = field(
        default=120.0,
        metadata=_opt("a call in which nobody speaks for this long ends (0: never)", "limits"),
    )
    engine_timeout_s: float = field(
        default=20.0,
        metadata=_opt(
            "a model that gives nothing for this long (a transcript, the next token or audio) has failed "
            "(0: wait forever)",
            "limits",
        ),
    )
    apology: str = field(
        default="Sorry, I missed that. Could you say it again?",
        metadata=_opt(
            "what the agent says when a model failed on the caller's turn ('' for nothing)", "limits"
        ),
    )
    max_engine_failures: int = field(
        default=3, metadata=_opt("a call whose turns failed this often ends (0: never)", "limits")
    )

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()

    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()


class SettingsError(ValueError):
    pass


def sip_address(value: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingsError(f"sip must be HOST:PORT or 'off', not {value!r}")
    return host.strip("[]"), int(port)


def rtp_port_range(value: str) -> tuple[int, int]:
    """`LOW-HIGH` -> (low, high), an even low and room for at least one RTP/RTCP pair."""
    low, sep, high = value.partition("-")
    if not sep or not low.isdigit() or not high.isdigit():
        raise SettingsError(f"rtp_ports must be LOW-HIGH, not {value!r}")
    lo, hi = int(low), int(high)
    if not 1024 <= lo < hi < 65536:
        raise SettingsError(f"rtp_ports {value!r} must lie within 1024-65535, low below high")
    return lo + lo % 2, hi
