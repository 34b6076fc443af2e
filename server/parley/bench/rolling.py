"""Rolling restart: a fleet replaced one instance at a time while callers keep calling.

Instances of `parley serve` (the real models) share one records database, behind Debian's Kamailio
(SIP, deploy/kamailio/kamailio.cfg) and HAProxy (the page's WebRTC calls, deploy/haproxy/haproxy.cfg).
SIP and page callers call one call after another (hear the greeting, stay a few seconds, hang up). Once
they are under way, each instance in turn is drained (what `parley drain`, a pod's preStop hook, does),
stopped once its calls have ended, and replaced by a new one on its ports; the next waits until the new
one has taken a call over each transport (both proxies send it calls again). The callers keep calling
for --load-s, and until the last instance was replaced.

Reported: calls placed per transport; dropped (a record that does not end "hangup", the caller's own
hang-up); refused, each with the instances ready at that moment (a refusal while one had room is the
fault a rolling restart must not have); each drain's seconds (drain asked -> no live call), each
replacement's (drained -> the new instance ready) and its time back in rotation (ready -> a call over
each transport); the calls each replacement took; the machine.

Records: by default one SQLite file (WAL) in the run's folder, shared by the instances as they share a
host here; --database names a PostgreSQL one instead, as a fleet on several hosts has. Needs a source
checkout (deploy/) and Debian's kamailio and haproxy (scripts/install-system-packages.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from parley.bench import fleet, progress
from parley.bench.caller import Caller
from parley.bench.listening import CallFailed
from parley.bench.service import Service
from parley.bench.sip_caller import SipCaller
from parley.drain import drain
from parley.engines.device import AVX512_FLAGS, cpu_fields, cpu_flags
from parley.record_settings import DATABASE_SCHEMES

NAME = "rolling"
HELP = "rolling restart under calls: dropped, refused, drain and replacement times"

TRANSPORTS = ("sip", "webrtc")
CALL_S = 5.0  # each call lasts this long after its greeting was heard
PAUSE_S = 0.5  # between one caller's calls
CONNECT_TIMEOUT_S = 30.0
GREETING_TIMEOUT_S = 20.0
SETTLE_S = 15.0  # the callers' first calls are under way on every instance before the first drain
DRAIN_WAIT_S = 300.0  # many times a call's length: a drain still waiting then has a stuck call
DRAIN_POLL_S = 0.5
# Kamailio probes its destinations every 10 s (deploy/kamailio/kamailio.cfg) and HAProxy every 2 s: a
# replacement not sent a call of each transport well after that is out of rotation.
REJOIN_TIMEOUT_S = 60.0
RECORDS_SETTLE_S = 10.0  # a call's record is written off the media path, a moment after its hang-up
READY_TIMEOUT_S = 2.0
# CPU features the engines' kernels use (CTranslate2, llama.cpp, onnxruntime pick by them).
CPU_FEATURES = ("avx", "avx2", "fma", "f16c", *sorted(AVX512_FLAGS), "avx512_vnni", "avx512_bf16", "amx_int8")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--instances", type=int, default=2, help="instances in the fleet, replaced one by one (default 2)"
    )
    parser.add_argument(
        "--load-s",
        type=float,
        default=120.0,
        help="the callers call at least this long, and until the last instance was replaced (default 120)",
    )
    parser.add_argument("--sip-callers", type=int, default=2, help="SIP callers through Kamailio (default 2)")
    parser.add_argument(
        "--page-callers", type=int, default=1, help="WebRTC (page) callers through HAProxy (default 1)"
    )
    parser.add_argument(
        "--database",
        default="",
        metavar="URL",
        help="the records database the instances share, postgresql://... (default: a SQLite file in a "
        "temporary folder)",
    )
    parser.add_argument(
        "--output",
        dest="json",
        default="",
        metavar="FILE",
        help="write results here (default bench-rolling.json)",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `parley serve` flag for every instance (repeatable: --server-arg=--device=cpu)",
    )
    parser.add_argument(
        "--logs",
        default="",
        metavar="FOLDER",
        help="keep the instances', Kamailio's and HAProxy's logs here (default: a temporary folder, kept "
        "only when the run finds a fault)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """SystemExit with what is wrong, before anything starts."""
    if args.instances < 2:
        raise SystemExit("--instances must be 2 or more: one serves while another is replaced")
    if args.sip_callers < 0 or args.page_callers < 0 or args.sip_callers + args.page_callers == 0:
        raise SystemExit("--sip-callers and --page-callers: at least one caller, none negative")
    if args.load_s <= 0:
        raise SystemExit("--load-s must be positive")
    if args.database and not args.database.startswith(DATABASE_SCHEMES):
        raise SystemExit(f"--database must be a postgresql:// URL, not {args.database!r}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    check_arguments(args)
    folder = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="parley-rolling-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        results = await measure(
            folder,
            instances=args.instances,
            load_s=args.load_s,
            sip_callers=args.sip_callers,
            page_callers=args.page_callers,
            database=args.database,
            server_args=args.server_arg,
        )
    except fleet.FleetError as exc:
        if not args.logs:
            shutil.rmtree(folder, ignore_errors=True)
        raise SystemExit(f"parley bench rolling: {exc}") from exc
    except BaseException:
        progress(f"the fleet's logs: {folder}")
        raise
    if args.logs or not results["ok"]:
        results["summary"]["logs"] = str(folder)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return results


@dataclass
class Placed:
    transport: str
    call_id: str
    at_s: float  # since the load began

    @property
    def instance(self) -> str:
        """The instance tag in its id (c-TAG-...)."""
        return self.call_id.split("-")[1] if self.call_id.count("-") >= 2 else ""


@dataclass
class Refusal:
    transport: str
    at_s: float
    error: str
    ready: list[str]  # the instances whose /readyz said 200 right after


@dataclass
class Tally:
    began: float = field(default_factory=time.monotonic)
    placed: list[Placed] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    unheard: list[str] = field(default_factory=list)  # placed, but no greeting heard

    def now(self) -> float:
        return round(time.monotonic() - self.began, 2)


@dataclass
class Step:
    """One instance replaced."""

    instance: str
    drained_s: float  # drain asked -> no live call on it
    drain_code: int  # `parley drain`'s exit code: 0 when no call was left
    exit_code: int | None  # the old instance's, on SIGTERM once drained
    replaced_s: float  # drained -> the new instance ready
    ready_at_s: float  # when it was ready, since the load began
    back_in_rotation_s: float | None  # ready -> a call over each transport (None: not within the wait)


@dataclass
class Schedule:
    until: float  # monotonic: the callers call at least until then,
    rolled: bool = False  # and until every instance was replaced

    def over(self) -> bool:
        return self.rolled and time.monotonic() >= self.until


REFUSALS = (CallFailed, OSError, TimeoutError, aiohttp.ClientError, ValueError)


async def keep_calling(
    transport: str,
    new_caller: Callable[[], Caller | SipCaller],
    tally: Tally,
    schedule: Schedule,
    ready_now: Callable[[], Awaitable[list[str]]],
) -> None:
    """One caller's calls, one after another, until the schedule is over."""
    while not schedule.over():
        caller = new_caller()
        try:
            await caller.connect(timeout=CONNECT_TIMEOUT_S)
        except REFUSALS as exc:
            at = tally.now()
            tally.refused.append(Refusal(transport, at, str(exc) or type(exc).__name__, await ready_now()))
            progress(f"{transport} call refused at {at:.0f} s: {exc}")
        else:
            tally.placed.append(Placed(transport, caller.call_id, tally.now()))
            try:
                await caller.wait_for_audio(after=0.0, timeout=GREETING_TIMEOUT_S)
            except TimeoutError:
                tally.unheard.append(caller.call_id)
            await asyncio.sleep(CALL_S)
        finally:
            await caller.hangup()
        await asyncio.sleep(PAUSE_S)


