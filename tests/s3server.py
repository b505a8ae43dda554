"""A real S3-compatible server on loopback for tests: moto in server mode.

Load it as a plugin from a test module (or from the root conftest)::

    pytest_plugins = ["s3server"]

* ``s3_server`` (session): starts ``moto.server.ThreadedMotoServer`` on 127.0.0.1 with a
  free port, creates one bucket and yields an :class:`S3Server` — its ``url`` is an
  fsspec ``s3://bucket/prefix`` URL and ``storage_options`` point s3fs at the server
  explicitly.
* ``s3_env`` (per test): also sets the standard AWS variables (``AWS_ENDPOINT_URL``,
  credentials, region) so any ``CheckpointStorage(url, job)`` reaches the server without
  options — including the task processes a job forks, which inherit the environment.

Every test should write under its own prefix (:meth:`S3Server.fresh_url`): the server,
and so the bucket, lives for the whole session.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import pytest

BUCKET = "epochal-tests"
KEY = "testing"
SECRET = "testing"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """Where the moto server listens and how to reach it."""

    endpoint_url: str
    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``: the session's base URL."""
        return f"s3://{self.bucket}/{self.prefix}"

    def fresh_url(self, name: str = "t") -> str:
        """A new, empty ``s3://bucket/prefix/<name>-<random>`` for one test."""
        return f"{self.url}/{name}-{uuid.uuid4().hex[:10]}"

    @property
    def storage_options(self) -> dict:
        """s3fs arguments that reach the server without any environment variables."""
        return {"endpoint_url": self.endpoint_url, "key": KEY, "secret": SECRET,
                "client_kwargs": {"region_name": REGION}}

    def client(self):
        """A boto3 S3 client of the server: inspect what s3fs wrote, independently of it."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=KEY,
                            aws_secret_access_key=SECRET, region_name=REGION)

    def keys(self, url: str) -> list[str]:
        """Object keys under ``url`` (an ``s3://bucket/...`` URL), relative to it."""
        prefix = url.removeprefix(f"s3://{self.bucket}/")
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"][len(prefix):] for page in pages for o in page.get("Contents", [])]

    @property
    def env(self) -> dict:
        """Standard AWS variables that point botocore (and so s3fs) at the server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": REGION,
        }


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """Start moto's S3 on loopback, create the bucket; stop the server at session end."""
    pytest.importorskip("s3fs", reason="s3fs is needed for s3:// checkpoint storage")
    server_mod = pytest.importorskip("moto.server", reason="install the 'test' extra: moto[server]")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise

    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        info = S3Server(endpoint_url=f"http://{host}:{port}", bucket=BUCKET, prefix="checkpoints")
        info.client().create_bucket(Bucket=BUCKET)
        yield info
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """The server, reachable through the environment alone (for this test's duration).

    Shared AWS config files are pointed at nothing, so a developer's ``~/.aws`` profile
    cannot redirect the tests to a real account.
    """
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(name, raising=False)
    forget_cached_clients()
    yield s3_server
    forget_cached_clients()


def forget_cached_clients() -> None:
    """Drop the S3 file systems fsspec cached in this process. s3fs caches an instance per
    constructor arguments, and with none (the environment route) the next test would reuse
    a client whose endpoint came from an earlier test's environment: the driver's requests
    would go to another server. Fixtures that change the AWS environment call this before
    and after the test."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
