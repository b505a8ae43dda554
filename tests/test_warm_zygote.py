"""epochal.runtime.launch.warm: a spare zygote imported before the next local job.

The tasks of a job report their parent (the zygote that forked them) and an environment
variable, so each test sees which zygote ran them: the spare when it was started under the
job's environment, a fresh one otherwise (a changed environment must reach the tasks)."""
from __future__ import annotations

import os
import sys

import cloudpickle
import pytest

import epochal as ep
from epochal.runtime.launch import warm
from epochal.sinks import FileSink, read_committed

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MARK = "EPOCHAL_WARM_TEST_MARK"


@pytest.fixture
def spare_zygotes():
    yield
    warm.disable()  # never leave a spare behind, even when a test fails


def _run(tmp_path, name: str) -> list:
    """A local job whose output is ``(zygote pid, MARK)`` per record, one per task process."""
    out = str(tmp_path / name)
    flow = ep.Dataflow(name, parallelism=2)
    (flow.source("src", ep.sources.CollectionSource(list(range(4))))
     .map("who", lambda x: [x, os.getppid(), os.environ.get(MARK)]).sink("out", FileSink(out)))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage=f"file://{tmp_path / (name + '-ck')}",
                                                             interval=0.05))
    return sorted(read_committed(out))


def test_the_spare_forks_the_next_jobs_tasks_and_another_is_kept(tmp_path, spare_zygotes):
    warm.prewarm()
    first = warm._spare
    assert first is not None and first._ready and first.alive()
    rows = _run(tmp_path, "a")
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert {r[1] for r in rows} == {first.proc.pid}  # the spare forked every task
    assert not first.alive()  # closed with its job
    second = warm._spare
    assert second is not None and second is not first and second.alive()  # the next job's spare


def test_a_spare_from_another_environment_is_not_used(tmp_path, spare_zygotes, monkeypatch):
    warm.prewarm(wait=False)
    stale = warm._spare
    monkeypatch.setenv(MARK, "set-after-the-spare")
    rows = _run(tmp_path, "c")
    assert {r[2] for r in rows} == {"set-after-the-spare"}  # the tasks see the job's environment
    assert stale.proc.pid not in {r[1] for r in rows}
    assert not stale.alive()  # the stale spare was closed, not leaked


def test_without_prewarm_no_spare_is_kept(tmp_path, spare_zygotes):
    warm.disable()
    rows = _run(tmp_path, "d")
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert warm._spare is None


def test_tasks_start_with_the_runtime_frozen_out_of_the_collector(tmp_path):
    """The zygote freezes what its imports made (``gc.freeze``) before forking: a full
    collection in a task walks only the task's own objects (the runtime's ~47k took 31 ms)."""
    import gc

    out = str(tmp_path / "gc")
    flow = ep.Dataflow("frozen", parallelism=2)
    (flow.source("src", ep.sources.CollectionSource(list(range(4))))
     .map("frozen", lambda x: [x, gc.get_freeze_count()]).sink("out", FileSink(out)))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage=f"file://{tmp_path / 'ck'}", interval=0.05))
    rows = sorted(read_committed(out))
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert min(r[1] for r in rows) > 10_000, rows  # the imported runtime, not a handful of objects


def test_warm_up_local_keeps_a_spare_for_the_next_job(tmp_path, spare_zygotes):
    """``ep.warm_up("local")``: the public way to pay the task runtime's import before a clock starts."""
    ep.warm_up("local")
    assert warm._spare is not None and warm._spare.alive()
    zygotes = {row[1] for row in _run(tmp_path, "warm-up-local")}
    assert len(zygotes) == 1  # both tasks forked from the one spare


@pytest.mark.spark
def test_warm_up_spark_starts_the_session_before_the_job():
    """``ep.warm_up()``: the embedded session is up (and its Python workers started) when it
    returns, so a job's run does not pay for them; a second call is a no-op."""
    from epochal.runtime.launch import spark

    ep.warm_up()
    session = spark._owned_session  # the embedded session, up before any job asked for it
    assert session is not None and session.sparkContext.master.startswith("local")
    assert spark._session(None, 1) is session  # what a job of this process runs on now
    ep.warm_up()
    assert spark._session(None, 1) is session


def test_warm_up_refuses_another_runtime():
    with pytest.raises(ep.ConfigError, match="runtime must be 'spark' or 'local'"):
        ep.warm_up("flink")
