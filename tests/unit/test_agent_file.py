"""Agent files: what a team writes, and the errors it gets when something is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.agent.agentfile import AgentFileError, load_agent_file, load_agents
from parley.agent.templates import ContextError, checked_context, render

ORDER_DESK = """
system_prompt = "You are the order desk of {business}. The caller is {caller}."
greeting = "Hello, {business} orders."
hold_phrase = "One moment please."
hold_after_ms = 500

[[tools]]
name = "lookup_order"
description = "Look up an order by its number"
python = "tests.agent_tools:lookup_order"
side_effects = false
parameters = { type = "object", required = ["number"], properties = { number = { type = "string" } } }

[[tools]]
name = "cancel_order"
description = "Cancel an order"
url = "https://backend.example.com/tools/cancel"
parameters = { type = "object", properties = { number = { type = "string" } }, required = ["number"] }

[builtins]
end_call = true
transfer = ["sip:desk@pbx.example.com", "+15551234567"]
"""


def write(tmp_path: Path, text: str, name: str = "orders.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_order_desk_agent_file_loads_with_its_tools_and_builtins(tmp_path: Path) -> None:
    agent = load_agent_file(write(tmp_path, ORDER_DESK))
    assert agent.name == "orders" and agent.hold_after_ms == 500
    lookup, cancel = agent.tools
    assert lookup.function is not None and lookup.side_effects is False
    assert cancel.url.startswith("https://") and cancel.side_effects is True and cancel.timeout_ms == 5000
    assert agent.builtins.end_call and agent.builtins.transfer == ("sip:desk@pbx.example.com", "+15551234567")
    assert lookup.as_openai()["function"]["name"] == "lookup_order"


def test_an_agent_yields_the_floor_with_its_own_phrase_or_not_at_all(tmp_path: Path) -> None:
    assert load_agent_file(write(tmp_path, ORDER_DESK)).yield_phrase == "Sure, go ahead."
    own = load_agent_file(write(tmp_path, 'yield_phrase = "Of course, {caller}."\n' + ORDER_DESK, "own.toml"))
    assert own.yield_phrase == "Of course, {caller}."
    off = load_agent_file(write(tmp_path, 'system_prompt = "x"\nyield_phrase = ""\n', "off.toml"))
    assert off.yield_phrase == ""
    assert next(iter(load_agents((), "Be brief.", "Hi.").values())).yield_phrase == "Sure, go ahead."


def test_several_agents_by_name_the_first_is_the_default(tmp_path: Path) -> None:
    first = write(tmp_path, ORDER_DESK)
    second = write(tmp_path, 'system_prompt = "You book tables."\n', "tables.toml")
    agents = load_agents((str(first), f"booking={second}"), "ignored", "ignored")
    assert list(agents) == ["orders", "booking"]
    assert next(iter(load_agents((), "Be brief.", "Hi."))) == "default"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('system_prompt = "x"\ncolour = "blue"\n', 2, "unknown key 'colour'"),
        ('greeting = "hi"\n', 1, "system_prompt is required"),
        (
            'system_prompt = "x"\n[[tools]]\nname = "a"\ndescription = "d"\n',
            2,
            "exactly one of url or python",
        ),
        (
            'system_prompt = "x"\n\n[[tools]]\nname = "a"\ndescription = "d"\npython = "nowhere.at_all:f"\n',
            3,
            "not an importable",
        ),
        (
            'system_prompt = "x"\n[[tools]]\nname = "a"\ndescription = "d"\nurl = "http://h/x"\n'
            'parameters = { type = "object", properties = { n = { type = "strange" } } }\n',
            2,
            "not a valid JSON Schema",
        ),
        ('system_prompt = "x"\n[builtins]\ntransfer = ["not a number"]\n', 3, "destinations"),
        ('system_prompt = "x"\n[builtins]\nhangup = true\n', 3, "unknown built-in"),
        ('system_prompt = "x"\nhold_after_ms = "soon"\n', 2, "hold_after_ms"),
        ('system_prompt = "x\n', 1, "line 1"),
    ],
)
def test_a_bad_agent_file_fails_with_the_line_named(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(AgentFileError) as failure:
        load_agent_file(path)
    message = str(failure.value)
    assert str(path) in message and words in message
    assert f"line {line}" in message


def test_templates_insert_values_as_text_once() -> None:
    variables = {"caller": "{business}", "business": "Acme"}
    assert render("Hi {caller}, this is {business}.", variables) == "Hi {business}, this is Acme."
    assert render("{missing}|{a.b}|{a[0]}|{{literal}}", variables) == "|{a.b}|{a[0]}|{literal}"


def test_hostile_context_values_are_refused_or_kept_inert() -> None:
    assert checked_context({"name": "{0.__class__}"}) == {"name": "{0.__class__}"}
    assert render("Hello {name}", {"name": "{0.__class__}"}) == "Hello {0.__class__}"
    for bad in (
        {"x" * 65: "v"},
        {"ok": 5},
        {f"k{i}": "v" for i in range(33)},
        {"big": "é" * 600},
        ["not", "an", "object"],
        {"bad key": "v"},
    ):
        with pytest.raises(ContextError):
            checked_context(bad)


def test_the_readme_order_desk_is_a_valid_agent_file(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("A complete order desk", 1)[1]
    block = section.split("```toml", 1)[1].split("```", 1)[0]
    agent = load_agent_file(write(tmp_path, block))
    assert [t.name for t in agent.tools] == ["lookup_order", "cancel_order"]
    assert agent.builtins.end_call and agent.builtins.send_dtmf and len(agent.builtins.transfer) == 2
    assert agent.sip_users == ("+15551234567", "500") and agent.sip_headers == ("X-Customer-Id",)
