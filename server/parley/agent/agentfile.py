"""Agent files: what an agent is told, says and may do, in TOML (`--agent FILE`, `--agent NAME=FILE`).

```toml
system_prompt = "You are the order desk of Acme. The caller is {caller}."
greeting = "Acme orders, how can I help?"
hold_phrase = "One moment while I look that up."   # said once when a tool runs longer than hold_after_ms
hold_after_ms = 700
yield_phrase = "Sure, go ahead."                    # said for "wait" or "hold on", not a reply ("": off)
caller_variables = ["order_id", "language"]         # what a call's context may set (others dropped)
sip_headers = ["X-Customer-Id"]                     # SIP headers whose values become variables
sip_users = ["+15551234567", "500"]                 # request-URI users that reach this agent ("*": any)

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
```

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

from parley.agent.templates import is_plain_name, placeholders
from parley.agent.variables import SERVICE_NAMES
from parley.config import SettingsError

DEFAULT_HOLD_AFTER_MS = 700
# What a person says to someone who cuts in with "wait" or "hold on": the floor is theirs. Qwen2.5-0.5B,
# given "Wait." after a reply it was cut in, answered "I'm sorry, but I can't assist with that." (2 of 2,
# "Hold on." and "Uh, wait." alike), and those refusals then led it to refuse the next requests.
DEFAULT_YIELD_PHRASE = "Sure, go ahead."
DEFAULT_TOOL_TIMEOUT_MS = 5000
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
    "yield_phrase",
    "sip_headers",
    "caller_variables",
    "tools",
    "builtins",
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

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

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
        )

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
    )
