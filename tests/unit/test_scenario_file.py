"""Scenario files: what a team writes for `parley test`, and the errors it gets when something is wrong."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
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
)
from parley.scenarios.scenario_file import discover, load

ORDER_DESK = """
name = "where is my order"
description = "The caller asks where order 4712 is, pausing mid-number."
agent = "orders"
transport = "sip"
seed = 7
greeting = true
max_call_s = 90

[caller]
voice = "espeak:en-us"
context = { caller_name = "Dana" }

[line]
codec = "PCMA"
loss = 0.02
jitter_ms = 40
stalls = [{ at_s = 6, ms = 400 }]
noise = "sounds/cafe.wav"
snr_db = 12

[[turns]]
say = "Hi, where is my order? It's four seven [pause 900ms] one two."
voice = "piper:voices/amy.onnx"

[turns.expect]
hears = ["where is my order"]
says = ["shipped"]
says_any = ["Thursday", "Friday"]
says_regex = "\\\\bUPS\\\\b"
never_says = ["cancelled"]

[[turns]]
wav = "sounds/mhm.wav"
backchannel = true
after_s = 1.5

[[turns]]
press = "1#"
when = "at_once"

[[turns]]
silence_s = 4

[turns.expect]
replies = false

[[turns]]
say = "No, wait, one more thing."
when = "during_reply"

[tools.lookup_order]
result = { number = "4712", status = "shipped", carrier = "UPS" }
delay_ms = 300

[tools.cancel_order]
error = "the backend is down"

[llm_caller]
persona = "Dana, in a hurry"
goal = "learn when the order arrives"
max_turns = 4
voice = "piper:joe"

[expect]
outcome = "transferred"
transferred_to = "sip:desk@pbx.example.com"
max_talk_over_ms = 800
response_p50_ms = 900
response_p95_ms = 2500

[[expect.tools]]
name = "lookup_order"
arguments = { number = "4712" }

[[expect.tools]]
name = "cancel_order"
times = 0

[expect.judge]
rubric = "The agent gives the order's status without asking for the number again."
"""

ONE_TURN = 'name = "hello"\n\n[[turns]]\nsay = "Hello?"\n'


def write(folder: Path, text: str, name: str = "orders.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def sound(path: Path, seconds: float = 0.2, channels: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), np.zeros((int(16000 * seconds), channels), dtype=np.int16), 16000)
    return path


@pytest.fixture
def desk(tmp_path: Path) -> Path:
    """The order desk's folder: the scenario file and the files it names beside it."""
    sound(tmp_path / "sounds" / "mhm.wav")
    sound(tmp_path / "sounds" / "cafe.wav", channels=2)
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "amy.onnx").write_bytes(b"model")
    (tmp_path / "voices" / "amy.onnx.json").write_text("{}")
    return write(tmp_path, ORDER_DESK)