def ready(service: Service) -> bool:
    """Whether the instance would take a call now (its /readyz)."""
    try:
        with urllib.request.urlopen(f"{service.base_url}/readyz", timeout=READY_TIMEOUT_S) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@dataclass(frozen=True)
class _Address:
    """Where `parley drain` reaches an instance (its settings' host, port and token)."""

    host: str
    port: int
    token: str = ""


def drain_instance(service: Service) -> int:
    """`parley drain` on the instance (blocking): ask it to take no call, wait until its calls have ended.
    Its lines are progress here (stderr), not results."""
    with contextlib.redirect_stdout(sys.stderr):
        return drain(_Address("127.0.0.1", service.port), DRAIN_WAIT_S, DRAIN_POLL_S)


async def back_in_rotation(tally: Tally, tag: str, since_s: float, transports: Sequence[str]) -> float | None:
    """Seconds from `since_s` until the instance tagged `tag` has taken a call over each of `transports`;
    None when that did not happen within REJOIN_TIMEOUT_S."""
    deadline = time.monotonic() + REJOIN_TIMEOUT_S
    while time.monotonic() < deadline:
        firsts = [
            min(
                (
                    p.at_s
                    for p in tally.placed
                    if p.instance == tag and p.transport == t and p.at_s >= since_s
                ),
                default=None,
            )
            for t in transports
        ]
        if all(first is not None for first in firsts):
            return round(max(f for f in firsts if f is not None) - since_s, 2)
        await asyncio.sleep(0.5)
    return None


