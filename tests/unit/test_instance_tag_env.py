"""The instance tag from the environment: a Kubernetes pod's name (PARLEY_INSTANCE_TAG from the downward
API's metadata.name, as deploy/k8s sets it) is taken as the tag unchanged and names the pod in every call
id it makes; what is not a DNS label is refused before the service starts."""

from __future__ import annotations

import argparse

import pytest

from parley.config import SettingsError
from parley.registry import CallRegistry
from parley.settings_sources import add_arguments, load_settings


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("pod", ["parley-0", "parley-12", "parley-gpu-3", "p1", "a" * 63])
def test_a_pod_s_name_in_the_environment_is_its_tag_and_names_it_in_its_call_ids(pod: str) -> None:
    settings = load_settings(parse(), environ={"PARLEY_INSTANCE_TAG": pod})
    assert settings.instance_tag == pod
    call_id = CallRegistry(settings.max_calls, settings.instance_tag).new_call_id()
    assert call_id.startswith(f"c-{pod}-")
    # What a proxy reads back: the tag lies between "c-" and the last hyphen.
    assert call_id.removeprefix("c-").rsplit("-", 1)[0] == pod


def test_the_flag_wins_over_the_environment() -> None:
    settings = load_settings(parse("--instance-tag", "edge-1"), environ={"PARLEY_INSTANCE_TAG": "parley-0"})
    assert settings.instance_tag == "edge-1"


def test_no_tag_leaves_call_ids_untagged() -> None:
    settings = load_settings(parse(), environ={})
    assert settings.instance_tag == ""
    call_id = CallRegistry(settings.max_calls, settings.instance_tag).new_call_id()
    assert call_id.count("-") == 1


@pytest.mark.parametrize(
    "tag",
    [
        "Parley-0",  # DNS names are lowercase; a proxy would not find it
        "-parley",
        "parley-",  # the id would read c-parley--..., its tag unreadable
        "parley.0",  # a dot would let a call id name a host outside the headless Service
        "parley_0",
        "a" * 64,  # longer than a DNS label
    ],
)
def test_a_tag_that_is_not_a_dns_label_is_refused(tag: str) -> None:
    with pytest.raises(SettingsError, match="instance_tag"):
        load_settings(parse(), environ={"PARLEY_INSTANCE_TAG": tag})
