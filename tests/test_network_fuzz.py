"""Fuzzing every decoder a network peer reaches (issue 51), with Hypothesis, bounded:

* before authentication: the wire handshake (:func:`~epochal.runtime.transport.wire.accept_handshake`)
  fed arbitrary bytes after the server's greeting — every such peer is rejected, nothing
  hangs past the handshake timeout, and a real peer still connects afterwards;
* the dashboard's HTTP server (before its token is checked) fed arbitrary request bytes —
  every connection is answered or closed, none hangs, and the page's data is still served
  to the token and only to it;
* after authentication with the query token: the query directory and a task's query server
  fed arbitrary frames — raw bytes, pickles that would create a marker file, and arbitrary
  tagged-JSON structures — each gets an answer, the connection survives, no marker appears,
  and a proper lookup is still answered correctly at the end.

The default run is small (seconds); ``-m slow`` runs the same properties with many more examples.
"""
from __future__ import annotations

import json
import os
import pickle
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.query.protocol import CODEC, query_key
from epochal.query.readers import ValueReader
from epochal.query.server import QueryServer
from epochal.query.versions import CommittedVersions
from epochal.runtime.driver.query_directory import QueryDirectory
from epochal.runtime.transport import tagged_json, wire
from planted import Plant

KEY = query_key("fuzz")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=25)


def _frames(marker: str):
    plant = pickle.dumps(Plant(marker))
    return st.one_of(
        st.binary(max_size=300),
        st.binary(max_size=50).map(lambda b: plant + b),  # a code-running pickle, with trailing noise
        st.just(pickle.dumps(("get", 1, "op", "v", [(0, Plant(marker))], "read-committed", None))),
        _json.map(lambda v: json.dumps(v).encode()),  # any JSON: unknown tags, wrong shapes
        st.tuples(st.sampled_from(["get", "routes", "ok", "x"]), st.lists(_json, max_size=8)).map(
            lambda t: json.dumps({"$t": [t[0], *t[1]]}).encode()),  # request-shaped tuples of random fields
    )


def _run(examples: int, tmp_path):
    marker = str(tmp_path / "marker")
    live = lambda name, items: pickle.dumps([f"v-{key}" for _kg, key in items])  # noqa: E731
    server = QueryServer(KEY, "127.0.0.1", "t", range(0, 4), {"op/v": ValueReader("op/v")}, CommittedVersions(), live)
    directory = QueryDirectory(KEY, "127.0.0.1", lambda: None)
    conns = [wire.connect(tuple(a), KEY, {"query": "fuzz"}) for a in (directory.address, server.address)]
    try:
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(frame=_frames(marker), target=st.sampled_from([0, 1]))
        def after_authentication(frame, target):
            conn = conns[target]
            conn.send_bytes(frame)
            reply = CODEC.loads(conn.recv_bytes())  # an answer, data only, every time
            assert type(reply) is tuple and reply[0] in ("error", "routes", "ok", "unavailable", "moved"), reply
            assert not os.path.exists(marker), "a fuzzed frame ran code"

        after_authentication()
        conns[1].send_bytes(tagged_json.dumps(("get", 9, "op", "v", [(1, "k")], "read-uncommitted", None)))
        assert CODEC.loads(conns[1].recv_bytes()) == ("ok", 9, None, [], ["v-k"])  # still serving, correctly

        endpoint = wire.Server(KEY, lambda conn: conn.close(), name="fuzz")

        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(st.binary(max_size=200))
        def before_authentication(data):
            with socket.create_connection(endpoint.address, timeout=wire.HANDSHAKE_TIMEOUT + 5) as sock:
                sock.settimeout(wire.HANDSHAKE_TIMEOUT + 5)  # a hang fails the example, not the suite
                wire._recv_exact(sock, len(wire.MAGIC) + wire.NONCE)
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)  # nothing more: the server must give up, not wait
                while sock.recv(4096):
                    pass

        try:
            before_authentication()
            wire.connect(endpoint.address, KEY, {"query": "real"}).close()  # a real peer still gets in
            assert endpoint.rejected >= 1
        finally:
            endpoint.close()
    finally:
        for conn in conns:
            conn.close()
        directory.close()
        server.close()
    assert not os.path.exists(marker)


def _dashboard(examples: int):
    import urllib.error
    import urllib.request

    from epochal.ui.server import DashboardServer

    server = DashboardServer(lambda: {"ok": 1}, lambda stop, timeout: "nowhere", request_timeout=2.0)
    requestish = st.tuples(st.sampled_from([b"GET", b"POST", b"PUT", b"\x16\x03\x01", b""]),
                           st.sampled_from([b" /api/state", b" /api/savepoint", b" /", b" /static/../x", b""]),
                           st.binary(max_size=300)).map(b"".join)
    try:
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(requestish)
        def http(data):
            with socket.create_connection(server.address, timeout=10) as sock:
                sock.settimeout(10)  # the server's 2 s request timeout ends it well before
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)  # the end of the request: the server answers or gives up at once
                try:
                    while sock.recv(4096):
                        pass
                except ConnectionResetError:
                    pass

        http()
        url = f"{server.base_url}api/state"
        with urllib.request.urlopen(f"{url}?token={server.token}", timeout=10) as r:
            assert json.loads(r.read()) == {"ok": 1}
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"{url}?token=guess", timeout=10)
    finally:
        server.close()


def test_network_decoders_under_fuzzing(tmp_path):
    _run(150, tmp_path)
    _dashboard(60)


@pytest.mark.slow
def test_network_decoders_under_long_fuzzing(tmp_path):
    _run(5000, tmp_path)
    _dashboard(1000)
