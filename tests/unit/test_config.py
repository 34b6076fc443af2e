"""Settings: flags win over the environment, which wins over the config file; bad values are refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from parley.config import Settings, SettingsError
from parley.settings_sources import add_arguments, load_settings


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_the_real_offline_models() -> None:
    settings = load_settings(parse(), environ={})
    assert (settings.stt_model, settings.llm_model, settings.tts_voice) == ("base", "auto", "joe")
    # auto: the packaged model that answers soonest, or for agents with tools the one that calls them
    assert (settings.local_llm(), settings.local_llm(tools=True)) == ("qwen2.5-0.5b", "qwen2.5-coder-1.5b")
    assert settings.port == 8080 and settings.host == "127.0.0.1"


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    config = tmp_path / "parley.toml"
    config.write_text('port = 7000\ngreeting = "From the file"\nmax-calls = 3\n')
    environ = {"PARLEY_PORT": "7100", "PARLEY_ICE_ADDRESSES": "127.0.0.1, 10.0.0.2"}
    settings = load_settings(parse("--config", str(config), "--port", "7200"), environ=environ)
    assert settings.port == 7200
    assert settings.greeting == "From the file" and settings.max_calls == 3
    assert settings.ice_addresses == ("127.0.0.1", "10.0.0.2")


def test_parley_cache_names_the_cache_folder(tmp_path: Path) -> None:
    settings = load_settings(parse(), environ={"PARLEY_CACHE": str(tmp_path)})
    assert settings.resolved_cache_dir() == tmp_path
    assert Settings().resolved_cache_dir().name == "parley"


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (("--port", "notaport"), {}, "port"),
        (("--port", "70000"), {}, "out of range"),
        ((), {"PARLEY_MAX_CALLS": "0"}, "max_calls"),
        ((), {"PARLEY_VAD_THRESHOLD": "1.5"}, "vad_threshold"),
        (("--reopen-unheard-ms", "-1"), {}, "reopen_unheard_ms"),
        ((), {"PARLEY_REOPEN_GRACE_MS": "-5"}, "reopen_grace_ms"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(
    argv: tuple[str, ...], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(parse(*argv), environ=environ)


def test_a_config_file_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "parley.json"
    config.write_text('{"colour": "blue"}')
    with pytest.raises(SettingsError, match="colour"):
        load_settings(parse("--config", str(config)), environ={})
