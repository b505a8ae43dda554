"""A RocksDB task answers read-committed lookups in-process until its query sidecar is
ready, then hands over (:mod:`epochal.query.handover`): the handover's own pieces — a
RocksDB backend, the task's registration callback, lookups over the wire — without a job.

* a lookup issued before the sidecar may take over is answered by the in-process server;
* once started, the sidecar is registered (a new port, served by another process), the
  in-process server closes, and the sidecar answers every version the task pinned, before
  and after the handover; a :class:`~epochal.query.QueryClient` that was routed to the
  in-process server follows the new route (through a query directory);
* closing stops the child and releases every pinned checkpoint.
"""
from __future__ import annotations

import pickle
import threading
import time

import pytest

from epochal.backends.keygroups import key_group_for
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.query import QueryClient
from epochal.query.handover import SidecarHandover
from epochal.query.protocol import query_key
from epochal.query.readers import ValueReader
from epochal.query.versions import PinnedVersion
from epochal.runtime.driver.query_directory import QueryDirectory
from epochal.runtime.transport import tagged_json, wire

TOKEN = "handover-test"
KEY = query_key(TOKEN)
KG = key_group_for("a", 4)  # of the key looked up (max parallelism 4, one task owning 0..3)


def lookup(port: int, key: str, kg: int = KG):
    """``(epoch, held, value)`` of one read-committed lookup of ``op/v`` at ``port``."""
    conn = wire.connect(("127.0.0.1", port), KEY, {"query": "t"}, timeout=10.0)
    try:
        conn.send_bytes(tagged_json.dumps(("get", 7, "op", "v", [(kg, key)], "read-committed", None)))
        reply = tagged_json.loads(conn.recv_bytes())  # data only, as the protocol speaks
    finally:
        conn.close()
    assert reply[0] == "ok" and reply[1] == 7, reply
    return reply[2], reply[3], reply[4][0]


def pin(backend) -> PinnedVersion:
    return PinnedVersion(backend.pin_view(["op/v"], whole_maps=True), {})


def test_lookups_are_answered_in_process_then_by_the_sidecar(tmp_path):
    backend = RocksDBStateBackend(range(0, 4), path=str(tmp_path))
    registered: list[int] = []
    handover = directory = client = None

    def routes():  # the coordinator's: the newest registration (the in-process port before start())
        port = registered[-1] if registered else handover.address[1]
        return {"generation": 0, "max_parallelism": 4, "expected": {"op": 1},
                "operators": {"op": [("t", 0, 4, ("127.0.0.1", port))]}}
    try:
        backend.put("op/v", KG, "a", 10)
        config = dict(key=KEY, host="127.0.0.1", task="t", key_groups=range(0, 4),
                      registry={"op/v": ValueReader("op/v")}, committed_refused=None,
                      peer_timeout=None, tls=None)
        handover = SidecarHandover(config, lambda name, items: pickle.dumps([None]), registered.append)
        handover.versions.restored(1, pin(backend))  # as a task right after its restore
        local = handover.address[1]
        # the sidecar cannot take over before start(): this lookup is the in-process server's
        assert lookup(local, "a") == (1, [1], 10)
        assert handover.answered == 1 and not handover.handed_over.is_set()
        backend.put("op/v", KG, "a", 11)
        handover.versions.pinned(2, pin(backend))
        handover.versions.completed(2)
        assert lookup(local, "a") == (2, [1, 2], 11)
        directory = QueryDirectory(KEY, "127.0.0.1", routes)
        client = QueryClient(directory.address, TOKEN, timeout=30)
        got = client.query("op", "v", "a")
        assert (got.value, got.epoch) == (11, 2) and client._routes["operators"]["op"][0][3][1] == local

        handover.start()
        assert registered[0] == local  # routed in-process first
        assert handover.handed_over.wait(60), "the sidecar did not take over within 60 s"
        assert len(registered) == 2 and registered[1] != local
        sidecar = registered[1]
        with pytest.raises(OSError):  # the in-process server is closed: clients re-route
            lookup(local, "a")
        assert lookup(sidecar, "a") == (2, [1, 2], 11)  # everything pinned before the handover
        got = client.query("op", "v", "a")  # its route is the closed server's: it asks the directory again
        assert (got.value, got.epoch) == (11, 2) and client._routes["operators"]["op"][0][3][1] == sidecar
        backend.put("op/v", KG, "a", 12)
        handover.versions.pinned(3, pin(backend))
        handover.versions.completed(3)
        assert _eventually(lambda: lookup(sidecar, "a"), 3) == (3, [1, 2, 3], 12)
        assert handover.answered == 3  # the sidecar's answers are not the in-process server's
        proc = handover.sidecar.proc
        assert proc.poll() is None
    finally:
        if client is not None:
            client.close()
        if directory is not None:
            directory.close()
        if handover is not None:
            handover.close()
            handover.versions.close()
    assert proc.poll() is not None, "the sidecar outlived close()"
    assert backend.pending_snapshots == 0, "pinned checkpoints left after close()"
    backend.close()


def _eventually(ask, epoch: int, timeout: float = 30.0):
    """``ask()`` until it answers at ``epoch`` (the child takes a completion in after its
    message arrives), within ``timeout``; the last answer."""
    deadline = time.monotonic() + timeout
    answer = ask()
    while answer[0] != epoch and time.monotonic() < deadline:
        threading.Event().wait(0.02)  # a poll pause, not a synchronisation
        answer = ask()
    return answer


@pytest.mark.bench
def test_query_handover_benchmark_smoke(tmp_path):
    """benchmarks/query_handover.py --smoke runs end to end (so the script cannot rot)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "query_handover.json"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "query_handover.py"
    proc = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(out), "--tmp", str(tmp_path)],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == [] and [r["variant"] for r in doc["runs"]] == ["sidecar", "in-process"]
    assert all(r["attempts"] == 2 and r["lookups"] > 0 for r in doc["runs"])