async def replace(
    services: list[Service],
    index: int,
    flags: Sequence[str],
    folder: Path,
    tally: Tally,
    transports: Sequence[str],
) -> Step:
    """Drain instance `index`, stop it once its calls have ended, start a new one on its ports (in its place
    in `services`) and wait until it is back in rotation."""
    old, tag = services[index], fleet.instance_tag(index)
    began = time.monotonic()
    drain_code = await asyncio.to_thread(drain_instance, old)
    drained = time.monotonic()
    exit_code = await asyncio.to_thread(old.stop)
    new = Service(flags, log_path=folder / f"parley-{index}-new.log", ports=(old.port, old.sip_port))
    await asyncio.to_thread(new.start)
    services[index] = new
    ready_at = tally.now()
    replaced_s = round(time.monotonic() - drained, 2)
    progress(f"{tag}: drained in {drained - began:.1f} s, replaced in {replaced_s:.1f} s")
    return Step(
        tag,
        round(drained - began, 2),
        drain_code,
        exit_code,
        replaced_s,
        ready_at,
        await back_in_rotation(tally, tag, ready_at, transports),
    )


def _outcome(service: Service, call_id: str) -> str | None:
    """How a call's record ended (None: not yet)."""
    try:
        record = service.get_json(f"/api/calls/{call_id}")
    except urllib.error.HTTPError as exc:
        return "no record" if exc.code == 404 else None
    reason = record.get("ended_reason")
    return str(reason) if reason else None


