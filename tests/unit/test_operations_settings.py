"""The operations settings: on/off flags, where records go, and what is refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from parley.config import Settings, SettingsError, default_data_dir
from parley.settings_sources import add_arguments, load_settings


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(flags))


def test_on_off_settings_take_a_bare_flag_a_word_or_the_environment() -> None:
    settings = load_settings(parse("--log-transcripts", "--record-transcripts", "off"), {})
    assert settings.log_transcripts is True and settings.record_transcripts is False
    from_env = load_settings(None, {"PARLEY_LOG_TRANSCRIPTS": "yes", "PARLEY_RECORD_TRANSCRIPTS": "0"})
    assert from_env.log_transcripts is True and from_env.record_transcripts is False
    with pytest.raises(SettingsError):
        load_settings(None, {"PARLEY_RECORD_TRANSCRIPTS": "perhaps"})


def test_records_go_to_the_data_dir_unless_a_database_is_named(tmp_path: Path) -> None:
    assert Settings(data_dir=str(tmp_path)).resolved_data_dir() == tmp_path
    assert Settings().resolved_data_dir() == default_data_dir()
    assert default_data_dir().name == "parley"
    url = "postgresql://parley@db.internal/parley"
    assert load_settings(None, {"PARLEY_DATABASE": url}).database == url
    assert load_settings(None, {"PARLEY_DATABASE": "off"}).database == "off"
    with pytest.raises(SettingsError):
        load_settings(None, {"PARLEY_DATABASE": "mysql://nope"})
    with pytest.raises(SettingsError):
        load_settings(None, {"PARLEY_RETENTION_DAYS": "-1"})
    assert load_settings(parse("--log-format", "json"), {}).log_format == "json"
