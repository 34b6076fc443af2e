"""The dial-out destination policy: which trunks, which numbers, how many an hour, and which trunk may
see the outbound credentials."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from parley.config import SettingsError
from parley.settings_sources import add_arguments, load_settings
from parley.transports.sip.dial_policy import DialPolicy, DialRefused, Trunk, Withheld, dial_policy
from parley.transports.sip.digest import ClientCredentials
from parley.transports.sip.uri import SipUri


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def uri(text: str) -> SipUri:
    return SipUri.parse(text)


def reason(policy: DialPolicy, destination: str) -> str | None:
    try:
        policy.admit(uri(destination))
    except DialRefused as exc:
        return exc.reason
    return None


@pytest.mark.parametrize(
    ("trunks", "destination", "admitted"),
    [
        (("sip.carrier.example",), "sip:+1555@SIP.Carrier.Example.", True),  # names: no case, no root dot
        (("sip.carrier.example",), "sip:+1555@sip.carrier.example:5080", True),  # no port named: any
        (("sip.carrier.example:5060",), "sip:+1555@sip.carrier.example", True),  # 5060 by default
        (("sip.carrier.example:5060",), "sip:+1555@sip.carrier.example:5080", False),
        (("sip.carrier.example:5061",), "sips:+1555@sip.carrier.example", True),  # 5061 for sips
        (("sip.carrier.example",), "sip:+1555@evil.example", False),
        (("sip.carrier.example",), "sip:+1555@sip.carrier.example.evil.example", False),
        (("192.0.2.10",), "sip:+1555@192.0.2.10", True),
        (("192.0.2.10",), "sip:+1555@192.0.2.1", False),
        (("sip.carrier.example",), "sip:+1555@192.0.2.10", False),  # never resolved to compare
        (("2001:db8::10",), "sip:+1555@[2001:db8:0::10]:5060", True),  # one spelling of an address
        (("[2001:db8::10]:5070",), "sip:+1555@[2001:db8::10]", False),
    ],
)
def test_a_destination_must_name_a_listed_trunk(
    trunks: tuple[str, ...], destination: str, admitted: bool
) -> None:
    assert reason(DialPolicy(trunks), destination) == (None if admitted else "host")


def test_with_no_trunks_every_destination_is_refused_saying_how_to_turn_it_on() -> None:
    with pytest.raises(DialRefused, match="dial-out is off: name the trunks it may use with --dial-trunks"):
        DialPolicy(()).admit(uri("sip:+1555@192.0.2.10"))


@pytest.mark.parametrize(
    ("number", "admitted"),
    [
        ("+15550100", True),
        ("+1-555-0100", True),  # RFC 3966 visual separators
        ("+1(555)0100", True),
        ("+4420794600", True),
        ("+33142", False),
        ("0044207946", False),  # international by another prefix
        ("%2B44207", False),  # an escape a trunk would decode
        ("+1555;phone-context=x", False),
        ("alice", False),
    ],
)
def test_a_number_must_fall_under_a_listed_prefix(number: str, admitted: bool) -> None:
    policy = DialPolicy(("192.0.2.10",), ("+1", "+44"))
    assert reason(policy, f"sip:{number}@192.0.2.10") == (None if admitted else "prefix")


def test_without_prefixes_any_user_part_is_dialled() -> None:
    assert reason(DialPolicy(("192.0.2.10",)), "sip:alice@192.0.2.10") is None
    assert reason(DialPolicy(("192.0.2.10",)), "sip:192.0.2.10") is None


def test_the_hourly_budget_slides_and_only_admitted_dials_spend_it() -> None:
    clock = Clock()
    policy = DialPolicy(("192.0.2.10",), ("+1",), 2, clock=clock)
    assert reason(policy, "sip:+44@192.0.2.10") == "prefix"  # refused: spends nothing
    assert reason(policy, "sip:+1555@192.0.2.10") is None
    clock.now += 600
    assert reason(policy, "sip:+1555@192.0.2.10") is None
    with pytest.raises(DialRefused) as refused:
        policy.admit(uri("sip:+1555@192.0.2.10"))
    assert refused.value.reason == "rate" and refused.value.retry_after_s == 3000
    assert "--dial-max-per-hour" in str(refused.value)
    clock.now += 3000  # the first left the window
    assert reason(policy, "sip:+1555@192.0.2.10") is None
    assert reason(policy, "sip:+1555@192.0.2.10") == "rate"
    assert reason(DialPolicy(("192.0.2.10",), (), 0, clock=clock), "sip:+1555@192.0.2.10") is None


def test_the_credentials_are_given_only_for_their_trunk() -> None:
    credentials = ClientCredentials("user", "secret", "carrier.example")
    policy = DialPolicy(("192.0.2.10", "192.0.2.20"), credentials=credentials, credentials_trunk="192.0.2.10")
    assert policy.credentials_for(uri("sip:+1555@192.0.2.10")) is credentials
    with pytest.raises(Withheld, match="not the trunk the outbound credentials belong to"):
        policy.credentials_for(uri("sip:+1555@192.0.2.20"))
    unpinned = DialPolicy(("192.0.2.10", "192.0.2.20"), credentials=credentials)
    assert unpinned.credentials_for(uri("sip:+1555@192.0.2.20")) is credentials
    with pytest.raises(Withheld, match="no outbound credentials"):
        DialPolicy(("192.0.2.10",)).credentials_for(uri("sip:+1555@192.0.2.10"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dial_trunks": ("bad host!",)}, "is not a host or host:port"),
        ({"dial_trunks": ("192.0.2.10:99999",)}, "is not a host or host:port"),
        ({"dial_prefixes": ("+1x",)}, "is not a number prefix"),
        ({"dial_max_per_hour": -1}, "dial_max_per_hour must be 0"),
        ({"sip_outbound_user": "u"}, "sip_outbound_user needs a password"),
        (
            {"dial_trunks": ("192.0.2.10",), "sip_outbound_user": "u", "sip_outbound_password": "p",
             "sip_outbound_trunk": "192.0.2.20"},
            "must be one of dial_trunks",
        ),
    ],
)  # fmt: skip
def test_bad_policy_settings_stop_the_start_saying_why(settings: dict[str, object], message: str) -> None:
    values: dict[str, object] = {
        "dial_trunks": (),
        "dial_prefixes": (),
        "dial_max_per_hour": 60,
        "sip_outbound_user": "",
        "sip_outbound_password": "",
        "sip_outbound_realm": "",
        "sip_outbound_trunk": "",
        **settings,
    }
    with pytest.raises(SettingsError, match=message):
        dial_policy(argparse.Namespace(**values))


def test_trunks_print_as_they_are_matched() -> None:
    assert [str(Trunk.parse(t)) for t in ("Sip.Example.", "2001:db8::1", "[2001:db8::1]:5070")] == [
        "sip.example",
        "[2001:db8::1]",
        "[2001:db8::1]:5070",
    ]


def test_the_outbound_password_is_a_secret_from_the_environment_or_a_file(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--sip-outbound-password", "secret"])  # never on the command line
    secret = tmp_path / "password"
    secret.write_text("from a file\n")
    args = parser.parse_args(["--sip-outbound-password-file", str(secret)])
    assert load_settings(args, environ={}).sip_outbound_password == "from a file"
    environ = {"PARLEY_SIP_OUTBOUND_PASSWORD": "from the environment"}
    assert load_settings(None, environ=environ).sip_outbound_password == "from the environment"