async def outcomes(service: Service, call_ids: Sequence[str]) -> dict[str, str]:
    """Each call's outcome from the fleet's records (any instance reads them all), once written."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + RECORDS_SETTLE_S
    while True:
        for call_id in call_ids:
            if call_id not in found and (outcome := await asyncio.to_thread(_outcome, service, call_id)):
                found[call_id] = outcome
        if len(found) == len(call_ids) or time.monotonic() > deadline:
            return {call_id: found.get(call_id, "not ended") for call_id in call_ids}
        await asyncio.sleep(0.5)


async def measure(
    folder: Path,
    *,
    instances: int = 2,
    load_s: float = 120.0,
    sip_callers: int = 2,
    page_callers: int = 1,
    database: str = "",
    server_args: Sequence[str] = (),
) -> dict[str, Any]:
    """The rolling restart, its logs and configs (and, without `database`, the SQLite file) in `folder`;
    the results as `report` gives them."""
    fleet.check_prerequisites()
    records: list[str] = []
    if not database:
        # Made here, before the instances start together, each of which would make it if it were missing.
        (folder / "records").mkdir(mode=0o700, exist_ok=True)
        records = ["--data-dir", str(folder / "records")]
    extra = [
        [*records, "--instance-tag", fleet.instance_tag(i), "--trusted-proxies", "127.0.0.1", *server_args]
        for i in range(instances)
    ]
    transports = [t for t, n in zip(TRANSPORTS, (sip_callers, page_callers), strict=True) if n]
    progress(f"starting {instances} instances, Kamailio and HAProxy in {folder}")
    with (
        fleet.instances(folder, database, extra) as services,
        fleet.Kamailio(folder, [s.sip_port for s in services]) as kamailio,
        fleet.HAProxy(folder, [s.port for s in services]) as haproxy,
    ):
        sip_uri = f"sip:parley@127.0.0.1:{kamailio.port}"
        tally = Tally()
        schedule = Schedule(time.monotonic() + load_s)

        async def ready_now() -> list[str]:
            up = await asyncio.gather(*(asyncio.to_thread(ready, s) for s in services))
            return [fleet.instance_tag(i) for i, serving in enumerate(up) if serving]

        def sip_caller() -> SipCaller:
            return SipCaller(haproxy.url, sip_uri)

        def page_caller() -> Caller:
            return Caller(haproxy.url)

        callers = [
            *(keep_calling("sip", sip_caller, tally, schedule, ready_now) for _ in range(sip_callers)),
            *(keep_calling("webrtc", page_caller, tally, schedule, ready_now) for _ in range(page_callers)),
        ]
        load = asyncio.ensure_future(asyncio.gather(*callers))
        steps: list[Step] = []
        try:
            await asyncio.sleep(SETTLE_S)
            for index in range(instances):
                flags = ["--database", database, *extra[index]]
                steps.append(await replace(services, index, flags, folder, tally, transports))
            schedule.rolled = True
            await load
        finally:
            if not load.done():
                load.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load
        loaded_s = tally.now()
        ended = await outcomes(services[0], [p.call_id for p in tally.placed])
    kind = "PostgreSQL" if database else "SQLite, one file shared by the instances"
    return report(tally, ended, steps, instances=instances, load_s=loaded_s, records=kind, cpu=machine())


def report(
    tally: Tally,
    ended: dict[str, str],
    steps: Sequence[Step],
    *,
    instances: int,
    load_s: float,
    records: str,
    cpu: dict[str, Any],
) -> dict[str, Any]:
    """The results: a summary (the table), each step, each call with its outcome, the faults."""
    calls = [
        {**asdict(p), "instance": p.instance, "outcome": ended.get(p.call_id, "not ended")}
        for p in tally.placed
    ]
    dropped = [call for call in calls if call["outcome"] != "hangup"]
    placed = Counter(p.transport for p in tally.placed)
    taken = {
        s.instance: sum(p.instance == s.instance and p.at_s >= s.ready_at_s for p in tally.placed)
        for s in steps
    }
    features = " ".join(cpu["features"]) or "none listed"
    summary: dict[str, Any] = {
        "instances": instances,
        "records": records,
        "load (s)": load_s,
        "calls placed": {t: placed[t] for t in TRANSPORTS},
        "calls dropped": len(dropped),
        "calls refused": len(tally.refused),
        "refused while an instance was ready": sum(bool(r.ready) for r in tally.refused),
        "calls with no greeting heard": len(tally.unheard),
        "drain (s)": {s.instance: s.drained_s for s in steps},
        "replacement (s)": {s.instance: s.replaced_s for s in steps},
        "back in rotation (s)": {s.instance: s.back_in_rotation_s for s in steps},
        "calls taken by each replacement": taken,
        "machine": f"{cpu['cpu']}, {cpu['cores']} cores, features: {features}",
    }
    clean_steps = len(steps) == instances and all(
        s.drain_code == 0 and s.exit_code == 0 and s.back_in_rotation_s is not None for s in steps
    )
    return {
        "summary": summary,
        "steps": [asdict(s) for s in steps],
        "calls": calls,
        "dropped": dropped,
        "refused": [asdict(r) for r in tally.refused],
        "machine": cpu,
        "ok": not dropped and not tally.refused and clean_steps,
    }


def machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The CPU the run had: its model, the cores this process may use, the features its kernels use."""
    fields = cpu_fields(cpuinfo)
    features = cpu_flags(cpuinfo)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "cpu": fields.get("model name") or platform.processor() or platform.machine(),
        "cores": cores,
        "features": [f for f in CPU_FEATURES if f in features],
    }
