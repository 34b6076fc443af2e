"""Reading a scenario file: TOML checked against the JSON Schema in scenario.schema.json, then against
what the schema cannot say (a file that exists, a regex that compiles, a turn that can be played).
`load(path)` returns a `Scenario` or raises ScenarioError naming the file and the key.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import date, time
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import soundfile

from parley.scenarios.scenario import (
    CallExpectation,
    Judge,
    Line,
    LlmCaller,
    Scenario,
    ScenarioError,
    Stall,
    ToolExpectation,
    ToolMock,
    Turn,
    TurnExpectation,
    Voice,
    When,
    spoken_parts,
)

SCHEMA_FILE = "scenario.schema.json"  # beside this module, in the package
_ACTIONS = ("say", "wav", "press", "silence_s", "hangup")
_NOISES = ("street", "babble", "music")
_PACKAGED_PIPER = "joe"
_CODECS = {"webrtc": ("opus",), "sip": ("PCMU", "PCMA"), "carrier": ("mulaw",)}
_WAV_FORMATS = ("WAV", "WAVEX")  # soundfile's names for RIFF WAV, plain and extensible
# The text of `say` as the caller's voice reads it (voices.py): any bracketed stretch is a marker, and
# the only marker is a pause ("[pause 900ms]", "[pause 1.2s]"); a stray bracket is a mistake.
# during_reply without after_s: one second into the reply, when the agent is well into its first words.
DURING_REPLY_AFTER_S = 1.0
_TOML_AT = re.compile(r"(?P<what>.*) \(at line (?P<line>[0-9]+), column (?P<column>[0-9]+)\)", re.DOTALL)
_TOML_AT_END = " (at end of document)"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TYPE_WORDS = {
    "object": "a table",
    "array": "an array",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
}


def load(path: str | Path) -> Scenario:
    """Read and check one scenario file: TOML, then the schema, then what the schema cannot say (files
    that must exist, which keys go together). Paths in it are resolved against its folder."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{file}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"{file}: cannot be read: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{file}: {_toml_problem(str(exc))}") from None
    reader = _Reader(file)
    reader.check_values(data, ())
    reader.check_schema(data)
    return reader.scenario(data)


def _toml_problem(message: str) -> str:
    """tomllib's message with its position first, as the other errors give their key first."""
    at = _TOML_AT.fullmatch(message)
    if at:
        return f"line {at['line']}: {at['what']} (column {at['column']})"
    if message.endswith(_TOML_AT_END):
        return f"at the end of the file: {message.removesuffix(_TOML_AT_END)}"
    return message


@cache
def _validator() -> Any:
    schema = json.loads(resources.files("parley.scenarios").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))
    _EcmaValidator.check_schema(schema)
    return _EcmaValidator(schema)


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
    # A schema's patterns are ECMA-262 regular expressions, in which `$` is the end of the string.
    # Python's `$` also matches before a final newline, which would let "12#\n" pass as keypad keys.
    if not validator.is_type(instance, "string"):
        return
    python = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
    if not re.search(python, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_EcmaValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})

Where = tuple[str | int, ...]


