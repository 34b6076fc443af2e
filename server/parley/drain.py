"""`parley drain`: ask the service on this host to take no new calls, then wait for its live calls to
end. A pod's preStop hook runs it, so that a pod being removed finishes its calls instead of cutting
them (Kubernetes sends SIGTERM only once the hook returns)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Protocol

POLL_S = 2.0


class Service(Protocol):
    """What reaching the service takes: where it listens (ServiceSettings) and its bearer token
    (AccessSettings)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def token(self) -> str: ...


def _request(settings: Service, path: str, method: str = "GET") -> Any:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
    body = None
    if method == "POST":  # the service takes state-changing requests as JSON only
        headers["Content-Type"] = "application/json"
        body = b"{}"
    request = urllib.request.Request(
        f"http://{host}:{settings.port}{path}", data=body, method=method, headers=headers
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def drain(settings: Service, wait_s: float, poll_s: float = POLL_S) -> int:
    """Drain, then wait up to `wait_s` for the calls to end. 0 when none is left, 1 when some still run
    at the deadline, 2 when the service could not be reached."""
    try:
        calls = int(_request(settings, "/api/drain", "POST")["calls"])
        deadline = time.monotonic() + wait_s
        while calls and time.monotonic() < deadline:
            print(f"parley drain: {calls} call(s) still live", flush=True)
            time.sleep(poll_s)
            calls = len(_request(settings, "/api/calls"))
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError) as exc:
        print(f"parley drain: the service did not answer: {exc}", flush=True)
        return 2
    print(f"parley drain: {'done' if not calls else f'{calls} call(s) left at the deadline'}", flush=True)
    return 0 if not calls else 1
