"""A loopback S3 server that fails on purpose: storage faults for the fault tests.

Load it as a plugin (``pytest_plugins = ["s3faults"]``). The server is moto's S3 (like
``tests/s3server.py``) behind a WSGI middleware that the test steers through
:class:`Faults`; it is its own server and bucket, so no other test sees its faults:

* ``faults.fail(n, match=..., method=...)`` — the next ``n`` matching requests get
  ``500 InternalError``;
* ``faults.throttle(n, ...)`` — ``503 SlowDown`` ("Please reduce your request rate"),
  what S3 answers a client over its request rate;
* ``faults.outage(seconds)`` — every request gets ``503 ServiceUnavailable`` until then:
  the storage is down.

``match`` is a substring of the request path (e.g. ``"/_metadata"``), ``method`` an HTTP
method. ``faults.injected`` counts the error answers by kind, so a test can assert that its
fault fired (and more often than the S3 clients retry by themselves). Every process of a
job reaches the server through the environment (``faulty_s3_env``), so the faults hit the
driver and the tasks alike.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import pytest

from s3server import KEY, REGION, SECRET, S3Server, forget_cached_clients

BUCKET = "epochal-faults"

_BODY = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
         '<RequestId>epochal-faults</RequestId></Error>')


@dataclass
class _Rule:
    kind: str  # "fail" | "throttle"
    left: int
    match: str | None
    method: str | None

    def applies(self, method: str, path: str) -> bool:
        return self.left > 0 and (self.match is None or self.match in path) and \
            (self.method is None or self.method == method)


class Faults:
    """What the server does wrong next (thread-safe: the server answers on many threads)."""

    _ANSWERS = {
        "fail": ("500 Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
        "throttle": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
        "outage": ("503 Service Unavailable", "ServiceUnavailable", "Service is unable to handle request."),
    }

    def __init__(self):
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._down_until = 0.0
        self.injected: collections.Counter = collections.Counter()
        self.requests = 0

    def fail(self, n: int, match: str | None = None, method: str | None = None) -> None:
        with self._lock:
            self._rules.append(_Rule("fail", n, match, method))

    def throttle(self, n: int, match: str | None = None, method: str | None = None) -> None:
        with self._lock:
            self._rules.append(_Rule("throttle", n, match, method))

    def outage(self, seconds: float) -> None:
        with self._lock:
            self._down_until = time.monotonic() + seconds

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    @property
    def pending(self) -> int:
        """Injections the rules still hold (0 once every rule fired fully)."""
        with self._lock:
            return sum(r.left for r in self._rules)

    def reset(self) -> None:
        with self._lock:
            self._rules.clear()
            self._down_until = 0.0
            self.injected.clear()
            self.requests = 0

    def answer(self, method: str, path: str) -> str | None:
        """The kind of error to answer this request with, or None to serve it."""
        with self._lock:
            self.requests += 1
            if time.monotonic() < self._down_until:
                self.injected["outage"] += 1
                return "outage"
            for rule in self._rules:
                if rule.applies(method, path):
                    rule.left -= 1
                    self.injected[rule.kind] += 1
                    return rule.kind
        return None

    def middleware(self, app):
        def wsgi(environ, start_response):
            kind = self.answer(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
            if kind is None:
                return app(environ, start_response)
            status, code, message = self._ANSWERS[kind]
            body = _BODY.format(code=code, message=message).encode()
            start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            return [body]

        return wsgi


@dataclass(frozen=True)
class FaultyS3(S3Server):
    faults: Faults = None


@pytest.fixture(scope="session")
def faulty_s3_server():
    """moto's S3 on loopback behind :class:`Faults`; stopped at session end."""
    pytest.importorskip("s3fs", reason="s3fs is needed for s3:// checkpoint storage")
    pytest.importorskip("moto.server", reason="install the 'test' extra: moto[server]")
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    faults = Faults()
    server = make_server("127.0.0.1", 0, faults.middleware(DomainDispatcherApplication(create_backend_app)),
                         threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="faulty-s3", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        info = FaultyS3(endpoint_url=f"http://{host}:{port}", bucket=BUCKET, prefix="checkpoints", faults=faults)
        info.client().create_bucket(Bucket=BUCKET)
        yield info
    finally:
        server.shutdown()
        thread.join(10)


@pytest.fixture
def faulty_s3_env(faulty_s3_server, monkeypatch, tmp_path):
    """The faulty server, reachable through the environment alone; no faults at the start
    and none left behind."""
    for name, value in faulty_s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(name, raising=False)
    faulty_s3_server.faults.reset()
    forget_cached_clients()
    yield faulty_s3_server
    faulty_s3_server.faults.reset()
    forget_cached_clients()


__all__ = ["BUCKET", "FaultyS3", "Faults", "KEY", "REGION", "SECRET"]
