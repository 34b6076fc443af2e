"""Who may call: the bearer token, call tokens a customer's backend mints for its page, TURN credentials
that expire, and secrets that come from the environment or a file and never reach a log line."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import io
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from parley.access import AccessDenied, CallTokens, turn_credentials
from parley.app import REGISTRY, create_app
from parley.bench.caller import Caller
from parley.cli import build_parser, main
from parley.config import Settings
from parley.log import CallContext, JsonFormatter
from parley.settings_sources import load_settings
from tests.doubles import make_engines
from tests.robustness.test_defects import eventually, offer_sdp

BEARER = "bearer-0123456789"
CALL_SECRET = "call-token-secret-abcdef"
TURN_SECRET = "coturn-static-secret-xyz"


def settings(**overrides: object) -> Settings:
    base: dict[str, object] = {
        "sip": "off",
        "greeting": "",
        "token": BEARER,
        "call_token_secret": CALL_SECRET,
        "turn_urls": ("turn:turn.example.com:3478?transport=udp", "turns:turn.example.com:5349"),
        "turn_secret": TURN_SECRET,
        "turn_ttl_s": 600.0,
        "ice_servers": ("stun:stun.example.com:3478",),
        "ice_addresses": ("127.0.0.1",),
    }
    return Settings(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    c: TestClient = TestClient(TestServer(create_app(settings(), make_engines())))  # type: ignore[type-arg]
    await c.start_server()
    yield c
    await c.close()


def auth(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def test_a_call_token_is_signed_short_lived_and_tamper_evident() -> None:
    tokens = CallTokens(CALL_SECRET)
    now = time.time()
    token = tokens.mint(60, now, agent="sales")
    grant = tokens.check(token, now + 30)
    assert grant.agent == "sales" and grant.by_call_token and abs(grant.expires_at - (now + 60)) <= 1
    with pytest.raises(AccessDenied, match="expired"):
        tokens.check(token, now + 61)
    assert tokens.check(token, now + 61, allow_expired=True).token_id == grant.token_id
    payload, _, signature = token.partition(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    longer = base64.urlsafe_b64encode(json.dumps({**claims, "exp": claims["exp"] + 3600}).encode())
    for forged in (
        f"{longer.decode().rstrip('=')}.{signature}",  # a changed expiry under the old signature
        f"{payload}.{signature[:-2]}AA",
        CallTokens("another-secret").mint(60, now),
        "not-a-token",
        "",
    ):
        with pytest.raises(AccessDenied):
            tokens.check(forged, now)
    with pytest.raises(ValueError):
        tokens.mint(7 * 86400, now)  # a week-long "call token" would be a password


async def test_the_page_calls_with_a_call_token_once_and_may_hang_that_call_up(client) -> None:  # type: ignore[no-untyped-def]
    base = str(client.make_url("")).rstrip("/")
    token = CallTokens(CALL_SECRET).mint(60)
    nobody = await client.post("/offer", json={"sdp": "v=0", "type": "offer"})
    assert nobody.status == 401 and nobody.headers["WWW-Authenticate"].startswith("Bearer")
    # A refused offer does not spend the token.
    bad = await client.post(
        "/offer", json={"sdp": "v=0\r\nm=video 9 RTP/AVP 96\r\n", "type": "offer"}, headers=auth(token)
    )
    assert bad.status == 400
    async with Caller(base, token=token) as caller:
        assert client.app[REGISTRY].get(caller.call_id) is not None
        again = await client.post(
            "/offer", json={"sdp": await offer_sdp(), "type": "offer"}, headers=auth(token)
        )
        assert again.status == 401 and "already" in (await again.json())["error"]
        assert (await client.get("/api/calls", headers=auth(token))).status == 401  # never the API
        other = CallTokens(CALL_SECRET).mint(60)
        assert (await client.delete(f"/whip/{caller.call_id}", headers=auth(other))).status == 401
        assert (await client.delete(f"/api/calls/{caller.call_id}", headers=auth(token))).status == 401
        call_id = caller.call_id
    # The caller's hang-up (DELETE /whip/<id> with its own token) ended the call.
    await eventually(lambda: not client.app[REGISTRY].active(), 10, "the call ended")
    assert client.app[REGISTRY].get(call_id).end_reason == "hangup"  # type: ignore[union-attr]


async def test_a_call_token_for_one_agent_cannot_ask_for_another(tmp_path: Path) -> None:
    for name in ("sales", "support"):
        (tmp_path / f"{name}.toml").write_text(f'system_prompt = "You are {name}."\ngreeting = ""\n')
    app = create_app(
        settings(agent=(f"sales={tmp_path / 'sales.toml'}", f"support={tmp_path / 'support.toml'}")),
        make_engines(),
    )
    c: TestClient = TestClient(TestServer(app))  # type: ignore[type-arg]
    await c.start_server()
    try:
        token = CallTokens(CALL_SECRET).mint(60, agent="sales")
        sdp = await offer_sdp()
        refused = await c.post(
            "/offer", json={"sdp": sdp, "type": "offer", "agent": "support"}, headers=auth(token)
        )
        assert refused.status == 403
        taken = await c.post("/offer", json={"sdp": sdp, "type": "offer"}, headers=auth(token))
        assert taken.status == 200
        call = c.app[REGISTRY].get((await taken.json())["call_id"])
        assert call is not None and call.agent.name == "sales"
    finally:
        await c.close()


async def test_the_page_gets_turn_credentials_that_coturn_accepts_and_that_expire(client) -> None:  # type: ignore[no-untyped-def]
    assert (await client.get("/api/ice")).status == 401
    before = time.time()
    reply = await client.get("/api/ice", headers=auth(CallTokens(CALL_SECRET).mint(60)))
    assert reply.status == 200 and reply.headers["Cache-Control"] == "no-store"
    servers = (await reply.json())["iceServers"]
    assert servers[0] == {"urls": ["stun:stun.example.com:3478"]}
    turn = servers[1]
    assert turn["urls"] == ["turn:turn.example.com:3478?transport=udp", "turns:turn.example.com:5349"]
    expiry, _, user = turn["username"].partition(":")
    assert user and before + 600 <= int(expiry) + 1 <= time.time() + 601
    # coturn (use-auth-secret) computes the password from the username just so:
    expected = base64.b64encode(
        hmac.new(TURN_SECRET.encode(), turn["username"].encode(), hashlib.sha1).digest()
    )
    assert turn["credential"] == expected.decode()
    assert turn_credentials(TURN_SECRET, 600, 1000.0, "x") == ("1600:x", _hmac_sha1("1600:x"))
    with_bearer = await client.get("/api/ice", headers=auth(BEARER))
    assert with_bearer.status == 200


def _hmac_sha1(username: str) -> str:
    return base64.b64encode(hmac.new(TURN_SECRET.encode(), username.encode(), hashlib.sha1).digest()).decode()


def test_parley_token_prints_a_call_token_the_service_accepts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secret_file = tmp_path / "call-token-secret"
    secret_file.write_text(CALL_SECRET + "\n")
    assert main(["token", "--call-token-secret-file", str(secret_file), "--for-agent", "sales"]) == 0
    token = capsys.readouterr().out.strip()
    grant = CallTokens(CALL_SECRET).check(token, time.time())
    assert grant.agent == "sales" and grant.expires_at - time.time() > 250  # 300 s by default
    monkeypatch.setenv("PARLEY_CALL_TOKEN_SECRET", CALL_SECRET)
    monkeypatch.setenv("PARLEY_CALL_TOKEN_TTL_S", "30")
    assert main(["token"]) == 0
    short = CallTokens(CALL_SECRET).check(capsys.readouterr().out.strip(), time.time())
    assert short.agent is None and short.expires_at - time.time() <= 31
    monkeypatch.delenv("PARLEY_CALL_TOKEN_SECRET")
    assert main(["token"]) == 2


def test_secrets_come_from_the_environment_or_a_file_never_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--token", "hunter2-on-the-command-line"])
    error = capsys.readouterr().err
    assert "PARLEY_TOKEN" in error and "--token-file" in error and "hunter2" not in error
    secret = tmp_path / "token"
    secret.write_text("from-a-file\n")
    args = parser.parse_args(["serve", "--token-file", str(secret)])
    assert load_settings(args, environ={}).token == "from-a-file"
    assert load_settings(None, environ={"PARLEY_TOKEN": "from-env"}).token == "from-env"
    assert (
        load_settings(None, environ={"PARLEY_WEBHOOK_SECRET_FILE": str(secret)}).webhook_secret
        == "from-a-file"
    )
    config = tmp_path / "parley.toml"
    config.write_text(f'turn_secret_file = "{secret}"\nturn_urls = ["turn:t.example.com"]\n')
    assert load_settings(None, environ={"PARLEY_CONFIG": str(config)}).turn_secret == "from-a-file"
    with pytest.raises(ValueError, match="cannot read"):
        load_settings(parser.parse_args(["serve", "--token-file", str(tmp_path / "missing")]), environ={})


async def test_secrets_never_reach_the_logs() -> None:
    webhook, stream, api_key = "webhook-secret-777", "stream-secret-888", "sk-api-key-999"
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(CallContext(transcripts=True))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    app = create_app(
        settings(
            webhook_secret=webhook, stream_secret=stream, llm_api_key=api_key, twilio_auth_token="tw-tok-555"
        ),
        make_engines(),
    )
    c: TestClient = TestClient(TestServer(app))  # type: ignore[type-arg]
    try:
        await c.start_server()
        base = str(c.make_url("")).rstrip("/")
        for credential in ("wrong", CALL_SECRET, TURN_SECRET, BEARER + "x"):
            await c.get("/api/calls", headers=auth(credential))
        await c.get("/api/ice", headers=auth(CallTokens(CALL_SECRET).mint(60)))
        async with Caller(base, token=BEARER) as caller:
            await caller.wait_for_event("state", timeout=5)
        with contextlib.suppress(Exception):
            await c.post("/twilio/voice", data={"CallSid": "CA1"})
    finally:
        await c.close()
        root.removeHandler(handler)
        root.setLevel(level)
    text = out.getvalue()
    assert "call_started" in text  # the call was logged, at debug level too
    for secret in (BEARER, CALL_SECRET, TURN_SECRET, webhook, stream, api_key, "tw-tok-555"):
        assert secret not in text, secret
