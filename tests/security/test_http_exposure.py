"""The HTTP API as an attacker on the network, or a web page the operator happens to open, finds it
(issue 42, items 8, 10, 11, 12): nothing open where it can be reached, no state changed from another
site or through a rebound DNS name, no source holding every line, and no X-Forwarded-For believed from
a proxy nobody named. After each attack the next legitimate request works.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import ClientResponse

from parley.access import CallTokens
from parley.app import REGISTRY, create_app
from parley.bench.service import free_port
from parley.config import Settings, SettingsError
from parley.exposure import check_exposure
from parley.settings_sources import load_settings
from tests.doubles import make_engines
from tests.robustness.test_defects import offer_sdp
from tests.security.conftest import Service, Start

TOKEN = "bearer-for-the-api-0123456789"
CALL_SECRET = "call-token-secret-0123456789"
METRICS_TOKEN = "metrics-scraper-0123456789"
EVIL = "http://evil.example"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def error_of(response: ClientResponse, status: int) -> str:
    assert response.status == status, (response.status, await response.text())
    message = (await response.json())["error"]
    assert isinstance(message, str)
    return message


async def offer(service: Service, headers: dict[str, str] | None = None) -> ClientResponse:
    """A real WebRTC offer (the answer is never applied: the call holds a line until it times out)."""
    body = {"sdp": await offer_sdp(), "type": "offer"}
    return await service.client.post("/offer", json=body, headers={**service.auth, **(headers or {})})


def own_origin(service: Service) -> str:
    return str(service.client.make_url("")).rstrip("/")


# item 8: nothing open by default where it can be reached


def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`parley serve ...` as an operator starts it, with no PARLEY_* setting but `env`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    command = [sys.executable, "-m", "parley", "serve", "--port", str(free_port()), *args]
    return subprocess.run(command, env={**environ, **env}, capture_output=True, text=True, timeout=60)


def test_serving_on_a_public_address_without_a_token_refuses_to_start_and_names_the_fix() -> None:
    result = serve("--host", "0.0.0.0", "--sip", "off")
    assert result.returncode != 0
    assert "PARLEY_TOKEN" in result.stderr and "--insecure-open" in result.stderr, result.stderr
    sip = serve("--host", "127.0.0.1", "--sip", f"0.0.0.0:{free_port()}", PARLEY_TOKEN=TOKEN)
    assert sip.returncode != 0
    assert "--sip-auth-user" in sip.stderr and "--sip-allow" in sip.stderr, sip.stderr


def test_a_token_or_an_explicit_lab_switch_lets_a_public_address_start() -> None:
    check_exposure(Settings(host="0.0.0.0", token=TOKEN, sip="0.0.0.0:5060", sip_allow=("192.0.2.0/24",)))
    check_exposure(Settings(host="::", sip="off", insecure_open=True))
    check_exposure(Settings(host="127.0.0.1"))  # loopback: only this host reaches it
    with pytest.raises(SettingsError, match="PARLEY_TOKEN"):
        create_app(Settings(host="0.0.0.0", sip="off", call_token_secret=CALL_SECRET), make_engines())


async def test_a_call_token_secret_alone_leaves_the_api_closed(start: Start) -> None:
    service = await start(sip="off", call_token_secret=CALL_SECRET)
    for path in ("/api/calls", "/api/calls/c-1", "/metrics"):
        assert "PARLEY_TOKEN" in await error_of(await service.client.get(path), 401)
    assert "PARLEY_TOKEN" in await error_of(await service.client.post("/api/drain", json={}), 401)
    await error_of(await service.client.get("/api/ice"), 401)
    call_token = CallTokens(CALL_SECRET).mint(60)
    await error_of(await service.client.get("/api/calls", headers=bearer(call_token)), 401)
    # What a call token is for still works: TURN credentials, then one call.
    assert (await service.client.get("/api/ice", headers=bearer(call_token))).status == 200
    assert (await offer(service, bearer(call_token))).status == 200


async def test_metrics_need_the_metrics_token_or_the_bearer_and_the_metrics_token_opens_nothing_else(
    start: Start,
) -> None:
    service = await start(sip="off", token=TOKEN, metrics_token=METRICS_TOKEN)
    await error_of(await service.client.get("/metrics"), 401)
    await error_of(await service.client.get("/metrics", headers=bearer("guess")), 401)
    await error_of(await service.client.get("/api/calls", headers=bearer(METRICS_TOKEN)), 401)
    await error_of(await service.client.get("/api/ice"), 401)
    for credential in (METRICS_TOKEN, TOKEN):
        scraped = await service.client.get("/metrics", headers=bearer(credential))
        assert scraped.status == 200 and "parley_calls_active" in await scraped.text()
    assert (await service.client.get("/api/ice", headers=bearer(TOKEN))).status == 200


async def test_with_a_token_metrics_are_closed_to_a_scraper_without_it(start: Start) -> None:
    service = await start(sip="off", token=TOKEN)
    await error_of(await service.client.get("/metrics"), 401)
    assert (await service.client.get("/metrics", headers=bearer(TOKEN))).status == 200


# item 10: cross-site requests and DNS rebinding


async def test_a_cross_site_text_plain_post_cannot_drain_the_instance(start: Start) -> None:
    service = await start()
    # What a page on any site can send without asking first: a "simple" request.
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ):
        drained = await service.client.post("/api/drain", data=b"{}", headers={"Content-Type": content_type})
        assert "application/json" in await error_of(drained, 415)
    assert (await service.client.get("/readyz")).status == 200  # not draining
    await service.still_serves()


async def test_a_body_that_is_not_json_gets_415_whatever_the_credentials(start: Start) -> None:
    service = await start(token="api-token-0123456789")
    for path in ("/api/drain", "/api/calls/sip"):
        refused = await service.client.post(path, data=b"{}", headers={"Content-Type": "text/plain"})
        assert "application/json" in await error_of(refused, 415)
        unauthorised = await service.client.post(path, json={})
        assert unauthorised.status == 401
    assert (await service.client.get("/readyz")).status == 200  # not draining


async def test_a_cross_site_text_plain_post_cannot_dial_out(start: Start) -> None:
    service = await start()
    peer = await service.wire()
    body = f'{{"to": "sip:+15550100@{peer.here}"}}'.encode()
    dialled = await service.client.post("/api/calls/sip", data=body, headers={"Content-Type": "text/plain"})
    assert "application/json" in await error_of(dialled, 415)
    await asyncio.sleep(0.2)
    assert not peer.requests("INVITE") and not service.client.app[REGISTRY].active()
    await service.still_serves()


async def test_a_page_on_another_site_cannot_open_a_call_or_drain(start: Start) -> None:
    service = await start(sip="off")
    refused = await offer(service, {"Origin": EVIL})
    assert "--allowed-origins" in await error_of(refused, 403)
    drained = await service.client.post("/api/drain", json={}, headers={"Origin": EVIL})
    await error_of(drained, 403)
    sandboxed = await service.client.post("/api/drain", json={}, headers={"Origin": "null"})
    await error_of(sandboxed, 403)
    assert not service.client.app[REGISTRY].active()
    assert (await service.client.get("/readyz")).status == 200
    # The service's own page (its origin, as a browser sends it) still calls.
    assert (await offer(service, {"Origin": own_origin(service)})).status == 200


async def test_a_page_on_another_site_cannot_open_a_carrier_stream(start: Start) -> None:
    service = await start(sip="off")
    url = str(service.client.make_url("/twilio/stream"))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(url, origin=EVIL)
        assert refused.value.status == 403
        stream = await session.ws_connect(url)  # a carrier (no browser Origin) still connects
        await stream.close()


async def test_an_allowed_origin_may_post_and_others_may_not(start: Start) -> None:
    service = await start(sip="off", allowed_origins=("https://shop.example.com",))
    assert (await offer(service, {"Origin": "https://shop.example.com"})).status == 200
    await error_of(await offer(service, {"Origin": "https://shop.example.com.evil.example"}), 403)


async def test_a_rebound_dns_name_cannot_read_the_calls_of_a_loopback_service(start: Start) -> None:
    service = await start(sip="off")
    port = service.client.port
    assert (await offer(service)).status == 200  # a call whose transcript a rebinding page would read
    for host in (f"rebind.evil.example:{port}", "rebind.evil.example", f"192.0.2.1:{port}"):
        read = await service.client.get("/api/calls", headers={"Host": host})
        assert "--allowed-hosts" in await error_of(read, 421)
        posted = await service.client.post("/api/drain", json={}, headers={"Host": host})
        await error_of(posted, 421)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"127.0.0.2:{port}"):
        assert (await service.client.get("/api/calls", headers={"Host": host})).status == 200
    assert (await service.client.get("/readyz")).status == 200


async def test_the_public_url_and_allowed_hosts_are_served(start: Start) -> None:
    service = await start(
        sip="off", public_url="https://voice.example.com", allowed_hosts=("parley.internal",)
    )
    for host in ("voice.example.com", "parley.internal:8080"):
        assert (await service.client.get("/api/calls", headers={"Host": host})).status == 200
    await error_of(await service.client.get("/api/calls", headers={"Host": "other.example"}), 421)


# item 11: one source cannot hold every line


async def test_one_source_cannot_hold_every_line(start: Start) -> None:
    defaults = Settings()
    assert defaults.setup_burst <= defaults.max_calls
    assert 0 < defaults.max_calls_per_source < defaults.max_calls
    service = await start(sip="off", rate_limit_exempt=(), token=TOKEN)
    before = await service.counter("parley_calls_refused_total", transport="webrtc", reason="source_limit")
    opened = [await offer(service) for _ in range(defaults.max_calls_per_source)]
    assert [r.status for r in opened] == [200] * defaults.max_calls_per_source
    refused = await offer(service)
    assert "too many calls" in await error_of(refused, 429)
    assert int(refused.headers["Retry-After"]) >= 1
    after = await service.counter("parley_calls_refused_total", transport="webrtc", reason="source_limit")
    assert after == before + 1
    registry = service.client.app[REGISTRY]
    assert len(registry.active()) == defaults.max_calls_per_source
    # One of its calls ends: the source may call again.
    first = (await opened[0].json())["call_id"]
    assert (await service.client.delete(f"/api/calls/{first}", headers=service.auth)).status == 200
    assert (await offer(service)).status == 200


async def test_callers_behind_a_trusted_proxy_are_capped_one_by_one(start: Start) -> None:
    service = await start(sip="off", trusted_proxies=("127.0.0.1",), max_calls_per_source=1)
    assert (await offer(service, {"X-Forwarded-For": "203.0.113.7"})).status == 200
    await error_of(await offer(service, {"X-Forwarded-For": "203.0.113.7"}), 429)
    assert (await offer(service, {"X-Forwarded-For": "203.0.113.8"})).status == 200


# item 12: forwarded headers count from --trusted-proxies only


async def bad_offers(service: Service, count: int, headers: dict[str, str]) -> list[int]:
    """Offers that are counted as set-ups and then refused as malformed (400): no line is held."""
    statuses = []
    for _ in range(count):
        body: dict[str, Any] = {"sdp": "v=0\r\n", "type": "offer"}
        response = await service.client.post("/offer", json=body, headers=headers)
        statuses.append(response.status)
    return statuses


async def test_a_local_proxy_nobody_named_does_not_make_every_caller_exempt(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    service = await start(sip="off", setup_rate=0.01, setup_burst=2)
    forwarded = {"X-Forwarded-For": "203.0.113.7"}
    with caplog.at_level(logging.WARNING, logger="parley.ratelimit"):
        statuses = await bad_offers(service, 3, forwarded)
        await bad_offers(service, 1, {"X-Forwarded-For": "203.0.113.8"})
    assert statuses == [400, 400, 429], statuses  # counted as the proxy's address, and not spared
    warnings = [r for r in caplog.records if "untrusted_proxy" in r.getMessage()]
    assert len(warnings) == 1 and "--trusted-proxies" in getattr(warnings[0], "hint", "")
    # A tool on this host (no forwarding) is still spared; so is a named proxy's own request.
    assert await bad_offers(service, 3, {}) == [400, 400, 400]


async def test_a_local_proxy_nobody_named_cannot_flood_carrier_streams(start: Start) -> None:
    service = await start(sip="off", setup_rate=0.01, setup_burst=1)
    url = str(service.client.make_url("/twilio/stream"))
    async with aiohttp.ClientSession() as session:
        forwarded = {"X-Forwarded-For": "203.0.113.7"}
        first = await session.ws_connect(url, headers=forwarded)
        second = await session.ws_connect(url, headers=forwarded)
        message = await second.receive(timeout=5)
        assert message.type is aiohttp.WSMsgType.CLOSE and second.close_code == 1013
        await first.close()
        local = await session.ws_connect(url)  # this host itself, not forwarding: spared
        assert not local.closed
        await local.close()


async def test_forwarded_proto_and_host_from_anyone_else_do_not_change_the_signed_url(start: Start) -> None:
    """A Twilio account signs the webhooks of all its applications with one auth token: a request signed
    for another application's URL must not pass here because it says it was forwarded from there."""
    from parley.transports.twilio import twilio_signature

    auth_token = "twilio-auth-token-0123"
    service = await start(sip="off", twilio_auth_token=auth_token)
    params = {"CallSid": "CA-elsewhere", "From": "+15550001111", "To": "+15550002222"}
    elsewhere = "https://other-app.example/twilio/voice"
    headers = {
        "X-Twilio-Signature": twilio_signature(auth_token, elsewhere, sorted(params.items())),
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "other-app.example",
    }
    replayed = await service.client.post("/twilio/voice", data=params, headers=headers)
    assert "signature" in await error_of(replayed, 403)
    here = str(service.client.make_url("/twilio/voice"))
    signed = {"X-Twilio-Signature": twilio_signature(auth_token, here, sorted(params.items()))}
    answered = await service.client.post("/twilio/voice", data=params, headers=signed)
    assert answered.status == 200 and "<Stream" in await answered.text()


