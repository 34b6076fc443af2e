"""The call settings: how long a call may last or stay silent, and what it does when its models fail.
A group of `Settings` (config.py), which inherits it; runtime.py and the call read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.settings_option import opt as _opt


@dataclass(frozen=True)
class CallSettings:
    """The limits of one call."""

    max_call_s: float = field(default=3600.0, metadata=_opt("longest call (0: no limit)", "limits"))
    max_silence_s: float = field(
        default=120.0,
        metadata=_opt("a call in which nobody speaks for this long ends (0: never)", "limits"),
    )
    idle_prompt_after_s: float = field(
        default=0.0,
        metadata=_opt(
            "a caller silent this long after the agent spoke is asked whether they are still there, and "
            "hung up on when they stay silent (an agent file's idle_prompt_after_s wins; 0: off)",
            "limits",
        ),
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
