"""Agent files: what an agent is told, says and may do, in TOML (`--agent FILE`, `--agent NAME=FILE`).

```toml
system_prompt = "You are the order desk of Acme. The caller is {caller}."
greeting = "Acme orders, how can I help?"
hold_phrase = "One moment while I look that up."   # said once when a tool runs longer than hold_after_ms
hold_after_ms = 700
hold_sound = "hold.wav"                             # looped while a tool runs past hold_after_ms
yield_phrase = "Sure, go ahead."                    # said for "wait" or "hold on", not a reply ("": off)
idle_prompt_after_s = 10                            # a silent caller is prompted (0: off; default: the
                                                    #   service's --idle-prompt-after-s, off unless set)
idle_prompt = "Are you still there, {caller}?"      # said up to idle_prompts times (default 2)
idle_closing = "I'll hang up now. Goodbye."         # then this, and the call ends with outcome "idle"
caller_variables = ["order_id", "language"]         # what a call's context may set (others dropped)
sip_headers = ["X-Customer-Id"]                     # SIP headers whose values become variables
sip_users = ["+15551234567", "500"]                 # request-URI users that reach this agent ("*": any)
record_audio = true                                 # record its calls, whatever --record-audio says
recording_notice = "This call is recorded."         # said first (before the greeting) on a recorded call

[[tools]]
name = "lookup_order"
description = "Look up an order by its six-digit number"
url = "https://backend.example.com/tools/lookup_order"   # or python = "module:function"
side_effects = false
timeout_ms = 3000
parameters = { type = "object", properties = { number = { type = "string" } }, required = ["number"] }

[builtins]
end_call = true
transfer = ["sip:desk@pbx.example.com", "+15551234567"]
send_dtmf = true

[analysis]                                          # asked of each call once it has ended (analysis/)
summary = true
schema = { type = "object", properties = { resolved = { type = "boolean" } }, required = ["resolved"] }
success = "the caller's order status was given"

[voicemail]                                         # the agent's outbound calls (agent/voicemail.py)
detect = true                                       # who answered: human, machine, ivr or unknown (amd.py)
on_machine = "leave_message"                        # after the beep, then hang up; or "hang_up" at once
message = "Hi {name}, this is Acme about your order. Please call us back."
```

`hold_sound` is a WAV file of linear PCM (8-48 kHz, a fraction of a second to half a minute; a path
relative to the agent file's folder), checked when the file is read. It plays after the hold phrase,
looped, until the tool's result or the caller's speech arrives, and stops there mid-clip; the caller's
share of the reply (what the history keeps) has no words for it. The idle lines are templates over the
call's variables, as the greeting is; speech or a keypad press from the caller starts their count again.

A call's context (the offer's `context`, a carrier's custom parameters, the `sip_headers`, which become
`x_customer_id` and so on) sets only the variables the file declares: `caller_variables` and the
headers' names. A call token's `context` sets its keys whatever the file declares, and a caller cannot
change them. What does not come from the service itself reaches the model as data, never as
instructions (agent/variables.py).

A file that cannot be used fails at start-up with a message naming the file and the line.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from parley.agent.analysis_spec import AnalysisSpec, read_analysis
from parley.agent.hold_sound import HoldSound, HoldSoundError, load_hold_sound
from parley.agent.templates import is_plain_name, placeholders
from parley.agent.variables import SERVICE_NAMES
from parley.agent.voicemail import Voicemail, read_voicemail
from parley.config import SettingsError

DEFAULT_HOLD_AFTER_MS = 700
# What a person says to someone who cuts in with "wait" or "hold on": the floor is theirs. Qwen2.5-0.5B,
# given "Wait." after a reply it was cut in, answered "I'm sorry, but I can't assist with that." (2 of 2,
# "Hold on." and "Uh, wait." alike), and those refusals then led it to refuse the next requests.
DEFAULT_YIELD_PHRASE = "Sure, go ahead."
DEFAULT_TOOL_TIMEOUT_MS = 5000
DEFAULT_IDLE_PROMPTS = 2
DEFAULT_IDLE_PROMPT = "Are you still there?"
DEFAULT_IDLE_CLOSING = "I'll hang up now. Goodbye."
MAX_IDLE_PROMPT_AFTER_S = 600
MAX_IDLE_PROMPTS = 10
MAX_TOOL_TIMEOUT_MS = 120_000
BUILTIN_NAMES = ("end_call", "transfer", "send_dtmf")
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_AGENT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_DESTINATION = re.compile(r"(sips?:[^\s<>\"]+|\+[0-9]{6,15})")
_TOP_KEYS = {
    "sip_users",
    "name",
    "system_prompt",
    "greeting",
    "hold_phrase",
    "hold_after_ms",
    "hold_sound",
    "yield_phrase",
    "idle_prompt_after_s",
    "idle_prompts",
    "idle_prompt",
    "idle_closing",
    "sip_headers",
    "caller_variables",
    "record_audio",
    "recording_notice",
    "tools",
    "builtins",
    "analysis",
    "voicemail",
}
_TOOL_KEYS = {"name", "description", "parameters", "url", "python", "side_effects", "timeout_ms"}
_BUILTIN_KEYS = {"end_call", "transfer", "send_dtmf"}
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class AgentFileError(SettingsError):
    """An agent file that cannot be used: the service does not start, and says where the problem is."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(EMPTY_PARAMETERS))
    url: str = ""
    python: str = ""
    side_effects: bool = True
    timeout_ms: int = DEFAULT_TOOL_TIMEOUT_MS
    function: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI-compatible endpoints and chat templates take it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class Builtins:
    end_call: bool = False
    transfer: tuple[str, ...] = ()
    send_dtmf: bool = False


