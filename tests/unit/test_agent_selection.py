"""Which agent a call reaches: by name in the offer, by SIP request-URI user, by carrier parameter."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from parley.app import create_app
from parley.config import Settings
from parley.runtime import Runtime
from tests.doubles import make_engines


def agent_files(tmp_path: Path) -> tuple[str, ...]:
    (tmp_path / "orders.toml").write_text('system_prompt = "Orders."\nsip_users = ["+15551234567", "500"]\n')
    (tmp_path / "sales.toml").write_text('system_prompt = "Sales."\n')
    (tmp_path / "front.toml").write_text('system_prompt = "Front desk."\nsip_users = ["*"]\n')
    return (str(tmp_path / "orders.toml"), f"sales={tmp_path / 'sales.toml'}")


def test_sip_users_reach_their_agent_and_unknown_ones_none(tmp_path: Path) -> None:
    runtime = Runtime(Settings(sip="off", agent=agent_files(tmp_path)), make_engines())
    assert runtime.agent_for_sip_user("+15551234567").name == "orders"  # type: ignore[union-attr]
    assert runtime.agent_for_sip_user("sales").name == "sales"  # type: ignore[union-attr]
    assert runtime.agent_for_sip_user("+19998887777") is None
    catch_all = Runtime(Settings(sip="off", agent=(*agent_files(tmp_path), str(tmp_path / "front.toml"))))
    assert catch_all.agent_for_sip_user("+19998887777").name == "front"  # type: ignore[union-attr]
    plain = Runtime(Settings(sip="off"))
    assert plain.agent_for_sip_user("anyone").name == "default"  # type: ignore[union-attr]


async def test_an_offer_naming_an_unknown_agent_or_bad_context_is_refused(tmp_path: Path) -> None:
    app = create_app(Settings(sip="off", agent=agent_files(tmp_path)), engines=make_engines())
    client: TestClient = TestClient(TestServer(app))  # type: ignore[type-arg]
    await client.start_server()
    try:
        offer = {"sdp": "v=0\r\n", "type": "offer"}
        unknown = await client.post("/offer", json={**offer, "agent": "nobody"})
        assert unknown.status == 404 and "no agent named" in (await unknown.json())["error"]
        hostile = await client.post("/offer", json={**offer, "context": {"x": {"nested": 1}}})
        assert hostile.status == 400 and "context" in (await hostile.json())["error"]
        not_a_name = await client.post("/offer", json={**offer, "agent": 5})
        assert not_a_name.status == 400
    finally:
        await client.close()


def test_auto_runs_the_larger_model_only_for_agents_offered_tools(tmp_path: Path) -> None:
    # The small model answers words soonest but cannot be relied on to call tools (issue 47's bench tools,
    # parley test's order desk): an agent with tools, its own or a built-in, gets the larger one.
    words_only = Runtime(Settings(sip="off", agent=agent_files(tmp_path)), make_engines())
    assert words_only.settings.llm_model == "qwen2.5-0.5b"
    (tmp_path / "desk.toml").write_text('system_prompt = "Desk."\n[builtins]\nend_call = true\n')
    with_tools = Runtime(Settings(sip="off", agent=(str(tmp_path / "desk.toml"),)), make_engines())
    assert with_tools.settings.llm_model == "qwen2.5-coder-1.5b"
    chosen = Settings(sip="off", agent=(str(tmp_path / "desk.toml"),), llm_model="qwen2.5-0.5b")
    assert Runtime(chosen, make_engines()).settings.llm_model == "qwen2.5-0.5b"  # named: kept
