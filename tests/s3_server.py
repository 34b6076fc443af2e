"""A real S3 API for the recordings' tests: moto's server, in this process, on a free loopback port."""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

BUCKET = "recordings"


def aws_test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and a region for boto3, and none of the machine's own AWS files."""
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_CONFIG_FILE", "/nonexistent"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
    ):
        monkeypatch.setenv(name, value)


@contextlib.contextmanager
def moto_s3() -> Iterator[tuple[str, Any]]:
    """moto's S3 server, a bucket `recordings` in it, and a client to read it with: (endpoint, client).
    Call `aws_test_credentials` first."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        # moto keeps its buckets in the process, across servers: each test starts from none.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).close()
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        yield endpoint, client
    finally:
        server.stop()
