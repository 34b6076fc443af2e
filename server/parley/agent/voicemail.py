"""An agent file's `[voicemail]` table: what the agent does when a call it dialled is answered by a
machine (amd.py decides who answered).

```toml
[voicemail]
detect = true                     # listen to who answers this agent's outbound calls first
on_machine = "leave_message"      # or "hang_up" (default: leave_message when there is a message)
message = "Hi {name}, this is Acme about your order. Please call us back on 555 0100."
on_ivr = "talk"                   # a phone menu answered: "talk" (as to a person) or "hang_up"
on_unknown = "talk"               # no verdict (silence, or no telling): "talk" or "hang_up"
```

The message is a template over the call's variables, as the greeting is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from parley.config import SettingsError

OnMachine = Literal["leave_message", "hang_up"]
OnOther = Literal["talk", "hang_up"]
_KEYS = ("detect", "on_machine", "message", "on_ivr", "on_unknown")
MAX_MESSAGE_CHARS = 2000


@dataclass(frozen=True)
class Voicemail:
    detect: bool = False
    on_machine: OnMachine = "hang_up"
    message: str = ""
    on_ivr: OnOther = "talk"
    on_unknown: OnOther = "talk"


Fail = Callable[[str, str], SettingsError]  # the agent file's reader: a message and the key it is about


def read_voicemail(raw: Any, fail: Fail) -> Voicemail:
    """The `[voicemail]` table, checked; `fail` names the file and line of what is wrong."""
    if not isinstance(raw, Mapping):
        raise fail("[voicemail] must be a table", "voicemail")
    for key in raw:
        if key not in _KEYS:
            raise fail(f"[voicemail] has an unknown key {key!r} (known: {', '.join(_KEYS)})", key)
    detect = raw.get("detect", False)
    if not isinstance(detect, bool):
        raise fail("detect must be true or false", "detect")
    message = raw.get("message", "")
    if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
        raise fail(f"message must be a string of at most {MAX_MESSAGE_CHARS} characters", "message")
    on_machine = raw.get("on_machine", "leave_message" if message.strip() else "hang_up")
    if on_machine not in ("leave_message", "hang_up"):
        raise fail('on_machine must be "leave_message" or "hang_up"', "on_machine")
    if on_machine == "leave_message" and not message.strip():
        raise fail('on_machine = "leave_message" needs a message to leave', "on_machine")
    others: dict[str, OnOther] = {}
    for key in ("on_ivr", "on_unknown"):
        value = raw.get(key, "talk")
        if value not in ("talk", "hang_up"):
            raise fail(f'{key} must be "talk" or "hang_up"', key)
        others[key] = value
    return Voicemail(detect, on_machine, message, others["on_ivr"], others["on_unknown"])
