"""Restores are checked, not trusted (epochal.runtime.driver.compatibility).

Each case of the issue ("No silent data loss", item 1) is reproduced with a real job: a
keyed word count stops after completed checkpoints (its task process exits, no restart
left), then is resumed with a change. On the old main every change below resumed silently
with wrong counts or lost a sink's transaction; now each is refused before any task starts,
naming what does not match — and an unchanged resume still ends with the oracle's output.
"""
from __future__ import annotations

import logging
import os

import pytest

import epochal as ep
from epochal.errors import ConfigError
from epochal.runtime.driver.compatibility import check_restore
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord

from pipelines import canon, lines_from, running_counts, unique_dir

LINES = 2000


def counting(out, max_parallelism=128, count="count", sink="out", parallelism=2):
    flow = ep.Dataflow("compat", parallelism=2, max_parallelism=max_parallelism)
    (flow.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=4, limit=LINES // 4,
                                                     records_per_second=250.0))
        .flat_map("split", str.split)
        .map("pair", lambda w: (w, 1))
        .key_by(lambda p: p[0])
        .reduce(count, lambda a, b: (a[0], a[1] + b[1]), parallelism=parallelism)
        .sink(sink, FileSink(out)))
    return flow


def oracle():
    return canon(running_counts(LINES))


@pytest.fixture
def stopped(tmp_path):
    """A job stopped mid-way: its count task exited after epoch 2 with no restart left."""
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    with pytest.raises(ep.JobFailedError):
        counting(out).run(runtime="local", restart=ep.RestartStrategy(max_attempts=0),
                          checkpoint=ep.CheckpointConfig(interval=0.2, storage=url),
                          faults=[CrashAtRecord("count", record=1500, subtask=1, how="exit", after_epoch=2)])
    return out, url


def _resume(flow, url, **kw):
    return flow.run(runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.2, storage=url), **kw)


def test_unchanged_resume_ends_with_the_oracle_output(stopped):
    out, url = stopped
    _resume(counting(out), url)
    assert canon(read_committed(out)) == oracle()


def test_another_key_group_count_is_refused(stopped):
    out, url = stopped
    with pytest.raises(ConfigError, match=r"split into 128 key groups .* max_parallelism=64.*keep max_parallelism=128"):
        _resume(counting(out, max_parallelism=64), url)
    with pytest.raises(ConfigError, match="max_parallelism"):  # not droppable
        _resume(counting(out, max_parallelism=64), url, allow_non_restored_state=True)


def test_a_renamed_stateful_operator_is_refused_unless_its_state_may_be_dropped(stopped, caplog):
    out, url = stopped
    with pytest.raises(ConfigError, match=r"operator 'count' \(reduce\) has keyed state .* no operator of that name"
                                          r".*allow_non_restored_state=True"):
        _resume(counting(out, count="count2"), url)
    caplog.set_level(logging.WARNING, logger="epochal")
    result = _resume(counting(out, count="count2"), url, allow_non_restored_state=True)
    assert result.attempts == 1
    assert "without the state of 'count'" in caplog.text


def test_a_renamed_sink_with_transactions_is_refused_before_its_staging_is_touched(stopped):
    out, url = stopped
    staging = os.path.join(out, "_staging")
    before = sorted(os.listdir(staging)) if os.path.isdir(staging) else []
    with pytest.raises(ConfigError, match=r"operator 'out' \(sink\) has sink transactions"):
        _resume(counting(out, sink="out2"), url)
    after = sorted(os.listdir(staging)) if os.path.isdir(staging) else []
    assert after == before  # the new sink's orphan clean-up never ran


def test_changed_parallelism_is_fine(stopped):
    out, url = stopped
    _resume(counting(out, parallelism=3), url)
    assert canon(read_committed(out)) == oracle()


# ------------------------------------------------------------------ the pure check
def _meta(flow, epoch=4):
    plan = flow.plan()
    return {"epoch": epoch, "job": plan.job, "plan": plan.fingerprint(), "max_parallelism": plan.max_parallelism}


def test_check_restore_lists_every_problem_and_ignores_stateless_changes(tmp_path):
    old = _meta(counting("/tmp/x"))
    assert check_restore(counting("/tmp/x", parallelism=5).plan(), old) == []
    stateless_renamed = ep.Dataflow("compat", parallelism=2)
    (stateless_renamed.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=4, limit=1))
        .flat_map("split2", str.split).map("pair2", lambda w: (w, 1)).key_by(lambda p: p[0])
        .reduce("count", lambda a, b: a).sink("out", FileSink("/tmp/x")))
    assert check_restore(stateless_renamed.plan(), old) == []
    kind_changed = ep.Dataflow("compat", parallelism=2)
    (kind_changed.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=4, limit=1))
        .map("count", str.split).sink("sink2", FileSink("/tmp/x")))
    problems = check_restore(kind_changed.plan(), old)
    text = [p.message for p in problems]
    assert any("'count' was a reduce in checkpoint 4 but is a map now" in t for t in text)
    assert any("'out' (sink)" in t for t in text)
    assert {p.operator: p.droppable for p in problems} == {"count": False, "out": True}


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_dropped_state_is_gone_from_the_backend(backend):
    from epochal.backends.choice import backend_spec

    b = backend_spec(backend).create(range(0, 8))
    try:
        b.put("old/acc", 3, "k", 1)
        b.map_put("old/seen", 5, "k", "m", 2)
        b.put("new/acc", 3, "k", 7)
        assert b.state_names() >= {"old/acc", "old/seen", "new/acc"}
        b.drop_state("old/acc")
        b.drop_state("old/seen")
        b.drop_state("never")  # idempotent
        assert {e[1] for e in b.entries()} == {"new/acc"}
        assert b.get("old/acc", 3, "k") is None and b.get("new/acc", 3, "k") == 7
    finally:
        b.close()
