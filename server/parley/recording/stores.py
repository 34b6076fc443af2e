"""Where recordings are kept: a folder, or a bucket of S3-compatible storage (AWS S3, MinIO, Ceph, ...).

A store names a recording's place before it is written (`location`: what the call's record says), says
where the writer writes the file first (`spool_path`), keeps a finished file (`save`, blocking: the
store's own thread calls it) and deletes what is older than the retention (`purge`).

Recordings are what callers said: the folder's files are readable by their owner only (0600 in 0700
folders), and objects go to the bucket without an ACL of their own (private unless its policy says
otherwise). S3 credentials come from the standard AWS environment variables or files, never from flags.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Protocol

PART_SUFFIX = ".part"  # a file being written; left behind only by a process that died writing it
S3_DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes


class RecordingStore(Protocol):
    def location(self, key: str) -> str: ...

    def spool_path(self, key: str) -> Path: ...

    def save(self, spool: Path, key: str, content_type: str) -> None: ...

    def purge(self, before: float) -> int: ...


class FolderStore:
    """Recordings as files under `root`, by the key's path (`YYYY/MM/DD/<call id>.ogg`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def location(self, key: str) -> str:
        return str(self.root / key)

    def spool_path(self, key: str) -> Path:
        # In the folder it ends in: the finished file is renamed into place, never copied.
        return self.root / (key + PART_SUFFIX)

    def save(self, spool: Path, key: str, content_type: str) -> None:
        os.replace(spool, self.root / key)

    def purge(self, before: float) -> int:
        """Delete the files last written before `before` (time.time()), and the folders they leave empty."""
        deleted = 0
        if not self.root.is_dir():
            return 0
        for folder, _, files in os.walk(self.root, topdown=False):
            for name in files:
                path = Path(folder) / name
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime < before:
                        path.unlink()
                        deleted += 1
            if Path(folder) != self.root:
                with contextlib.suppress(OSError):
                    Path(folder).rmdir()  # only when empty
        return deleted


class S3Store:
    """Recordings as objects `<prefix><key>` in `bucket`; written first to `spool` on local disk."""

    def __init__(self, bucket: str, prefix: str, endpoint: str, spool: Path) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        self.spool = spool
        self._client: Any = None

    def location(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def spool_path(self, key: str) -> Path:
        return self.spool / (key.replace("/", "-") + PART_SUFFIX)

    def save(self, spool: Path, key: str, content_type: str) -> None:
        try:
            self.client().upload_file(
                str(spool), self.bucket, self.prefix + key, ExtraArgs={"ContentType": content_type}
            )
        finally:
            spool.unlink(missing_ok=True)

    def purge(self, before: float) -> int:
        """Delete the objects under the prefix last modified before `before` (time.time())."""
        client = self.client()
        old: list[dict[str, str]] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            old += [
                {"Key": item["Key"]}
                for item in page.get("Contents", [])
                if item["LastModified"].timestamp() < before
            ]
        for start in range(0, len(old), S3_DELETE_BATCH):
            batch = old[start : start + S3_DELETE_BATCH]
            client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        self._purge_spool(before)
        return len(old)

    def _purge_spool(self, before: float) -> None:
        """Spooled files a process that died left behind."""
        if self.spool.is_dir():
            for path in self.spool.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime < before:
                        path.unlink()

    def client(self) -> Any:
        """The S3 client, made on first use (on the store's thread: making one reads files)."""
        if self._client is None:
            import boto3  # a second to import: only where recordings go to S3
            from botocore.config import Config

            config = Config(
                connect_timeout=5,
                read_timeout=30,
                retries={"max_attempts": 3, "mode": "standard"},
            )
            self._client = boto3.client("s3", endpoint_url=self.endpoint or None, config=config)
        return self._client


def private_folder(folder: Path) -> None:
    """Make `folder` and the folders above it that are missing, each readable by its owner only (0700:
    `mkdir -p` would give the upper ones the umask's mode)."""
    missing: list[Path] = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)


def utc_day_path(at: float) -> str:
    """`YYYY/MM/DD` of a time.time(), in UTC: recordings are filed by the day their call began."""
    return time.strftime("%Y/%m/%d", time.gmtime(at))