def _where(path: Iterable[str | int]) -> str:
    """A key's path as a message gives it: `turns[2].expect.says[1]`, arrays counted from 1."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part + 1}]"
        else:
            key = part if _BARE_KEY.fullmatch(part) else json.dumps(part)
            out += f".{key}" if out else key
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _given(table: Mapping[str, Any], **convert: Callable[[Any], Any]) -> dict[str, Any]:
    """The keys of `table` that are there, converted: a dataclass's own default stands for the rest.
    (JSON Schema counts 2.0 as an integer, so integers are made ints here.)"""
    return {key: make(table[key]) for key, make in convert.items() if key in table}


class _Reader:
    """Checks one scenario file's values and builds its dataclasses, naming the key of whatever is
    wrong."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.folder = file.parent

    def fail(self, where: Where | str, what: str) -> ScenarioError:
        key = where if isinstance(where, str) else _where(where)
        return ScenarioError(f"{self.file}: {key}: {what}" if key else f"{self.file}: {what}")

    def path(self, value: str) -> Path:
        return (self.folder / Path(value).expanduser()).resolve()

    # -- what the schema cannot see ---------------------------------------------------------------------

    def check_values(self, value: Any, where: Where) -> None:
        """TOML has values JSON has not (dates and times, nan and inf): no key takes them, and a tool's
        result or arguments must be JSON."""
        if isinstance(value, dict):
            for key, item in value.items():
                self.check_values(item, (*where, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self.check_values(item, (*where, index))
        elif isinstance(value, date | time):
            raise self.fail(where, f"{value} is a TOML date or time, which no key takes (quote it for text)")
        elif isinstance(value, float) and not math.isfinite(value):
            raise self.fail(where, f"{value} is not a number a scenario can use")

    def check_schema(self, data: dict[str, Any]) -> None:
        errors = list(_validator().iter_errors(data))
        if not errors:
            return
        # The first problem in the file's order.
        first = min(errors, key=lambda e: (_order(data, e), e.validator != "additionalProperties"))
        raise self.fail(tuple(first.absolute_path), _schema_problem(first))

    # -- the dataclasses ------------------------------------------------------------------------------------

    def scenario(self, data: dict[str, Any]) -> Scenario:
        # Built in the order a file is usually written, so that its first problem is the one reported.
        caller = _given(data.get("caller", {}), voice=lambda v: self.voice(v, "caller.voice"), context=dict)
        line = self.line(data.get("line", {}), data.get("transport", ""))
        greeting = data.get("greeting", True)
        turns = tuple(self.turn(raw, number, greeting) for number, raw in enumerate(data.get("turns", []), 1))
        llm_caller = self.llm_caller(data["llm_caller"]) if "llm_caller" in data else None
        self.check_sequence(turns, llm_caller, data.get("transport", ""))
        return Scenario(
            path=self.file,
            name=data["name"],
            **_given(
                data, description=str, agent=str, transport=str, seed=int, greeting=bool, max_call_s=float
            ),
            **caller,
            line=line,
            turns=turns,
            llm_caller=llm_caller,
            tools={name: self.tool_mock(raw, name) for name, raw in data.get("tools", {}).items()},
            expect=self.call_expectation(data.get("expect", {})),
        )

    def check_sequence(self, turns: tuple[Turn, ...], llm_caller: LlmCaller | None, transport: str) -> None:
        """What the turns make together: a call the caller can play to its end."""
        if not turns and llm_caller is None:
            raise self.fail("", "no [[turns]] and no [llm_caller]: the caller would do nothing")
        hangup = next((number for number, turn in enumerate(turns, 1) if turn.hangup), None)
        if hangup is not None and hangup < len(turns):
            raise self.fail(f"turns[{hangup + 1}]", f"comes after the caller hung up in turns[{hangup}]")
        if hangup is not None and llm_caller is not None:
            raise self.fail("llm_caller", f"never plays: the caller hangs up in turns[{hangup}]")
        pressed = next((number for number, turn in enumerate(turns, 1) if turn.press), None)
        if pressed is not None and transport == "webrtc":
            # The service takes keypad presses from a SIP line or a carrier stream; a page has no keypad.
            raise self.fail(
                f"turns[{pressed}].press", "a WebRTC caller has no keypad: press needs sip or carrier"
            )

    def voice(self, value: str, where: str) -> Voice:
        engine, _, name = value.partition(":")
        if engine == "espeak":
            return Voice("espeak", name)
        if name == _PACKAGED_PIPER:
            return Voice("piper", name)
        if not name.endswith(".onnx"):
            raise self.fail(
                where, f"no Piper voice {name!r}: give joe (the packaged voice) or a Piper .onnx file"
            )
        model = self.path(name)
        if not model.is_file():
            raise self.fail(where, f"no such Piper voice file: {model}")
        config = model.with_name(model.name + ".json")
        if not config.is_file():
            raise self.fail(where, f"the Piper voice's config is not beside it: {config}")
        return Voice("piper", str(model))

    def wav(self, value: str, where: str) -> str:
        """The absolute path of a WAV file (any rate; channels are mixed down where it is played)."""
        file = self.path(value)
        if not file.is_file():
            raise self.fail(where, f"no such file: {file}")
        try:
            info = soundfile.info(str(file))
        except RuntimeError:
            raise self.fail(where, f"{file} is not a sound file") from None
        if info.format not in _WAV_FORMATS:
            raise self.fail(where, f"{file} is not a WAV file (it is {info.format})")
        if info.frames == 0:
            raise self.fail(where, f"{file} holds no audio")
        return str(file)

    def line(self, raw: dict[str, Any], transport: str) -> Line:
        codec = raw.get("codec", "")
        if codec and transport and codec not in _CODECS[transport]:
            raise self.fail(
                "line.codec", f"{codec} is not a codec of {transport} ({', '.join(_CODECS[transport])})"
            )
        noise = raw.get("noise", "")
        if noise and noise not in _NOISES:
            if not self.path(noise).is_file():
                raise self.fail(
                    "line.noise", f"not street, babble or music, and no such file: {self.path(noise)}"
                )
            noise = self.wav(noise, "line.noise")
        if "snr_db" in raw and not noise:
            raise self.fail(
                "line.snr_db", "given without noise: there is nothing to mix the caller's speech with"
            )
        stalls = tuple(Stall(at_s=float(s["at_s"]), ms=int(s["ms"])) for s in raw.get("stalls", []))
        return Line(
            **_given(raw, codec=str, loss=float, jitter_ms=int, snr_db=float), stalls=stalls, noise=noise
        )

    def turn(self, raw: dict[str, Any], number: int, greeting: bool) -> Turn:
        where = f"turns[{number}]"
        actions = [key for key in _ACTIONS if key in raw and (key != "hangup" or raw[key])]
        if len(actions) != 1:
            gives = f" (it gives {', '.join(actions)})" if actions else ""
            raise self.fail(where, f"give exactly one of {', '.join(_ACTIONS)}{gives}")
        action = actions[0]
        backchannel = bool(raw.get("backchannel", False))
        when, after_s = self.timing(
            raw, where, action, backchannel, first_without_greeting=number == 1 and not greeting
        )
        if "voice" in raw and action != "say":
            raise self.fail(
                f"{where}.voice", f"a {action} turn is not spoken: only a turn with say has a voice"
            )
        if action == "say":
            self.check_pauses(raw["say"], f"{where}.say")
        return Turn(
            **_given(raw, say=str, press=str, silence_s=float, hangup=bool, backchannel=bool),
            wav=self.wav(raw["wav"], f"{where}.wav") if action == "wav" else "",
            voice=self.voice(raw["voice"], f"{where}.voice") if "voice" in raw else None,
            when=when,
            after_s=after_s,
            expect=self.turn_expectation(raw.get("expect"), f"{where}.expect", action, backchannel),
        )

    def timing(
        self, raw: dict[str, Any], where: str, action: str, backchannel: bool, first_without_greeting: bool
    ) -> tuple[When, float]:
        """A turn's `when` and `after_s`, with their defaults: a backchannel goes during the reply."""
        if backchannel:
            if action not in ("say", "wav"):
                raise self.fail(
                    f"{where}.backchannel", "a backchannel is heard over the reply: give say or wav"
                )
            if raw.get("when", "during_reply") != "during_reply":
                raise self.fail(f"{where}.when", f"a backchannel is said during the reply, not {raw['when']}")
        when: When = raw.get("when") or ("during_reply" if backchannel else "after_reply")
        if when == "during_reply" and first_without_greeting:
            raise self.fail(
                f"{where}.when", "during_reply on the first turn with greeting = false: no reply to talk over"
            )
        if when == "during_reply" and action == "silence_s":
            raise self.fail(
                f"{where}.when",
                "silence_s during the reply: the caller is quiet while the agent talks anyway",
            )
        if "after_s" not in raw:
            return when, DURING_REPLY_AFTER_S if when == "during_reply" else 0.0
        if when == "at_once":
            raise self.fail(
                f"{where}.after_s", "at_once takes no after_s: the turn starts right after the one before"
            )
        return when, float(raw["after_s"])

    def check_pauses(self, say: str, where: str) -> None:
        try:
            parts = spoken_parts(say)
        except ScenarioError as exc:
            raise self.fail(where, str(exc)) from None
        if not any(isinstance(part, str) and re.search(r"\w", part) for part in parts):
            raise self.fail(where, "no words to speak besides pauses (for a quiet caller give silence_s)")

    def turn_expectation(
        self, raw: dict[str, Any] | None, where: str, action: str, backchannel: bool
    ) -> TurnExpectation:
        if raw is None:
            return TurnExpectation()
        if action == "hangup":
            raise self.fail(where, "the caller hangs up: there is no reply to expect anything of")
        words = [key for key in ("says", "says_any", "says_regex") if key in raw]
        if words and backchannel:
            raise self.fail(
                where, f"a backchannel gets no reply of its own to check {', '.join(words)} against"
            )
        if words and raw.get("replies") is False:
            raise self.fail(where, f"replies = false, and {', '.join(words)} expects words from the reply")
        for key in ("says", "says_any", "never_says", "hears"):
            for index, phrase in enumerate(raw.get(key, []), 1):
                if not re.search(r"\w", phrase):
                    # Phrases are compared as words, punctuation dropped: this one would never be found.
                    raise self.fail(f"{where}.{key}[{index}]", f"{phrase!r} has no words to look for")
        if "says_regex" in raw:
            try:
                re.compile(raw["says_regex"], re.IGNORECASE)
            except re.error as exc:
                raise self.fail(f"{where}.says_regex", f"not a valid regular expression: {exc}") from None
        return TurnExpectation(
            **_given(
                raw, says=tuple, says_any=tuple, says_regex=str, never_says=tuple, hears=tuple, replies=bool
            )
        )

    def tool_mock(self, raw: dict[str, Any], name: str) -> ToolMock:
        if "result" in raw and "error" in raw:
            raise self.fail(("tools", name), "give result or error, not both")
        return ToolMock(**_given(raw, result=lambda r: r, error=str, delay_ms=int))

    def llm_caller(self, raw: dict[str, Any]) -> LlmCaller:
        return LlmCaller(
            persona=raw["persona"],
            goal=raw["goal"],
            **_given(raw, max_turns=int, voice=lambda v: self.voice(v, "llm_caller.voice")),
        )

    def call_expectation(self, raw: dict[str, Any]) -> CallExpectation:
        outcome = raw.get("outcome", "")
        if "transferred_to" in raw and outcome not in ("", "transferred"):
            raise self.fail(
                "expect.transferred_to",
                f"given with outcome = {outcome!r}: a transfer's outcome is transferred",
            )
        tools = tuple(
            ToolExpectation(name=t["name"], **_given(t, arguments=dict, times=int))
            for t in raw.get("tools", [])
        )
        judge = Judge(rubric=raw["judge"]["rubric"]) if "judge" in raw else None
        return CallExpectation(
            **_given(
                raw,
                outcome=str,
                transferred_to=str,
                max_talk_over_ms=int,
                response_p50_ms=int,
                response_p95_ms=int,
            ),
            tools=tools,
            judge=judge,
        )


def _order(data: Any, error: Any) -> tuple[int, ...]:
    """Where an error's key is in the file: the position of each key of its path among its siblings
    (tomllib keeps a table's keys in the order they were written)."""
    path = list(error.absolute_path)
    # A key that is wrong itself: the error's path stops at its table.
    if "propertyNames" in error.schema_path:
        path.append(error.instance)
    elif error.validator == "additionalProperties":
        path.append(_unknown_key(error))
    place: list[int] = []
    for part in path:
        if isinstance(data, dict):
            place.append(list(data).index(part))
        else:
            place.append(part)
        data = data[part]
    if error.validator == "required":
        place.append(len(data))  # a missing key: after what its table has (a misspelling of it, say)
    return tuple(place)


def _unknown_key(error: Any) -> str:
    """The first key of a table that its schema does not know (additionalProperties false)."""
    known = error.schema.get("properties", {})
    return next(str(key) for key in error.instance if key not in known)


def _schema_problem(error: Any) -> str:
    """What a schema error says, in the terms of a TOML file."""
    kind, value, schema, instance = error.validator, error.validator_value, error.schema, error.instance
    if kind == "additionalProperties":
        known = sorted(schema.get("properties", {}))
        key = _unknown_key(error)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(known)
        return f"unknown key {key!r} ({hint})"
    if kind == "required":
        missing = next(k for k in value if k not in instance)
        return f"{missing!r} is required"
    if kind == "type" and isinstance(value, str):
        return f"{_shown(instance)} is not {_TYPE_WORDS.get(value, value)}"
    if kind == "enum":
        return f"{_shown(instance)} is not one of {', '.join(map(str, value))}"
    if kind == "pattern" and value == "\\S":
        return "must not be blank"
    if kind == "pattern" and "description" in schema:
        # A pattern's description names what the value should be ("a tool name: letters, ...").
        return f"{_shown(instance)} is not {schema['description']}"
    if kind == "maxProperties":
        return f"more than {value} keys"
    return str(error.message)


def discover(paths: list[str | Path]) -> list[Path]:
    """The scenario files named: files as given, folders' *.toml sorted by name."""
    found: list[Path] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            found += sorted(q for q in p.glob("*.toml") if q.is_file())
        elif p.is_file():
            found.append(p)
        else:
            raise ScenarioError(f"{p}: no such file or folder")
    return found