def problem(folder: Path, text: str, name: str = "orders.toml") -> str:
    path = write(folder, text, name)
    with pytest.raises(ScenarioError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    return message.removeprefix(f"{path}: ")


def test_an_order_desk_scenario_loads_into_its_dataclasses(desk: Path) -> None:
    scenario = load(desk)
    folder = desk.parent.resolve()
    assert scenario == Scenario(
        path=desk,
        name="where is my order",
        description="The caller asks where order 4712 is, pausing mid-number.",
        agent="orders",
        transport="sip",
        seed=7,
        voice=Voice("espeak", "en-us"),
        context={"caller_name": "Dana"},
        greeting=True,
        line=Line(
            codec="PCMA",
            loss=0.02,
            jitter_ms=40,
            stalls=(Stall(at_s=6.0, ms=400),),
            noise=str(folder / "sounds" / "cafe.wav"),
            snr_db=12.0,
        ),
        turns=(
            Turn(
                say="Hi, where is my order? It's four seven [pause 900ms] one two.",
                voice=Voice("piper", str(folder / "voices" / "amy.onnx")),
                expect=TurnExpectation(
                    says=("shipped",),
                    says_any=("Thursday", "Friday"),
                    says_regex=r"\bUPS\b",
                    never_says=("cancelled",),
                    hears=("where is my order",),
                ),
            ),
            Turn(wav=str(folder / "sounds" / "mhm.wav"), backchannel=True, when="during_reply", after_s=1.5),
            Turn(press="1#", when="at_once"),
            Turn(silence_s=4.0, expect=TurnExpectation(replies=False)),
            Turn(say="No, wait, one more thing.", when="during_reply", after_s=1.0),
        ),
        llm_caller=LlmCaller(
            persona="Dana, in a hurry",
            goal="learn when the order arrives",
            max_turns=4,
            voice=Voice("piper", "joe"),
        ),
        tools={
            "lookup_order": ToolMock(
                result={"number": "4712", "status": "shipped", "carrier": "UPS"}, delay_ms=300
            ),
            "cancel_order": ToolMock(error="the backend is down"),
        },
        expect=CallExpectation(
            outcome="transferred",
            transferred_to="sip:desk@pbx.example.com",
            tools=(
                ToolExpectation("lookup_order", {"number": "4712"}),
                ToolExpectation("cancel_order", times=0),
            ),
            max_talk_over_ms=800,
            response_p50_ms=900,
            response_p95_ms=2500,
            judge=Judge("The agent gives the order's status without asking for the number again."),
        ),
        max_call_s=90.0,
    )
    # Whole numbers where the model has ints, even where TOML gave a float for a float field.
    assert isinstance(scenario.seed, int) and isinstance(scenario.line.stalls[0].at_s, float)


def test_what_a_file_leaves_out_takes_the_defaults(tmp_path: Path) -> None:
    second = '[[turns]]\nsay = "Mhm."\nbackchannel = true\n'
    text = ONE_TURN + second + '[[turns]]\nsay = "Sorry?"\nwhen = "during_reply"\n'
    scenario = load(write(tmp_path, text))
    assert scenario.voice == Voice("piper", "joe") and scenario.greeting and scenario.max_call_s == 120.0
    assert scenario.line == Line() and scenario.tools == {} and scenario.expect == CallExpectation()
    first, backchannel, barge_in = scenario.turns
    assert (first.when, first.after_s, first.expect) == ("after_reply", 0.0, TurnExpectation())
    assert (backchannel.when, backchannel.after_s) == ("during_reply", 1.0)
    assert (barge_in.when, barge_in.after_s) == ("during_reply", 1.0)


def test_an_llm_caller_alone_is_a_scenario(tmp_path: Path) -> None:
    text = 'name = "open"\n[llm_caller]\npersona = "a retired teacher"\ngoal = "cancel order 4712"\n'
    scenario = load(write(tmp_path, text))
    assert scenario.turns == () and scenario.llm_caller == LlmCaller("a retired teacher", "cancel order 4712")


def test_a_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    message = problem(tmp_path, 'name = "x"\n\nsay "hello"\n', "x.toml")
    assert message.startswith("line 3: Expected '='"), message


@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("top level", 'naem = "x"\n' + ONE_TURN, "unknown key 'naem' (did you mean 'name'?)"),
        ("a turn", ONE_TURN + "sya = 'hi'\n", "turns[1]: unknown key 'sya' (did you mean 'say'?)"),
        (
            "a table",
            ONE_TURN.replace("[[turns]]", "[caller]\nvocie = 'piper:joe'\n\n[[turns]]"),
            "caller: unknown key 'vocie'",
        ),
        ("a turn's expect", ONE_TURN + "[turns.expect]\nsay = ['x']\n", "turns[1].expect: unknown key 'say'"),
        (
            "the judge",
            ONE_TURN + "[expect.judge]\nrubrik = 'x'\n",
            "expect.judge: unknown key 'rubrik' (did you mean 'rubric'?)",
        ),
        ("a stall", ONE_TURN + "[line]\nstalls = [{ at = 1, ms = 5 }]\n", "line.stalls[1]: unknown key 'at'"),
    ],
)
def test_a_misspelt_key_is_refused_by_name(tmp_path: Path, key: str, text: str, expected: str) -> None:
    assert problem(tmp_path, text).startswith(expected), key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[turns]]\nsay = "hi"\n', "'name' is required"),
        ('name = "  "\n[[turns]]\nsay = "hi"\n', "name: must not be blank"),
        ('name = "x"\n', "no [[turns]] and no [llm_caller]: the caller would do nothing"),
        (
            ONE_TURN + '[[turns]]\nsay = "a"\npress = "1"\n',
            "turns[2]: give exactly one of say, wav, press, silence_s, hangup (it gives say, press)",
        ),
        (
            ONE_TURN + "[[turns]]\nhangup = false\n",
            "turns[2]: give exactly one of say, wav, press, silence_s, hangup",
        ),
        (
            ONE_TURN + '[turns.expect]\nsays_regex = "(order"\n',
            "turns[1].expect.says_regex: not a valid regular expression: missing )",
        ),
        (ONE_TURN + '[[turns]]\nwav = "missing.wav"\n', "turns[2].wav: no such file: "),
        (
            ONE_TURN + '[line]\nnoise = "traffic"\n',
            "line.noise: not street, babble or music, and no such file: ",
        ),
        (
            "greeting = false\n" + ONE_TURN + 'when = "during_reply"\n',
            "turns[1].when: during_reply on the first turn with greeting = false",
        ),
        (
            ONE_TURN + '[[turns]]\nsay = "mhm"\nbackchannel = true\nwhen = "after_reply"\n',
            "turns[2].when: a backchannel is said during the reply, not after_reply",
        ),
        (
            ONE_TURN + '[[turns]]\npress = "1"\nbackchannel = true\n',
            "turns[2].backchannel: a backchannel is heard over the reply: give say or wav",
        ),
        (
            ONE_TURN + '[[turns]]\nsay = "hi"\nwhen = "at_once"\nafter_s = 2\n',
            "turns[2].after_s: at_once takes no after_s",
        ),
        (ONE_TURN + '[tools."look up"]\nresult = 1\n', "tools: 'look up' is not a tool name"),
        (
            ONE_TURN + '[[expect.tools]]\nname = "9lookup"\n',
            "expect.tools[1].name: '9lookup' is not a tool name",
        ),
        (
            ONE_TURN + '[tools.lookup]\nresult = 1\nerror = "down"\n',
            "tools.lookup: give result or error, not both",
        ),
        (ONE_TURN + "[line]\nloss = 0.7\n", "line.loss: 0.7 is greater than the maximum of 0.5"),
        (ONE_TURN + "[line]\nloss = nan\n", "line.loss: nan is not a number a scenario can use"),
        (ONE_TURN + "[line]\njitter_ms = 2.5\n", "line.jitter_ms: 2.5 is not a whole number"),
        (ONE_TURN + "[line]\nsnr_db = 10\n", "line.snr_db: given without noise"),
        (
            'transport = "sip"\n' + ONE_TURN + '[line]\ncodec = "opus"\n',
            "line.codec: opus is not a codec of sip (PCMU, PCMA)",
        ),
        ('transport = "sipp"\n' + ONE_TURN, "transport: 'sipp' is not one of webrtc, sip, carrier"),
        ("seed = 2024-05-01\n" + ONE_TURN, "seed: 2024-05-01 is a TOML date or time"),
        (
            ONE_TURN + '[caller]\nvoice = "pipr:joe"\n',
            "caller.voice: 'pipr:joe' is not a voice: \"piper:<name>\"",
        ),
        (ONE_TURN + '[caller]\nvoice = "piper:amy"\n', "caller.voice: no Piper voice 'amy'"),
        (ONE_TURN + '[caller]\nvoice = "piper:amy.onnx"\n', "caller.voice: no such Piper voice file: "),
        (
            ONE_TURN + '[caller]\ncontext = { "caller name" = "Dana" }\n',
            "caller.context: 'caller name' is not a variable name",
        ),
        (
            ONE_TURN.replace("Hello?", "one [pause 1 minute] two"),
            "turns[1].say: '[pause 1 minute]' is not a pause",
        ),
        (ONE_TURN.replace("Hello?", "[pause 2s]"), "turns[1].say: no words to speak besides pauses"),
        (ONE_TURN + '[[turns]]\npress = "12\\n"\n', "turns[2].press: '12\\n' is not a string of keypad keys"),
        (
            ONE_TURN + '[[turns]]\npress = "1"\nvoice = "piper:joe"\n',
            "turns[2].voice: a press turn is not spoken",
        ),
        (
            'transport = "webrtc"\n' + ONE_TURN + '[[turns]]\npress = "1"\n',
            "turns[2].press: a WebRTC caller has no keypad",
        ),
        (
            ONE_TURN + '[[turns]]\nhangup = true\n[[turns]]\nsay = "hi"\n',
            "turns[3]: comes after the caller hung up in turns[2]",
        ),
        (
            ONE_TURN + '[[turns]]\nhangup = true\n[turns.expect]\nsays = ["bye"]\n',
            "turns[2].expect: the caller hangs up",
        ),
        (
            ONE_TURN + '[turns.expect]\nreplies = false\nsays = ["x"]\n',
            "turns[1].expect: replies = false, and says expects words",
        ),
        (
            ONE_TURN + '[turns.expect]\nsays = ["order", "?!"]\n',
            "turns[1].expect.says[2]: '?!' has no words to look for",
        ),
        (
            ONE_TURN + '[expect]\noutcome = "idle"\ntransferred_to = "+15551234567"\n',
            "expect.transferred_to: given with outcome = 'idle'",
        ),
        (ONE_TURN + "[llm_caller]\npersona = 'p'\n", "llm_caller: 'goal' is required"),
    ],
)
def test_a_file_that_cannot_run_is_refused_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    message = problem(tmp_path, text)
    assert message.startswith(expected), message


