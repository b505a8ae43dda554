"""PostgresSink against a real PostgreSQL server that the tests start: exactly-once under
crashes (prepared transactions), at-least-once, upserts, rescaling, zombies, and the errors
users hit. Every pipeline's table is read back with psycopg and compared with a
plain-Python oracle; no prepared transaction may be left behind."""
from __future__ import annotations

import collections
import os

import pytest

import epochal as ep
from epochal.alignment.factory import SinkMode
from epochal.errors import ConfigError
from epochal.sinks import PostgresSink, SinkCommitError, SinkContext, SinkWriteError
from epochal.testing import CrashAtRecord, CrashDuringCommit, CrashDuringDurability

from pipelines import PidFileKiller, line, lines_from, no_count_lost

pytest_plugins = ["postgres_server"]

SPLITS, LINES = 4, 2400
RATE = 400.0  # lines/s per split: a run spans ~1.5 s of many 0.1 s epochs


def oracle(n_lines: int = LINES) -> collections.Counter:
    """Plain Python: the (word, n) rows a keyed running count of the input writes."""
    words = collections.Counter(w for s in range(SPLITS) for i in range(n_lines // SPLITS) for w in line(s, i).split())
    return collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))


class Count(ep.KeyedProcessFunction):
    """Running count per word; records its process id in ``pid_dir`` (for kills from outside)."""

    def __init__(self, pid_dir: str | None = None):
        self.pid_dir = pid_dir

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)
        if self.pid_dir:
            open(os.path.join(self.pid_dir, str(os.getpid())), "w").close()

    def process(self, word, value):
        self.n.update(self.n.value() + 1)
        yield {"word": word, "n": self.n.value()}


def wordcount(sink, *, name: str = "pg-wc", parallelism: int = 2, sink_parallelism: int | None = None,
              rate: float | None = RATE, n_lines: int = LINES, pid_dir=None) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=parallelism)
    (flow.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=SPLITS, limit=n_lines // SPLITS,
                                                     records_per_second=rate))
         .flat_map("split", str.split)
         .key_by(lambda w: w)
         .process("count", Count(pid_dir))
         .sink("out", sink, parallelism=sink_parallelism))
    return flow


def rows(postgres, table: str) -> collections.Counter:
    return collections.Counter(postgres.execute(f"SELECT word, n FROM {table}"))


def checkpoint(tmp_path, interval: float = 0.1) -> ep.CheckpointConfig:
    return ep.CheckpointConfig(interval=interval, storage="file://" + str(tmp_path / "ckpt"))


@pytest.fixture
def table(postgres):
    return postgres.new_table("word text NOT NULL, n bigint NOT NULL")


# --------------------------------------------------------------------------- exactly-once under faults

FAULTS = {
    "crash-at-record": CrashAtRecord("count", subtask=1, record=1500, how="exit", after_epoch=1),
    "crash-during-durability": CrashDuringDurability("out", subtask=0, epoch=2, how="exit"),
    "crash-between-completion-and-commit": CrashDuringCommit("out", subtask=0, epoch=2, how="exit", after_epoch=1),
}


@pytest.mark.parametrize("fault", list(FAULTS), ids=list(FAULTS))
def test_running_count_exactly_once_under_a_crash(postgres, table, tmp_path, fault):
    """Rows read back equal the plain-Python count (no duplicate, no gap) and no prepared
    transaction is left on the server: the crashed attempt's were committed (completed
    epochs) or rolled back (the rest)."""
    result = wordcount(PostgresSink(postgres.dsn, table)).run(runtime="local", checkpoint=checkpoint(tmp_path),
                                                               faults=[FAULTS[fault]])
    assert result.attempts == 2, f"the fault did not fire: {result.failures}"
    assert "disconnected without finishing" in result.failures[0]
    assert rows(postgres, table) == oracle()
    assert postgres.prepared() == []


