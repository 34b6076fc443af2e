"""The agent settings: what the agent is told and says, its replies' shape, the agents that act, their
events. A group of `Settings` (config.py), which inherits it; runtime.py and the call read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt

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


@dataclass(frozen=True)
class AgentSettings:
    """The conversation: the agent's prompt, greeting and reply shape, and agents that act."""

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
    analysis_queue: int = field(
        default=100,
        metadata=_opt(
            "ended calls waiting for their post-call analysis ([analysis] in an agent file) at most; "
            "beyond it a call goes unanalysed, counted",
            "agent",
        ),
    )
