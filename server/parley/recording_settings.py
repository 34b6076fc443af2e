"""The recording settings: whether calls are recorded, in which format, where the recordings go and how
long they stay. A group of `Settings` (config.py), which inherits it; recording/ reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from parley.settings_option import opt as _opt

RECORD_AUDIO = ("off", "wav", "ogg")
# An S3 bucket name (3-63 lower-case letters, digits, dots, hyphens), then an optional key prefix.
_S3_URL = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?")


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix), the prefix ending in "/" unless empty; ValueError if it
    is not one."""
    match = _S3_URL.fullmatch(url)
    if match is None:
        raise ValueError(f"recordings_s3_url must be s3://BUCKET or s3://BUCKET/PREFIX, not {url!r}")
    prefix = (match.group(2) or "").strip("/")
    return match.group(1), f"{prefix}/" if prefix else ""


@dataclass(frozen=True)
class RecordingSettings:
    """Call recordings."""

    record_audio: str = field(
        default="off",
        metadata=_opt(
            "record each call in two channels, the caller left and the agent right as the caller heard it: "
            "off, wav, or ogg (Opus); an agent file's record_audio turns it on or off for its calls",
            "operations",
            choices=RECORD_AUDIO,
        ),
    )
    recordings_dir: str = field(
        default="",
        metadata=_opt("folder for call recordings (default: recordings/ in --data-dir)", "operations"),
    )
    recordings_s3_url: str = field(
        default="",
        metadata=_opt(
            "keep call recordings in S3-compatible storage instead of the folder: s3://bucket/prefix "
            "(credentials from the standard AWS environment variables or files)",
            "operations",
        ),
    )
    recordings_s3_endpoint: str = field(
        default="",
        metadata=_opt("the S3 API's URL for storage other than AWS (MinIO, Ceph, ...)", "operations"),
    )
    recordings_retention_days: float = field(
        default=0.0,
        metadata=_opt("call recordings older than this are deleted (0: kept forever)", "operations"),
    )

    def resolved_recordings_dir(self, data_dir: Path) -> Path:
        return Path(self.recordings_dir).expanduser() if self.recordings_dir else data_dir / "recordings"

    def recording_problem(self) -> str | None:
        """What is wrong with these settings, or None."""
        if self.record_audio not in RECORD_AUDIO:
            return f"record_audio must be one of {', '.join(RECORD_AUDIO)}, not {self.record_audio!r}"
        if self.recordings_s3_url:
            try:
                parse_s3_url(self.recordings_s3_url)
            except ValueError as exc:
                return str(exc)
        if self.recordings_s3_endpoint:
            if not self.recordings_s3_url:
                return "recordings_s3_endpoint needs recordings_s3_url (s3://bucket/prefix)"
            if not re.fullmatch(r"https?://[^\s/@]+(/\S*)?", self.recordings_s3_endpoint):
                return (
                    f"recordings_s3_endpoint must be http(s)://HOST..., not {self.recordings_s3_endpoint!r}"
                )
        if self.recordings_retention_days < 0:
            return "recordings_retention_days must be 0 (keep forever) or more"
        return None