def test_sigkill_of_the_sink_task_process_from_outside(postgres, table, tmp_path):
    """The test SIGKILLs the process running count[0] → out[0] (not a testing hook) once the
    first checkpoint completed; the table still equals the oracle, nothing stays prepared."""
    pids = tmp_path / "pids"
    pids.mkdir()
    handle = wordcount(PostgresSink(postgres.dsn, table), pid_dir=str(pids), rate=300.0).start(
        runtime="local", checkpoint=checkpoint(tmp_path))
    killer = PidFileKiller(pids, ready=lambda: handle.completed_epochs, timeout=60)
    result = handle.wait(180)
    killer.join()
    assert killer.killed and result.attempts >= 2, f"the SIGKILL of {killer.killed} caused no restart"
    assert rows(postgres, table) == oracle()
    assert postgres.prepared() == []


def test_on_spark_with_a_crash_between_completion_and_commit(postgres, table, tmp_path, spark):
    result = wordcount(PostgresSink(postgres.dsn, table)).run(
        spark=spark, checkpoint=checkpoint(tmp_path),
        faults=[CrashDuringCommit("out", subtask=1, epoch=2, how="exit", after_epoch=1)])
    assert result.runtime == "spark" and result.attempts == 2
    assert rows(postgres, table) == oracle()
    assert postgres.prepared() == []


def test_at_least_once_contains_every_row(postgres, table, tmp_path):
    result = wordcount(PostgresSink(postgres.dsn, table)).run(
        runtime="local", guarantee="at-least-once", checkpoint=checkpoint(tmp_path),
        faults=[CrashAtRecord("count", subtask=0, record=1500, how="exit", after_epoch=1)])
    assert result.attempts == 2
    assert not no_count_lost(rows(postgres, table), oracle())
    assert postgres.prepared() == []


def test_upsert_keeps_the_final_count_per_word(postgres, tmp_path):
    """``upsert_key``: one row per word, updated by every epoch; after a crash between
    completion and commit the table holds each word's final count."""
    table = postgres.new_table("word text PRIMARY KEY, n bigint NOT NULL")
    result = wordcount(PostgresSink(postgres.dsn, table, upsert_key="word")).run(
        runtime="local", checkpoint=checkpoint(tmp_path),
        faults=[CrashDuringCommit("out", subtask=1, epoch=2, how="exit", after_epoch=1)])
    assert result.attempts == 2
    final = {}
    for w, n in oracle():
        final[w] = max(final.get(w, 0), n)
    assert dict(postgres.execute(f"SELECT word, n FROM {table}")) == final
    assert postgres.prepared() == []


def test_sink_rescale_hands_a_pending_prepared_transaction_over(postgres, table, tmp_path):
    """Sink parallelism 3 → 1: the first run ends with sink subtask 2 crashing while committing
    a completed epoch (no restarts), so that epoch is prepared on the server and pending in the
    checkpoint of old subtask 2; only new subtask 0 (2 % 1) can commit it, on restore."""
    url = "file://" + str(tmp_path / "ckpt")
    sink = PostgresSink(postgres.dsn, table)
    with pytest.raises(ep.JobFailedError, match=r"disconnected"):
        wordcount(sink, sink_parallelism=3).run(
            runtime="local", restart=ep.RestartStrategy(max_attempts=0),
            checkpoint=ep.CheckpointConfig(interval=0.1, storage=url),
            faults=[CrashDuringCommit("out", epoch=2, subtask=2, how="exit", after_epoch=1)])
    assert any("-s2-" in g for g in postgres.prepared()), "no prepared transaction of subtask 2 was left"
    result = wordcount(sink, sink_parallelism=1).run(runtime="local", resume=True,
                                                     checkpoint=ep.CheckpointConfig(interval=0.1, storage=url))
    assert result.restored_from[0] is not None
    assert rows(postgres, table) == oracle()
    assert postgres.prepared() == []