@dataclass(frozen=True)
class Agent:
    name: str
    system_prompt: str
    greeting: str = ""
    hold_phrase: str = ""
    hold_after_ms: int = DEFAULT_HOLD_AFTER_MS
    yield_phrase: str = DEFAULT_YIELD_PHRASE
    tools: tuple[ToolSpec, ...] = ()
    builtins: Builtins = Builtins()
    sip_headers: tuple[str, ...] = ()
    sip_users: tuple[str, ...] = ()  # request-URI users (numbers, extensions; "*": any) that reach it
    caller_variables: tuple[str, ...] = ()  # the variables a call's context may set
    record_audio: bool | None = None  # recorded or not whatever --record-audio says; None: as it says
    recording_notice: str = ""  # a template, said first on a recorded call (recording/)
    analysis: AnalysisSpec | None = None  # what is asked of each call once it has ended (analysis/)
    hold_sound: HoldSound | None = None  # looped while a tool runs past hold_after_ms
    idle_prompt_after_s: float | None = None  # None: the service's --idle-prompt-after-s (idle.py)
    idle_prompts: int = DEFAULT_IDLE_PROMPTS
    idle_prompt: str = DEFAULT_IDLE_PROMPT
    idle_closing: str = DEFAULT_IDLE_CLOSING
    voicemail: Voicemail = field(default_factory=Voicemail)  # on a call it dialled: a machine answering

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def offers_tools(self) -> bool:
        """Whether its replies are offered tools: its own, or a built-in it enables."""
        return bool(self.tools) or self.builtins != Builtins()

    def caller_may_set(self, name: str) -> bool:
        """Whether a caller's context may set this variable: declared, or one of the SIP headers'."""
        return name in self.caller_variables or name in map(header_variable, self.sip_headers)


def header_variable(header: str) -> str:
    """The variable a SIP header's value becomes: X-Customer-Id -> x_customer_id."""
    return header.lower().replace("-", "_")


def parse_agent_arg(value: str) -> tuple[str | None, str]:
    """`NAME=FILE` or `FILE` -> (name or None, path)."""
    name, sep, path = value.partition("=")
    if sep and _AGENT_NAME.fullmatch(name) and not Path(value).exists():
        return name, path
    return None, value