def test_files_a_scenario_names_are_found_beside_it_and_must_be_wav(tmp_path: Path) -> None:
    (tmp_path / "suite").mkdir()
    sound(tmp_path / "suite" / "yes.wav")
    scenario = load(
        write(tmp_path / "suite", 'name = "x"\n[line]\nnoise = "babble"\n[[turns]]\nwav = "yes.wav"\n')
    )
    assert scenario.turns[0].wav == str((tmp_path / "suite" / "yes.wav").resolve())
    assert scenario.line.noise == "babble"
    (tmp_path / "suite" / "notes.wav").write_text("not audio")
    message = problem(tmp_path / "suite", 'name = "x"\n[[turns]]\nwav = "notes.wav"\n')
    assert message.startswith("turns[1].wav: ") and message.endswith("notes.wav is not a sound file")
    sound(tmp_path / "suite" / "empty.wav", seconds=0)
    message = problem(tmp_path / "suite", 'name = "x"\n[line]\nnoise = "empty.wav"\n[[turns]]\nsay = "hi"\n')
    assert message.startswith("line.noise: ") and message.endswith("empty.wav holds no audio")


def test_the_first_problem_in_the_file_is_the_one_reported(tmp_path: Path) -> None:
    text = 'name = "x"\n[line]\nloss = 2\n[[turns]]\nsay = 3\n'
    assert problem(tmp_path, text).startswith("line.loss: ")


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "latin1.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    assert problem_of(tmp_path / "latin1.toml").startswith("cannot be read: not UTF-8 text")
    assert problem_of(tmp_path / "absent.toml").startswith("cannot be read: ")