def test_arrow_batches_of_a_columnar_stream(postgres, tmp_path):
    import pyarrow as pa

    table = postgres.new_table("id bigint NOT NULL, name text, score double precision")
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    batches = [pa.RecordBatch.from_pylist([{"id": b * 100 + i, "name": f"n{i}", "score": i / 2} for i in range(100)],
                                          schema=schema) for b in range(20)]
    flow = ep.Dataflow("pg-arrow", parallelism=2)
    flow.source("in", ep.sources.CollectionSource(batches, num_splits=2, schema=schema)).sink(
        "out", PostgresSink(postgres.dsn, table))
    flow.run(runtime="local", checkpoint=checkpoint(tmp_path))
    got = sorted(postgres.execute(f"SELECT id, name, score FROM {table}"))
    assert got == sorted((r["id"], r["name"], r["score"]) for b in batches for r in b.to_pylist())


# --------------------------------------------------------------------------- recovery, at the writer

def _ctx(generation: int, subtask: int = 0, parallelism: int = 1, mode=SinkMode.TRANSACTIONAL) -> SinkContext:
    return SinkContext("out", subtask=subtask, parallelism=parallelism, job="pg-writer", generation=generation,
                       mode=mode)


def test_restore_commits_pending_epochs_and_rolls_back_the_zombies(postgres, table):
    """Generation 0 prepares epochs 1 and 2 (its checkpoint 2 lists both pending) and a zombie
    epoch 3; epoch 1 commits, then the writer is 'lost'. Generation 1 restores checkpoint 2:
    epoch 1 is in the table already (skipped), epoch 2 is committed from its prepared
    transaction, epoch 3 (never part of a completed checkpoint) is rolled back. A second
    restore from the same checkpoint changes nothing."""
    sink = PostgresSink(postgres.dsn, table)
    zombie = sink.create_writer(_ctx(0))
    zombie.restore(None)
    zombie.write_many([{"word": "a", "n": 1}])
    zombie.snapshot(1)
    zombie.durability_job(1)()
    zombie.write_many([{"word": "b", "n": 2}, {"word": "c", "n": 2}])
    state = zombie.snapshot(2)
    zombie.durability_job(2)()
    zombie.notify_epoch_complete(1)
    zombie.write_many([{"word": "z", "n": 3}])
    zombie.snapshot(3)
    zombie.durability_job(3)()
    assert len(postgres.prepared()) == 2

    fresh = sink.create_writer(_ctx(1))
    fresh.restore(state)
    assert sorted(postgres.execute(f"SELECT word, n FROM {table}")) == [("a", 1), ("b", 2), ("c", 2)]
    assert postgres.prepared() == []
    again = sink.create_writer(_ctx(2))
    again.restore(state)
    assert sorted(postgres.execute(f"SELECT word, n FROM {table}")) == [("a", 1), ("b", 2), ("c", 2)]


def test_a_prepared_epoch_rolled_back_by_hand_is_reported_lost(postgres, table):
    sink = PostgresSink(postgres.dsn, table)
    w = sink.create_writer(_ctx(0))
    w.restore(None)
    w.write({"word": "a", "n": 1})
    state = w.snapshot(1)
    w.durability_job(1)()
    (gid,) = postgres.prepared()
    postgres.execute(f"ROLLBACK PREPARED '{gid}'")
    with pytest.raises(SinkCommitError, match=r"epoch 1 .* neither has it prepared nor committed it"):
        sink.create_writer(_ctx(1)).restore(state)


# --------------------------------------------------------------------------- errors users hit

def test_a_server_without_prepared_transactions_is_refused_at_start(tmp_path):
    from postgres_server import cannot_start_server, start_server

    if cannot_start_server():
        pytest.skip(cannot_start_server())
    server = start_server(max_prepared_transactions=0)
    try:
        table = server.new_table("word text NOT NULL, n bigint NOT NULL")
        with pytest.raises(ConfigError, match=r"sink 'out'.*max_prepared_transactions = 0"):
            wordcount(PostgresSink(server.dsn, table)).run(runtime="local", checkpoint=checkpoint(tmp_path))
        # at-least-once needs no prepared transactions
        wordcount(PostgresSink(server.dsn, table), rate=None, n_lines=40).run(
            runtime="local", guarantee="at-least-once", checkpoint=checkpoint(tmp_path / "alo"))
        assert rows(server, table) == oracle(40)
    finally:
        server.stop()


