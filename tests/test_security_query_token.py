"""A query token is revocable (issue 51): after ``JobHandle.revoke_query_token()`` the query
directory and every task's query server refuse the old token — new connections fail the
handshake, connections made with it before are dropped — and the new token reads.

Oracles: the handshake's outcome (refused / accepted) and the values read, compared with
what the job's input makes them (a count per key that only grows, plain Python). Each test
failed with ``rekey`` not replacing the servers' key (the old token still read).
"""
from __future__ import annotations

import pickle
import time

import pytest

import epochal as ep
from epochal.query import QueryClient, QueryError
from epochal.query.protocol import query_key
from epochal.query.readers import ValueReader
from epochal.query.server import QueryServer
from epochal.query.versions import CommittedVersions
from epochal.runtime.driver.query_directory import QueryDirectory
from epochal.runtime.transport import wire

OLD, NEW = "old-token", "new-token"


def _live(name, items):
    return pickle.dumps([{"a": 1}.get(key) for _kg, key in items])


def test_rekeyed_directory_and_query_server_refuse_the_old_token():
    server = QueryServer(query_key(OLD), "127.0.0.1", "t", range(0, 4), {"op/v": ValueReader("op/v")},
                         CommittedVersions(), _live)
    routes = {"generation": 0, "max_parallelism": 4, "expected": {"op": 1},
              "operators": {"op": [("t", 0, 4, ("127.0.0.1", server.address[1]))]}}
    directory = QueryDirectory(query_key(OLD), "127.0.0.1", lambda: routes)
    try:
        before = QueryClient(directory.address, OLD, timeout=5)
        assert before.query("op", "v", ["a"], isolation="read-uncommitted").values == {"a": 1}
        held = [wire.connect(a, query_key(OLD), {"query": "x"}) for a in (directory.address, server.address)]
        directory.rekey(query_key(NEW))  # what revoke_query_token does to each endpoint
        server.rekey(query_key(NEW))
        for address in (directory.address, server.address):
            with pytest.raises(wire.AuthenticationError):
                wire.connect(address, query_key(OLD), {"query": "x"})
        for conn in held:  # opened with the old token: dropped
            conn.sock.settimeout(5)
            with pytest.raises((wire.ConnectionClosed, OSError)):
                conn.recv_bytes()
        with pytest.raises(QueryError, match="refused the token"):
            before.query("op", "v", ["a"], isolation="read-uncommitted", timeout=3)
        with QueryClient(directory.address, NEW, timeout=5) as after:
            assert after.query("op", "v", ["a"], isolation="read-uncommitted").values == {"a": 1}
        before.close()
    finally:
        directory.close()
        server.close()


def _words(split: int, offset: int):
    i = offset
    while True:
        yield f"w{i % 3}"
        i += 1


def _count(result) -> int:
    value = result.values["w0"]
    return 0 if value is None else value[1]


def test_a_revoked_token_is_refused_by_a_running_jobs_directory_and_tasks(tmp_path):
    flow = ep.Dataflow("revoke")
    (flow.source("words", ep.sources.GeneratorSource(_words, num_splits=2, records_per_second=200), parallelism=2)
         .map("one", lambda w: (w, 1)).key_by(lambda r: r[0])
         .reduce("count", lambda a, b: (a[0], a[1] + b[1]), queryable=True)
         .sink("out", ep.sinks.FileSink(str(tmp_path / "out"))))
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/ck"))
    try:
        old = handle.query_token
        first = _count(handle.query("count", "acc", ["w0"], isolation="read-uncommitted", timeout=60))
        routes = handle._driver._query_routes()
        tasks = {tuple(e[3]) for entries in routes["operators"].values() for e in entries}
        assert tasks, routes
        new = handle.revoke_query_token()
        assert new != old
        with pytest.raises(QueryError, match="refused the token"):
            QueryClient(handle.query_address, old, timeout=3).query("count", "acc", ["w0"])
        deadline = time.monotonic() + 30  # the tasks learn the new key through the coordinator
        for address in tasks:
            while True:
                try:
                    wire.connect(address, query_key(old), {"query": "x"}, timeout=2).close()
                except wire.AuthenticationError:
                    break
                assert time.monotonic() < deadline, f"task query server {address} still takes the revoked token"
                time.sleep(0.05)
        with QueryClient(handle.query_address, new, timeout=30) as client:
            later = _count(client.query("count", "acc", ["w0"], isolation="read-uncommitted"))
        assert later >= first  # a count only grows
        assert _count(handle.query("count", "acc", ["w0"], isolation="read-uncommitted")) >= later
    finally:
        handle.cancel()
        try:
            handle.wait(60)
        except Exception:
            pass
