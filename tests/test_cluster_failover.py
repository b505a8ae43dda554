"""Failover regions on a real two-host Spark standalone cluster (the cluster of
``standalone.py``; issue 30): four forward-only pipelines (``test_failover.pipelines``), one
task process on worker host 0 SIGKILLed from outside after the first checkpoint. Only that
pipeline restarts (one failover region, the job's other tasks keep running on both hosts)
and the committed output on S3 equals the plain-Python oracle."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pipelines import canon, read_committed
from test_cluster import _drive, _finish, _kill_after_first_checkpoint, _tail
from test_failover import SPLITS, oracle

pytest_plugins = ["standalone"]
pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # opt-in: -m cluster (a job of ~1 min on the cluster)


def test_a_sigkilled_pipeline_restarts_alone_on_a_cluster(s3, tmp_path):
    cluster, n = s3, 6000
    proc, result, log, storage, out = _drive(cluster, tmp_path, ["pipelines"], "--lines", str(n), "--rate", "1000",
                                             "--interval", "0.2", name="failover")
    killed, stop = [], threading.Event()

    def pick():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            tasks = cluster.host(0).task_processes()
            if tasks:
                pid, task = sorted(tasks.items())[0]
                os.kill(pid, signal.SIGKILL)
                return task
            time.sleep(0.05)
        return None

    watcher = threading.Thread(target=_kill_after_first_checkpoint,
                               args=(cluster, storage, ["pipelines"], pick, killed, stop), daemon=True)
    watcher.start()
    try:
        [entry] = _finish(proc, result, log, timeout=300)
    finally:
        stop.set()
    assert entry["ok"], f"failed: {entry.get('error')}\n{_tail(log)}"
    assert killed and killed[0][1], f"the SIGKILL did not fire: {killed}"
    task = killed[0][1]
    assert len(set(entry["hosts"].values())) == 2, f"the pipelines did not run on both hosts: {entry['hosts']}"
    assert [f["tasks"] for f in entry["failovers"]] == [[task]], (task, entry["failovers"], entry["failures"])
    assert entry["attempts"] == 2
    want = canon(r for r, c in oracle(n).items() for _ in range(c))
    got = canon(read_committed(f"{out}/{entry['job']}"))
    assert got == want, f"{sum((got - want).values())} extra, {sum((want - got).values())} missing"
    assert len(entry["hosts"]) == SPLITS