def problem_of(path: Path) -> str:
    with pytest.raises(ScenarioError) as caught:
        load(path)
    return str(caught.value).removeprefix(f"{path}: ")


def test_discover_takes_files_as_given_and_folders_toml_files_by_name(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("b.toml", "a.toml", "notes.md"):
        (suite / name).write_text(ONE_TURN)
    (suite / "nested").mkdir()
    extra = write(tmp_path, ONE_TURN, "extra.toml")
    assert discover([extra, suite]) == [extra, suite / "a.toml", suite / "b.toml"]
    with pytest.raises(ScenarioError, match="no such file or folder"):
        discover([tmp_path / "missing"])


SCHEMA = json.loads(
    resources.files("parley.scenarios").joinpath("scenario.schema.json").read_text(encoding="utf-8")
)


def _properties(*path: str) -> set[str]:
    node: Any = SCHEMA
    for key in path:
        node = node[key]
        while "$ref" in node:
            node = SCHEMA["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return set(node["properties"])


def _fields(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_schema_ships_in_the_package_and_matches_the_model_field_for_field() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert set(SCHEMA["properties"]) == _fields(Scenario) - {"path", "voice", "context"} | {"caller"}
    assert _properties("properties", "caller") == {"voice", "context"}
    assert _properties("properties", "line") == _fields(Line)
    assert _properties("properties", "line", "properties", "stalls", "items") == _fields(Stall)
    assert _properties("properties", "turns", "items") == _fields(Turn)
    assert _properties("properties", "turns", "items", "properties", "expect") == _fields(TurnExpectation)
    assert _properties("properties", "tools", "additionalProperties") == _fields(ToolMock)
    assert _properties("properties", "llm_caller") == _fields(LlmCaller)
    assert _properties("properties", "expect") == _fields(CallExpectation)
    assert _properties("properties", "expect", "properties", "tools", "items") == _fields(ToolExpectation)
    assert _properties("properties", "expect", "properties", "judge") == _fields(Judge)


def test_the_documented_example_loads(tmp_path: Path) -> None:
    docs = Path(__file__).parents[2] / "docs" / "scenarios.md"
    example = docs.read_text(encoding="utf-8").split("```toml\n", 1)[1].split("```", 1)[0]
    scenario = load(write(tmp_path, example))
    assert scenario.tools["lookup_order"].result is not None
    assert scenario.expect.tools[0].arguments == {"number": "4712"}
    assert "[pause 900ms]" in scenario.turns[0].say
