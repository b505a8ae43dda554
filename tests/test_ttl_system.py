"""State TTL end to end, against plain-Python oracles (tests/ttl_pipelines.py): event-time
sessions over a growing key space through a crash and restore (both backends), under an
external SIGKILL on Spark, processing-time expiry across a resume, and the offline state
reader never returning an expired entry."""
from __future__ import annotations

import collections
import time

import pytest

import epochal as ep
import epochal.state
from epochal.backends.formats import decode_snapshot
from epochal.state.location import open_checkpoint
from epochal.state.reader import _portable
from epochal.testing import CrashAtRecord
from pipelines import PidFileKiller, canon, output, unique_dir
from ttl_pipelines import PHASE, REUSE, sessions, sessions_oracle


def oracle(n: int) -> collections.Counter:
    return canon([list(r) for r in sessions_oracle(n).elements()])


def raw_entries(url: str, operator: str) -> int:
    """Entries of ``operator``'s state in the checkpoint, expired or not (no TTL filter)."""
    ckpt = open_checkpoint(url)
    n = 0
    for task in ckpt.tasks_of(operator):
        for _kg, (values, maps) in decode_snapshot(_portable(ckpt.task_state(task)["keyed"], ckpt)):
            n += sum(len(e) for name, e in values.items() if name == f"{operator}/n")  # both operators call it "n"
    return n


@pytest.mark.parametrize("backend", ["heap", pytest.param("rocksdb", marks=pytest.mark.slow)])
def test_event_time_sessions_expire_exactly_through_a_crash(tmp_path, backend):
    """Keys expire as event time passes their last update + ttl: every key set returns
    after its state expired and counts from 1 again — the output equals the oracle as a
    multiset although a task crashed after a checkpoint and restored; the final checkpoint
    (event time ended) has nothing the reader returns."""
    n = PHASE * REUSE * 2 + PHASE  # every key set comes back once
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    result = sessions("ttl-ev", out, n, rate=12_000.0).run(
        runtime="local", backend=backend, checkpoint=ep.CheckpointConfig(interval=0.1, storage=url),
        faults=[CrashAtRecord("sessions", subtask=0, record=4000, how="exit", after_epoch=1)])
    assert result.attempts == 2, f"the crash did not fire: {result.failures}"
    assert result.restored_from[-1] is not None
    assert output(out) == oracle(n)
    assert epochal.state.read(url + "/ttl-ev", "sessions").num_rows == 0


def test_event_time_ttl_under_sigkill_on_spark(tmp_path, spark):
    """The test SIGKILLs a task process of the keyed operator from outside once a
    checkpoint completed, mid-run; the committed output still equals the oracle."""
    n = PHASE * REUSE * 2 + PHASE
    pids = tmp_path / "pids"
    pids.mkdir()
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    handle = sessions("ttl-kill", out, n, rate=4_000.0, pid_dir=str(pids)).start(
        spark=spark, checkpoint=ep.CheckpointConfig(interval=0.2, storage=url))
    killer = PidFileKiller(pids, ready=lambda: handle.completed_epochs, running=lambda: handle.running)
    result = handle.wait(300)
    killer.join()
    assert killer.killed and result.attempts >= 2, f"the SIGKILL of {killer.killed} caused no restart"
    assert result.runtime == "spark"
    assert output(out) == oracle(n)


class Counter(ep.KeyedProcessFunction):
    def __init__(self, ttl):
        self.ttl = ttl

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0, ttl=self.ttl)

    def process(self, key, value):
        self.n.update(self.n.value() + 1)
        yield (key, self.n.value())


def _keys(split, offset):
    i = offset
    while True:
        yield f"u{i % 50}"
        i += 1


def _counting(name: str, out: str, n: int, ttl) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=2)
    (flow.source("keys", ep.sources.GeneratorSource(_keys, num_splits=1, limit=n), parallelism=1)
         .key_by(lambda k: k).process("count", Counter(ttl))
         .sink("out", ep.sinks.FileSink(out, format="jsonl")))
    return flow


