"""Queryable state on a real two-host Spark standalone cluster (issue 33; the cluster of
``standalone.py``: Master, driver and S3 in the root namespace, two Workers in two network
namespaces).

The driver process (``cluster_driver.py bank``) runs the bank of ``test_queryable_state``
— accounts with a constant total, transfers debiting one account and crediting another — on
the cluster, and meanwhile a :class:`~epochal.state.QueryClient` in that same process, on the
driver's host, built as an external client is (address, token, the job's pinned TLS), asks
every account's balance until the job ends. Its routes point at the tasks' query servers on
the worker hosts. Every read-committed answer must sum to the constant and equal the
plain-Python oracle after exactly the transfers its epoch's checkpoint (on S3) says the
sources had read; read-uncommitted answers must break the sum at least once.
"""
from __future__ import annotations

import pytest

from test_cluster import _drive, _finish, _tail
from test_queryable_state import INITIAL, N, SPLITS, TOTAL, oracle

import epochal as ep

pytest_plugins = ["standalone"]
pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # opt-in: -m cluster (a job of ~1 min on the cluster)


def test_a_client_on_the_driver_host_reads_committed_sums_of_tasks_on_the_workers(s3, tmp_path):
    cluster = s3
    proc, result, log, storage, out = _drive(cluster, tmp_path, ["bank"], "--transfers", "6000", "--rate", "1500",
                                             "--interval", "0.2", "--retained", "100000", name="query")
    [entry] = _finish(proc, result, log, timeout=300)
    assert entry["ok"], f"bank failed: {entry.get('error')}\n{_tail(log)}"
    queries = entry["queries"]
    assert queries["error"] is None, f"the client failed: {queries['error']}\n{_tail(log)}"
    workers = {h.address for h in cluster.hosts}
    assert set(entry["hosts"].values()) <= workers, entry["hosts"]
    assert queries["route_hosts"] and set(queries["route_hosts"]) <= workers, (
        f"the client's routes {queries['route_hosts']} are not the worker hosts {sorted(workers)}")
    assert cluster.driver_host not in queries["route_hosts"]
    committed = [(epoch, dict(map(tuple, values))) for epoch, values in queries["committed"]]
    epochs = sorted({e for e, _ in committed})
    assert len(epochs) >= 3, f"too few epochs read: {epochs}"
    memo: dict = {}
    expected = {}
    for epoch in epochs:
        merged = {}
        for e in ep.state.list_source_offsets(f"{storage}/{entry['job']}/chk-{epoch}"):
            merged.update(e["offsets"])
        assert set(merged) == {str(s) for s in range(SPLITS)}, merged
        expected[epoch] = oracle(merged, memo)
    for epoch, values in committed:
        assert sum(values.values()) == TOTAL, f"epoch {epoch}: read-committed sum {sum(values.values())} != {TOTAL}"
        assert values == expected[epoch], f"epoch {epoch}: read-committed answer differs from the oracle"
    uncommitted = [dict(map(tuple, values)) for values in queries["uncommitted"]]
    broke = sum(sum(v.values()) != TOTAL for v in uncommitted)
    print(f"{len(committed)} read-committed answers over {len(epochs)} epochs from {queries['route_hosts']}; "
          f"{broke} of {len(uncommitted)} read-uncommitted answers broke the sum of {N} x {INITIAL}")
    assert broke, "no read-uncommitted answer broke the sum: the test cannot tell the isolation levels apart"