def test_missing_table_and_column_are_named_at_start(postgres, table, tmp_path):
    with pytest.raises(ConfigError, match=r"sink 'out'.*table 'no_such_table' does not exist"):
        wordcount(PostgresSink(postgres.dsn, "no_such_table"), rate=None).run(runtime="local")
    with pytest.raises(ConfigError, match=r"has no column\(s\) \['count'\]"):
        wordcount(PostgresSink(postgres.dsn, table, columns=["word", "count"]), rate=None).run(runtime="local")
    with pytest.raises(ConfigError, match="cannot connect to PostgreSQL"):
        wordcount(PostgresSink("postgresql://postgres@127.0.0.1:9/postgres", table), rate=None).run(runtime="local")


@pytest.mark.parametrize("record, reason", [
    ({"word": "a", "n": "one"}, r"column 'n' \(int8\) takes an int, got str"),
    ({"word": "a", "n": 1, "extra": 2}, r"key\(s\) \['extra'\] are not columns"),
    ({"n": 1}, r"column 'word' is NOT NULL"),
    (("a",), r"a row of 1 value\(s\) for 2 column\(s\)"),
])
def test_a_record_the_table_cannot_take_names_sink_record_and_column(postgres, table, record, reason):
    w = PostgresSink(postgres.dsn, table).create_writer(_ctx(0))
    w.restore(None)
    with pytest.raises(SinkWriteError, match=r"sink 'out' cannot write record .*" + reason):
        w.write(record)


def test_bad_arguments_are_refused_when_built():
    with pytest.raises(ConfigError, match="dsn"):
        PostgresSink("", "t")
    with pytest.raises(ConfigError, match="columns"):
        PostgresSink("postgresql://x", "t", columns=["a", "a"])
    with pytest.raises(ConfigError, match=r"upsert_key \['k'\] must be among columns"):
        PostgresSink("postgresql://x", "t", columns=["a"], upsert_key="k")


def test_the_postgres_example_runs_and_checks_itself(postgres):
    """examples/postgres_sink.py on the local runtime against the test server: it exits
    non-zero unless the table equals its plain-Python count with nothing left prepared."""
    import subprocess
    import sys

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "postgres_sink.py")
    proc = subprocess.run([sys.executable, example, "--runtime", "local", "--dsn", postgres.dsn, "--lines", "3000"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 attempt(s)" in proc.stdout and "each row once: yes" in proc.stdout


def test_upserts_of_one_key_from_two_subtasks_fail_saying_to_key_by(postgres, tmp_path):
    """Without a key_by on the upsert key, two sink subtasks upsert the same key: the second
    waits for the first's prepared transaction, which commits only after the checkpoint that
    waits for the second. lock_timeout turns that into an error saying what to do."""
    table = postgres.new_table("word text PRIMARY KEY, n bigint NOT NULL")
    flow = ep.Dataflow("pg-upsert-unkeyed", parallelism=2)
    (flow.source("in", ep.sources.GeneratorSource(lambda s, o: iter(({"word": "same", "n": i} for i in range(o, 10**9))),
                                                  num_splits=2, limit=2000, records_per_second=2000.0))
         .sink("out", PostgresSink(postgres.dsn, table, upsert_key="word", lock_timeout="1s")))
    with pytest.raises(ep.JobFailedError, match=r"lock_timeout=1 s.*key_by the upsert key"):
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=0),
                 checkpoint=ep.CheckpointConfig(interval=0.1, tolerable_failures=0))
    # a job that failed for good leaves the prepared transactions of its unfinished epochs
    # (only a restore knows which epochs completed); starting it again rolls them back
    assert postgres.prepared(), "the other subtask's epoch should still be prepared"
    PostgresSink(postgres.dsn, table, upsert_key="word").claim("pg-upsert-unkeyed", "out", resume=False)
    assert postgres.prepared() == []