@pytest.mark.parametrize("ttl,expire", [(ep.StateTtl(1.5), True),
                                        pytest.param(ep.StateTtl("1h"), False, marks=pytest.mark.slow)],
                         ids=["1.5s", "1h"])
def test_processing_time_ttl_across_a_resume(tmp_path, ttl, expire):
    """50 keys counted 4 times each; the job is resumed with 4 more rounds once the
    processing-time ttl has passed on the wall clock. With ttl 1.5 s the restored counts
    are gone (every key restarts at 1) and the reader shows no entry of the first run's
    checkpoint; with ttl 1 h they continue (5..8) and the reader shows all 50."""
    url = "file://" + unique_dir(tmp_path, "ckpt")
    out = unique_dir(tmp_path, "out")
    _counting("ttl-pt", out, 200, ttl).run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage=url))
    ended = time.time()
    first_run = output(out)
    assert first_run == canon([[f"u{k}", c] for k in range(50) for c in range(1, 5)])
    while time.time() < ended + 1.6:  # the ttl is wall-clock time: let it pass
        time.sleep(0.1)
    assert raw_entries(url + "/ttl-pt", "count") == 50  # stored (nothing swept them after the end)...
    rows = epochal.state.read(url + "/ttl-pt", "count").num_rows
    assert rows == (0 if expire else 50)  # ...and never returned once expired
    _counting("ttl-pt", out, 400, ttl).run(runtime="local", resume=True,
                                           checkpoint=ep.CheckpointConfig(interval=0.1, storage=url))
    first = 1 if expire else 5
    assert output(out) - first_run == canon([[f"u{k}", c] for k in range(50) for c in range(first, first + 4)])


@pytest.mark.slow  # the rule itself is tested without processes in test_ttl_expiry.py
def test_changing_the_time_domain_on_restore_is_refused(tmp_path):
    """Processing-time stamps cannot be read as event time: the resumed job fails before
    any record, naming the operator, the state and the change (not retried)."""
    url = "file://" + unique_dir(tmp_path, "ckpt")
    sessions("ttl-dom", unique_dir(tmp_path, "o1"), 300, ttl=ep.StateTtl("1h")).run(
        runtime="local", checkpoint=ep.CheckpointConfig(storage=url))
    with pytest.raises(ep.JobFailedError, match="operator 'sessions', state 'n'.*time domain changed"):
        sessions("ttl-dom", unique_dir(tmp_path, "o2"), 600).run(
            runtime="local", resume=True, checkpoint=ep.CheckpointConfig(storage=url))


def test_reduce_with_event_time_ttl_restarts_expired_keys(tmp_path):
    from ttl_pipelines import reduce_sessions

    n = PHASE * REUSE * 2 + PHASE
    out = unique_dir(tmp_path, "out")
    reduce_sessions("ttl-reduce", out, n).run(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "ck")))
    want = collections.Counter()
    for (k, count, _first), times in sessions_oracle(n).items():
        want[(k, count)] += times
    assert output(out) == canon([list(r) for r in want.elements()])


def test_ttl_build_errors():
    flow = ep.Dataflow("ttl-bad")
    keyed = flow.source("s", ep.sources.CollectionSource([1, 2])).key_by(lambda r: r)
    with pytest.raises(ep.PipelineDefinitionError, match="reduce 'r': event-time ttl needs event time"):
        keyed.reduce("r", lambda a, b: a + b, ttl=ep.StateTtl(5, time="event"))
    with pytest.raises(ep.ConfigError, match="reduce 'r2'.*ttl"):
        keyed.reduce("r2", lambda a, b: a + b, ttl=-1)
    with pytest.raises(ep.PipelineDefinitionError, match="window 'w': ttl: StateTtl ttl"):  # more: test_window_ttl.py
        keyed.window(ep.windows.Tumbling(5, processing_time=True), ttl=-1).reduce("w", lambda a, b: a)
