"""The default suite's slice of the randomized campaign (tests/campaign.py; the whole
campaign is ``benchmarks/campaign.py``): a handful of seeded histories on the local runtime —
kills from outside (one during a recovery), stop and restore with a rescale, a rollback to
an older savepoint, a driver that went away (cancel, resume), a guarantee switch — each
checked against the plain-Python model, each action asserted to have landed mid-run.

A seed that fails in the campaign is added here once its defect is fixed."""
from __future__ import annotations

import pytest

import campaign

pytest_plugins = ["postgres_server"]

#: (topology, seed) → what its history does (campaign.draw(seed, topologies=(topology,)).describe())
SLICE = {
    ("count", 29): "file, exactly-once: rollback to an older savepoint at another parallelism, then stop-restore at p3",
    ("count", 26): "transactional log, exactly-once: a kill during a recovery, a guarantee switch, cancel and resume",
    ("count", 28): "file, exactly-once: a kill during a recovery, two guarantee switches with rescales",
    ("count", 13): "postgres, exactly-once: two kills during recoveries",
    ("windows", 1): "event-time windows into the transactional log, exactly-once: a kill, then cancel and resume twice",
}


@pytest.mark.parametrize("topology,seed", sorted(SLICE), ids=[f"{t}-seed{s}" for t, s in sorted(SLICE)])
def test_campaign_history(topology, seed, request, tmp_path):
    history = campaign.draw_v1(seed, topology)
    services = {}
    if history.sink == "postgres":
        services["postgres"] = request.getfixturevalue("postgres")
    report = campaign.run(history, services, str(tmp_path))
    assert report.outcome == "ok", f"{report.history}: {report.outcome}: {report.detail}"
    assert report.landed and all(report.landed), f"{report.history}: not every action landed mid-run"