# item 8: what the repository ships starts only with credentials, each from a secret

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def image_environment() -> dict[str, str]:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=str(DEPLOY.parent / "Dockerfile"))
    return {k: v for k, v in parser.envs.items() if k.startswith("PARLEY_")}


def compose_value(value: object) -> str:
    """A compose environment value as compose interpolates it with nothing set: `${X:-default}`."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def test_the_image_alone_refuses_to_start_open() -> None:
    environment = image_environment()
    assert environment["PARLEY_HOST"] == "0.0.0.0" and "PARLEY_TOKEN" not in environment
    with pytest.raises(SettingsError, match="PARLEY_TOKEN"):
        check_exposure(load_settings(environ=environment))


def test_compose_gives_parley_its_token_and_sip_credentials_and_prometheus_its_scrape_token(
    tmp_path: Path,
) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name in ("parley", "parley-gpu"):
        service = compose["services"][name]
        environment = {k: compose_value(v) for k, v in service["environment"].items()}
        for variable, path in list(environment.items()):
            if variable.endswith("_FILE"):
                secret = path.removeprefix("/run/secrets/")
                assert secret in service["secrets"] and secret in compose["secrets"], variable
                (tmp_path / secret).write_text(f"{secret}-value")
                environment[variable] = str(tmp_path / secret)
        settings = load_settings(environ={**image_environment(), **environment})
        assert settings.token and settings.metrics_token and settings.sip_auth_password
        check_exposure(settings)
    assert "parley-metrics-token" in compose["services"]["prometheus"]["secrets"]
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["authorization"]["credentials_file"] == "/run/secrets/parley-metrics-token"


def test_the_kubernetes_pods_take_their_credentials_from_the_secret() -> None:
    statefulset = next(yaml.safe_load_all((DEPLOY / "k8s" / "base" / "parley.yaml").read_text()))
    assert statefulset["kind"] == "StatefulSet"  # both overlays keep its env; they change image and resources
    env = {e["name"]: e for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}
    for name, key in (
        ("PARLEY_TOKEN", "token"),
        ("PARLEY_METRICS_TOKEN", "metrics-token"),
        ("PARLEY_SIP_ALLOW", "sip-allow"),
    ):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "parley", "key": key}
    monitor = yaml.safe_load((DEPLOY / "k8s" / "base" / "servicemonitor.yaml").read_text())
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["authorization"]["credentials"] == {"name": "parley", "key": "metrics-token"}