def load_agent_file(path: str | Path, name: str | None = None) -> Agent:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentFileError(f"agent file {file}: cannot be read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AgentFileError(f"agent file {file}: {exc}") from None
    return _Reader(file, text).agent(data, name)


class _Reader:
    """Checks one file's values, naming the line of whatever is wrong."""

    def __init__(self, file: Path, text: str) -> None:
        self.file = file
        self.lines = text.splitlines()

    def fail(self, message: str, key: str, occurrence: int = 0) -> AgentFileError:
        return AgentFileError(f"agent file {self.file}, line {self._line(key, occurrence)}: {message}")

    def _line(self, key: str, occurrence: int) -> int:
        pattern = re.compile(rf"^\s*(\[\[?\s*{re.escape(key)}\s*\]\]?|{re.escape(key)}\s*=)")
        seen = 0
        for number, line in enumerate(self.lines, start=1):
            if pattern.search(line):
                if seen == occurrence:
                    return number
                seen += 1
        return 1

    def agent(self, data: dict[str, Any], name: str | None) -> Agent:
        for key in data:
            if key not in _TOP_KEYS:
                raise self.fail(f"unknown key {key!r} (known: {', '.join(sorted(_TOP_KEYS))})", key)
        name = name or self._string(data, "name", "") or self.file.stem
        if not _AGENT_NAME.fullmatch(name):
            raise self.fail(f"agent name {name!r} must be letters, digits, '.', '_' or '-'", "name")
        prompt = self._string(data, "system_prompt", "")
        if not prompt.strip():
            raise self.fail("system_prompt is required", "system_prompt")
        hold_after = data.get("hold_after_ms", DEFAULT_HOLD_AFTER_MS)
        if not isinstance(hold_after, int) or isinstance(hold_after, bool) or not 0 <= hold_after <= 60_000:
            raise self.fail("hold_after_ms must be an integer of milliseconds (0-60000)", "hold_after_ms")
        headers = data.get("sip_headers", [])
        if not isinstance(headers, list) or not all(
            isinstance(h, str) and h.lower().startswith("x-") for h in headers
        ):
            raise self.fail("sip_headers must be a list of X- header names", "sip_headers")
        users = data.get("sip_users", [])
        if not isinstance(users, list) or not all(isinstance(u, str) and u and " " not in u for u in users):
            raise self.fail(
                'sip_users must be a list of request-URI users ("+15551234567", "500", "*")', "sip_users"
            )
        declared = data.get("caller_variables", [])
        if not isinstance(declared, list) or not all(
            isinstance(v, str) and is_plain_name(v) and v not in SERVICE_NAMES for v in declared
        ):
            raise self.fail(
                "caller_variables must be a list of plain names (letters, digits, _), none of "
                + ", ".join(sorted(SERVICE_NAMES)),
                "caller_variables",
            )
        raw_tools = data.get("tools", [])
        if not isinstance(raw_tools, list):
            raise self.fail("tools must be an array of tables ([[tools]])", "tools")
        tools = tuple(self.tool(raw, i) for i, raw in enumerate(raw_tools))
        names = [t.name for t in tools]
        for i, tool_name in enumerate(names):
            if tool_name in names[:i]:
                raise self.fail(f"tool {tool_name!r} is declared twice", "tools", i)
        builtins = self.builtins(data.get("builtins", {}))
        for template_key in ("system_prompt", "greeting", "hold_phrase", "yield_phrase"):
            self._string(data, template_key, "")  # type-checked here, placeholders below
        record_audio = data.get("record_audio")
        if record_audio is not None and not isinstance(record_audio, bool):
            raise self.fail("record_audio must be true or false", "record_audio")
        idle_after, idle_prompts = self.idle_timing(data)
        idle_lines: dict[str, str] = {}
        for key, default in (("idle_prompt", DEFAULT_IDLE_PROMPT), ("idle_closing", DEFAULT_IDLE_CLOSING)):
            idle_lines[key] = self._string(data, key, default)
            if not idle_lines[key].strip():
                raise self.fail(f"{key} must say something (leave it out for the default)", key)
        return Agent(
            name=name,
            system_prompt=prompt,
            greeting=self._string(data, "greeting", ""),
            hold_phrase=self._string(data, "hold_phrase", ""),
            hold_after_ms=hold_after,
            yield_phrase=self._string(data, "yield_phrase", DEFAULT_YIELD_PHRASE),
            tools=tools,
            builtins=builtins,
            sip_headers=tuple(headers),
            sip_users=tuple(users),
            caller_variables=tuple(declared),
            record_audio=record_audio,
            recording_notice=self._string(data, "recording_notice", ""),
            analysis=read_analysis(data["analysis"], self.fail) if "analysis" in data else None,
            hold_sound=self.hold_sound(data),
            idle_prompt_after_s=idle_after,
            idle_prompts=idle_prompts,
            idle_prompt=idle_lines["idle_prompt"],
            idle_closing=idle_lines["idle_closing"],
            voicemail=read_voicemail(data.get("voicemail", {}), self.fail),
        )

    def idle_timing(self, data: Mapping[str, Any]) -> tuple[float | None, int]:
        after = data.get("idle_prompt_after_s")
        if after is not None and (
            not isinstance(after, int | float)
            or isinstance(after, bool)
            or not 0 <= after <= MAX_IDLE_PROMPT_AFTER_S
        ):
            raise self.fail(
                f"idle_prompt_after_s must be seconds (0: off, up to {MAX_IDLE_PROMPT_AFTER_S})",
                "idle_prompt_after_s",
            )
        prompts = data.get("idle_prompts", DEFAULT_IDLE_PROMPTS)
        if not isinstance(prompts, int) or isinstance(prompts, bool) or not 0 <= prompts <= MAX_IDLE_PROMPTS:
            raise self.fail(f"idle_prompts must be an integer (0-{MAX_IDLE_PROMPTS})", "idle_prompts")
        return (None if after is None else float(after)), prompts

    def hold_sound(self, data: Mapping[str, Any]) -> HoldSound | None:
        value = self._string(data, "hold_sound", "")
        if not value:
            return None
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = self.file.parent / path  # beside the agent file, wherever the service started
        try:
            return load_hold_sound(path)
        except HoldSoundError as exc:
            raise self.fail(f"hold_sound {str(path)!r}: {exc}", "hold_sound") from None

    def _string(self, data: Mapping[str, Any], key: str, default: str) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"{key} must be a string", key)
        return value

    def tool(self, raw: Any, index: int) -> ToolSpec:
        if not isinstance(raw, dict):
            raise self.fail("each [[tools]] entry must be a table", "tools", index)
        for key in raw:
            if key not in _TOOL_KEYS:
                raise self.fail(f"tool has an unknown key {key!r}", "tools", index)
        name = raw.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise self.fail("a tool needs a name of letters, digits, '_' or '-'", "tools", index)
        if name in BUILTIN_NAMES:
            raise self.fail(f"{name!r} is a built-in: enable it under [builtins]", "tools", index)
        description = raw.get("description", "")
        if not isinstance(description, str) or not description.strip():
            raise self.fail(f"tool {name!r} needs a description (the model reads it)", "tools", index)
        parameters = raw.get("parameters", EMPTY_PARAMETERS)
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise self.fail(f"tool {name!r}: parameters must be a JSON Schema of type object", "tools", index)
        try:
            jsonschema.Draft202012Validator.check_schema(parameters)
        except jsonschema.SchemaError as exc:
            raise self.fail(
                f"tool {name!r}: parameters is not a valid JSON Schema: {exc.message}", "tools", index
            ) from None
        url, python = raw.get("url", ""), raw.get("python", "")
        if bool(url) == bool(python) or not isinstance(url, str) or not isinstance(python, str):
            raise self.fail(f"tool {name!r} needs exactly one of url or python", "tools", index)
        if url and not re.match(r"https?://[^\s/]+", url):
            raise self.fail(f"tool {name!r}: url must be http:// or https://", "tools", index)
        function = _import_function(python) if python else None
        if python and function is None:
            raise self.fail(
                f"tool {name!r}: python {python!r} is not an importable module:function", "tools", index
            )
        side_effects = raw.get("side_effects", True)
        timeout_ms = raw.get("timeout_ms", DEFAULT_TOOL_TIMEOUT_MS)
        if not isinstance(side_effects, bool):
            raise self.fail(f"tool {name!r}: side_effects must be true or false", "tools", index)
        if (
            not isinstance(timeout_ms, int)
            or isinstance(timeout_ms, bool)
            or not 1 <= timeout_ms <= MAX_TOOL_TIMEOUT_MS
        ):
            raise self.fail(f"tool {name!r}: timeout_ms must be 1-{MAX_TOOL_TIMEOUT_MS}", "tools", index)
        return ToolSpec(name, description, parameters, url, python, side_effects, timeout_ms, function)

    def builtins(self, raw: Any) -> Builtins:
        if not isinstance(raw, dict):
            raise self.fail("[builtins] must be a table", "builtins")
        for key in raw:
            if key not in _BUILTIN_KEYS:
                raise self.fail(f"unknown built-in {key!r} (known: {', '.join(BUILTIN_NAMES)})", key)
        end_call, send_dtmf = raw.get("end_call", False), raw.get("send_dtmf", False)
        transfer = raw.get("transfer", [])
        if not isinstance(end_call, bool):
            raise self.fail("end_call must be true or false", "end_call")
        if not isinstance(send_dtmf, bool):
            raise self.fail("send_dtmf must be true or false", "send_dtmf")
        if not isinstance(transfer, list) or not all(
            isinstance(d, str) and _DESTINATION.fullmatch(d) for d in transfer
        ):
            raise self.fail("transfer must list destinations: sip:... URIs or +E.164 numbers", "transfer")
        return Builtins(end_call=end_call, transfer=tuple(transfer), send_dtmf=send_dtmf)


def _import_function(target: str) -> Callable[..., Any] | None:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        return None
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError):
        return None
    return function if callable(function) else None


def default_agent(system_prompt: str, greeting: str) -> Agent:
    """The agent of a service started without --agent: the --system-prompt and --greeting settings."""
    return Agent(name="default", system_prompt=system_prompt, greeting=greeting)


def load_agents(values: tuple[str, ...], system_prompt: str, greeting: str) -> dict[str, Agent]:
    """The service's agents by name, the first being the default."""
    if not values:
        return {"default": default_agent(system_prompt, greeting)}
    agents: dict[str, Agent] = {}
    for value in values:
        name, path = parse_agent_arg(value)
        agent = load_agent_file(path, name)
        if agent.name in agents:
            raise AgentFileError(f"two agents are named {agent.name!r}")
        agents[agent.name] = agent
    return agents


def template_names(agent: Agent) -> set[str]:
    return (
        placeholders(agent.system_prompt)
        | placeholders(agent.greeting)
        | placeholders(agent.hold_phrase)
        | placeholders(agent.yield_phrase)
        | placeholders(agent.recording_notice)
        | placeholders(agent.idle_prompt)
        | placeholders(agent.idle_closing)
        | placeholders(agent.voicemail.message)
    )
