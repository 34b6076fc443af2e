"""`parley bench rolling` without a fleet: its arguments, the report it makes of a tally, and the Kamailio
and HAProxy configs it renders from deploy/ (checked by the programs themselves where installed)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from parley.bench import fleet, rolling
from parley.bench.daemon import system_program
from parley.bench.rolling import Placed, Refusal, Schedule, Step, Tally
from parley.cli import build_parser

CPU = {"cpu": "Test CPU", "cores": 2, "features": ["avx", "avx2"]}


def parse(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "rolling", *flags])


def test_the_bench_is_registered_with_its_defaults_and_writes_where_output_says() -> None:
    args = parse()
    assert (args.instances, args.load_s, args.sip_callers, args.page_callers) == (2, 120.0, 2, 1)
    assert (args.database, args.json, args.server_arg) == ("", "", [])
    assert not hasattr(args, "url")  # it starts a fleet of its own
    args = parse(
        "--instances=3",
        "--load-s=60",
        "--sip-callers=1",
        "--page-callers=0",
        "--database=postgresql://parley@127.0.0.1:5432/calls",
        "--output=rolling.json",
        "--server-arg=--device=cpu",
    )
    assert (args.instances, args.load_s, args.sip_callers, args.page_callers) == (3, 60.0, 1, 0)
    assert (args.json, args.server_arg) == ("rolling.json", ["--device=cpu"])
    rolling.check_arguments(args)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--instances=1"], "2 or more"),
        (["--sip-callers=0", "--page-callers=0"], "at least one caller"),
        (["--page-callers=-1"], "none negative"),
        (["--load-s=0"], "positive"),
        (["--database=/tmp/calls.sqlite3"], "postgresql://"),
    ],
)
def test_arguments_that_cannot_make_a_rolling_restart_are_refused_before_anything_starts(
    flags: list[str], said: str
) -> None:
    with pytest.raises(SystemExit, match=said):
        rolling.check_arguments(parse(*flags))


def tally() -> Tally:
    """Two instances replaced: p1 ready again at 40 s, p2 at 90 s."""
    t = Tally()
    t.placed = [
        Placed("sip", "c-p1-a", 1.0),
        Placed("sip", "c-p2-b", 2.0),
        Placed("webrtc", "c-p1-c", 3.0),
        Placed("sip", "c-p2-d", 30.0),
        Placed("sip", "c-p1-e", 45.0),  # p1's replacement
        Placed("webrtc", "c-p1-f", 50.0),
        Placed("sip", "c-p2-g", 95.0),  # p2's replacement
        Placed("webrtc", "c-p2-h", 99.0),
        Placed("sip", "c-p1-i", 100.0),
    ]
    t.refused = [Refusal("sip", 60.0, "INVITE refused: 503", ["p1"]), Refusal("webrtc", 70.0, "503", [])]
    t.unheard = ["c-p2-d"]
    return t


STEPS = [
    Step(
        "p1",
        drained_s=6.5,
        drain_code=0,
        exit_code=0,
        replaced_s=30.0,
        ready_at_s=40.0,
        back_in_rotation_s=10.0,
    ),
    Step(
        "p2",
        drained_s=7.0,
        drain_code=0,
        exit_code=0,
        replaced_s=28.0,
        ready_at_s=90.0,
        back_in_rotation_s=9.0,
    ),
]


def test_the_report_counts_calls_per_transport_drops_refusals_and_what_each_replacement_took() -> None:
    ended = {p.call_id: "hangup" for p in tally().placed} | {"c-p2-d": "shutdown"}
    del ended["c-p1-i"]  # its record never ended
    results = rolling.report(tally(), ended, STEPS, instances=2, load_s=120.5, records="PostgreSQL", cpu=CPU)
    summary = results["summary"]
    assert summary["calls placed"] == {"sip": 6, "webrtc": 3}
    assert summary["calls dropped"] == 2
    assert [(c["call_id"], c["outcome"]) for c in results["dropped"]] == [
        ("c-p2-d", "shutdown"),
        ("c-p1-i", "not ended"),
    ]
    assert summary["calls refused"] == 2
    assert summary["refused while an instance was ready"] == 1
    assert summary["calls with no greeting heard"] == 1
    assert summary["drain (s)"] == {"p1": 6.5, "p2": 7.0}
    assert summary["replacement (s)"] == {"p1": 30.0, "p2": 28.0}
    assert summary["back in rotation (s)"] == {"p1": 10.0, "p2": 9.0}
    # Calls with the instance's tag placed once its replacement was ready: p1's from 40 s, p2's from 90 s.
    assert summary["calls taken by each replacement"] == {"p1": 3, "p2": 2}
    assert summary["machine"] == "Test CPU, 2 cores, features: avx avx2"
    assert results["machine"] == CPU
    assert not results["ok"]


def test_a_run_with_no_drop_no_refusal_and_clean_steps_is_ok_and_one_with_a_stuck_drain_is_not() -> None:
    clean = tally()
    clean.refused = []
    ended = {p.call_id: "hangup" for p in clean.placed}
    assert rolling.report(clean, ended, STEPS, instances=2, load_s=1.0, records="", cpu=CPU)["ok"]
    stuck = [STEPS[0], Step("p2", 300.0, 1, 0, 28.0, 90.0, 9.0)]
    assert not rolling.report(clean, ended, stuck, instances=2, load_s=1.0, records="", cpu=CPU)["ok"]
    assert not rolling.report(clean, ended, STEPS[:1], instances=2, load_s=1.0, records="", cpu=CPU)["ok"]


async def test_a_replacement_is_back_in_rotation_once_it_took_a_call_over_each_transport() -> None:
    t = tally()
    assert await rolling.back_in_rotation(t, "p1", 40.0, ["sip", "webrtc"]) == 10.0
    assert await rolling.back_in_rotation(t, "p1", 40.0, ["sip"]) == 5.0
    assert await rolling.back_in_rotation(t, "p2", 90.0, ["sip", "webrtc"]) == 9.0


def test_the_callers_stop_only_after_the_load_time_and_the_last_replacement() -> None:
    assert not Schedule(until=0.0).over()
    assert Schedule(until=0.0, rolled=True).over()
    assert not Schedule(until=float("inf"), rolled=True).over()


def test_a_call_id_names_the_instance_that_holds_it() -> None:
    assert Placed("sip", "c-p2-0a1b", 0.0).instance == "p2"
    assert Placed("sip", "", 0.0).instance == ""


def test_the_machine_is_named_by_its_cpu_cores_and_the_features_the_engines_use(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    block = (
        "processor\t: {n}\nmodel name\t: AMD EPYC 7B13\n"
        "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw\n\n"
    )
    cpuinfo.write_text(block.format(n=0) + block.format(n=1))
    found = rolling.machine(cpuinfo)
    assert found["cpu"] == "AMD EPYC 7B13"
    assert found["features"] == ["avx", "avx2", "fma", "avx512bw", "avx512f"]
    assert found["cores"] >= 1
    assert rolling.machine(tmp_path / "missing")["features"] == []


def test_kamailio_s_config_listens_on_the_loopback_port_and_dispatches_to_every_instance() -> None:
    deployed = fleet.deployed(fleet.KAMAILIO_CFG)
    rendered = fleet.kamailio_config(deployed, 15060)
    assert "listen=udp:127.0.0.1:15060\n" in rendered and "listen=tcp:127.0.0.1:15060\n" in rendered
    assert "0.0.0.0:5060" not in rendered
    assert rendered.replace("127.0.0.1:15060", "0.0.0.0:5060") == deployed  # nothing else changed
    assert fleet.dispatcher_list([5071, 5072, 5073]) == (
        "1 sip:127.0.0.1:5071 0 0\n1 sip:127.0.0.1:5072 0 0\n1 sip:127.0.0.1:5073 0 0\n"
    )
    with pytest.raises(fleet.FleetError, match="no longer listens"):
        fleet.kamailio_config(deployed.replace("listen=tcp:0.0.0.0:5060", "listen=tcp:0.0.0.0:5080"), 1)


def test_haproxy_s_config_names_as_many_instances_as_the_fleet_has_each_routed_by_its_tag(
    tmp_path: Path,
) -> None:
    deployed = fleet.deployed(fleet.HAPROXY_CFG)
    rendered = fleet.haproxy_config(deployed, 18080, [8091, 8092, 8093])
    assert "bind 127.0.0.1:18080" in rendered and "0.0.0.0" not in rendered
    assert "10.0.0." not in rendered
    for n, port in ((1, 8091), (2, 8092), (3, 8093)):
        assert rendered.count(f"server p{n} 127.0.0.1:{port} check inter 2s fall 2 rise 2") == 2
        assert f"use-server p{n} if {{ path_reg ^/(whip|api/calls)/c-p{n}- }}" in rendered
    # Two instances: the deployed file, but for the addresses.
    two = fleet.haproxy_config(deployed, 8080, [8091, 8092])
    assert (
        two.replace("127.0.0.1:8091", "10.0.0.5:8080")
        .replace("127.0.0.1:8092", "10.0.0.6:8080")
        .replace("bind 127.0.0.1:8080", "bind 0.0.0.0:8080")
        == deployed
    )
    with pytest.raises(fleet.FleetError, match="no longer names"):
        fleet.haproxy_config(deployed.replace("server p2", "server second"), 1, [1, 2])
    haproxy = system_program("haproxy")
    if haproxy is not None:
        config = tmp_path / "haproxy.cfg"
        config.write_text(rendered)
        checked = subprocess.run(
            [haproxy, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_missing_deploy_folder_or_program_is_said_plainly(tmp_path: Path) -> None:
    with pytest.raises(fleet.FleetError, match="source checkout"):
        fleet.check_prerequisites(tmp_path)
    with pytest.raises(fleet.FleetError, match=r"install-system-packages\.sh"):
        fleet.binary("parley-no-such-program")


def test_instances_are_tagged_as_haproxy_routes_them() -> None:
    assert [fleet.instance_tag(i) for i in range(3)] == ["p1", "p2", "p3"]


async def test_without_kamailio_the_bench_says_so_before_it_starts_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("parley.bench.daemon.shutil.which", lambda name, path=None: None)
    logs = tmp_path / "logs"
    with pytest.raises(SystemExit, match=r"kamailio not found: scripts/install-system-packages\.sh"):
        await rolling.run(parse(f"--logs={logs}"))
    assert [p.name for p in logs.iterdir()] == []  # no config written, no instance started
