"""Exactly-once through a job's whole life (issue 36): what users do to a job besides
crashing it — run it again from fresh checkpoint storage, roll it back to an older
savepoint — for the Kafka and PostgreSQL sinks, against the real broker and server.

Every test reads the output back with an independent client (a read_committed consumer,
psycopg) and compares it with a plain-Python oracle of the input, as a multiset. The input
is a Kafka topic produced in two halves (tests/test_kafka.py ``Input``), so a savepoint can
be taken exactly after the first half: its source offsets are known without asking epochal.
Delta and Iceberg have the same tests in tests/test_table_lifecycle.py.
"""
from __future__ import annotations

import collections
import runpy
import time

import cloudpickle
import pytest

import epochal as ep
import test_kafka
from epochal.sinks import KafkaSink, PostgresSink
from epochal.sources import KafkaSource
from epochal.testing import CrashDuringCommit
from test_kafka import Count, Input, committed_counts, running_counts

cloudpickle.register_pickle_by_value(test_kafka)  # its Count runs in the tasks, also when run alone

pytest_plugins = ["kafka_broker", "postgres_server"]


class Target:
    """One sink kind: ``sink()`` builds it, ``read()`` is the independent view of its output
    as a multiset of (word, n)."""

    def __init__(self, kind: str, request):
        self.kind = kind
        if kind == "kafka":
            self.broker = request.getfixturevalue("kafka_broker")
            self.topic = self.broker.create_topic(None, 2)
        else:
            self.pg = request.getfixturevalue("postgres")
            self.table = self.pg.new_table("word text NOT NULL, n bigint NOT NULL")

    def sink(self):
        if self.kind == "kafka":
            return KafkaSink(self.broker.servers, self.topic, key=lambda r: r[0])
        return PostgresSink(self.pg.dsn, self.table)

    def read(self) -> collections.Counter:
        if self.kind == "kafka":
            return committed_counts(self.broker, self.topic)
        return collections.Counter(tuple(r) for r in self.pg.execute(f"SELECT word, n FROM {self.table}"))

    def open_transactions(self):
        if self.kind == "kafka":
            return self.broker.open_transactions(self.topic)
        return self.pg.prepared()


@pytest.fixture(params=["kafka", "postgres"])
def target(request):
    return Target(request.param, request)


def wordcount(broker, data: Input, target: Target, name: str = "life-wc", parallelism: int = 2) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=parallelism)
    as_row = (lambda r: r) if target.kind == "kafka" else (lambda r: {"word": r[0], "n": r[1]})
    (flow.source("lines", KafkaSource(broker.servers, data.topic, stopping_offsets=data.stops,
                                      deserializer=bytes.decode))
         .flat_map("split", lambda r: r.value.split())
         .key_by(lambda w: w)
         .process("count", Count())
         .map("row", as_row)
         .sink("out", target.sink()))
    return flow


def storage(tmp_path, run: str, interval: float = 0.1) -> ep.CheckpointConfig:
    return ep.CheckpointConfig(interval=interval, storage="file://" + str(tmp_path / run))


def wait_until(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_second_run_from_fresh_storage_with_a_crash_before_its_first_commit(kafka_broker, target, tmp_path):
    """Run 1 counts the whole input. Run 2 — the same job, sink and target, a new checkpoint
    storage (a backfill; or the default temporary storage) — crashes between the completion
    of its checkpoint 1 and that epoch's commit. Run 2's epoch 1 must be produced from its
    checkpoint: the target holds run 1's output and run 2's, each complete. (Before lineages,
    Kafka took run 1's marker for run 2's and skipped the epoch: records lost silently.)"""
    data = Input(kafka_broker, partitions=2, per_partition=500)
    data.rest()
    oracle = running_counts(data.lines)
    first = wordcount(kafka_broker, data, target).run(runtime="local", checkpoint=storage(tmp_path, "run1"))
    assert target.read() == oracle
    second = wordcount(kafka_broker, data, target).run(  # 1 s epochs: epoch 1 holds most of the output
        runtime="local", checkpoint=storage(tmp_path, "run2", interval=1.0),
        faults=[CrashDuringCommit("out", subtask=0, epoch=1, how="exit")])
    assert second.attempts == 2, f"the fault did not fire: {second.failures}"
    assert second.restored_from[1] is not None, "the second attempt restored no checkpoint"
    assert second.lineage != first.lineage
    got = target.read()
    assert got == oracle + oracle, (f"missing {sum((oracle + oracle - got).values())}, "
                                    f"extra {sum((got - oracle - oracle).values())}")
    assert not target.open_transactions()


def test_rollback_to_an_older_savepoint_produces_the_later_epochs_again(kafka_broker, target, tmp_path, caplog):
    """Run 1 counts the first half of the input, takes a savepoint once all of it is
    committed (so the savepoint's offsets are exactly the first half), then counts the rest
    and ends. Run 2 starts from that savepoint and runs to the end: it is a new branch of
    the job's lineage, and the epochs after the savepoint are produced again, exactly once
    more. The target ends as run 1's output plus the counts of the second half continuing
    from the savepoint's state. (Before lineages, PostgreSQL restart-looped on its progress
    key and Kafka skipped the re-produced epochs as already committed.)"""
    data = Input(kafka_broker, partitions=2, per_partition=500)
    first_half = running_counts(data.first_half())
    oracle = running_counts(data.lines)
    handle = wordcount(kafka_broker, data, target).start(runtime="local", checkpoint=storage(tmp_path, "run1"))
    try:
        wait_until(lambda: target.read() == first_half, "run 1 did not commit the first half")
        savepoint = handle.savepoint(str(tmp_path / "sp"), timeout=60)
    except BaseException:
        handle.cancel()
        raise
    data.rest()
    first = handle.wait(300)
    assert target.read() == oracle
    caplog.set_level("INFO", logger="epochal")
    second = wordcount(kafka_broker, data, target).run(runtime="local", restore_from=savepoint,
                                                      checkpoint=storage(tmp_path, "run2"))
    assert second.attempts == 1 and second.lineage != first.lineage
    rerun = oracle - first_half  # run 2 re-emits every count of the second half
    got = target.read()
    assert got == oracle + rerun, (f"missing {sum((oracle + rerun - got).values())}, "
                                   f"extra {sum((got - oracle - rerun).values())}")
    assert not target.open_transactions()
    assert any(f"a branch of lineage {first.lineage}" in r.getMessage() for r in caplog.records), \
        "the run did not say it is a branch of run 1's lineage"


@pytest.mark.spark
def test_kafka_to_kafka_recovers_promptly_from_three_sigkills_on_spark(kafka_broker, spark, tmp_path):
    """Issue 36's wedge: a keyed count Kafka → Kafka on Spark whose task processes (count →
    sink, chained: the process holding the producers) are SIGKILLed from outside three
    times. The input comes in four parts; the test sends the next part only after a kill
    was followed by a restart and a completed checkpoint of the new attempt, so every kill
    lands mid-run. Every recovery must take seconds — a restored writer that waited for a
    killed producer's transaction would take ``transaction.timeout.ms`` — and the output
    equals the plain-Python count."""
    import os
    import signal

    parts, per_part = 4, 150
    topic = kafka_broker.create_topic(None, 2)
    lines = {p: [test_kafka.text(p, i) for i in range(parts * per_part)] for p in range(2)}
    out = kafka_broker.create_topic(None, 2)
    pids = tmp_path / "pids"
    pids.mkdir()
    flow = ep.Dataflow("life-kills", parallelism=2)
    (flow.source("lines", KafkaSource(kafka_broker.servers, topic, deserializer=bytes.decode,
                                      stopping_offsets={(topic, p): parts * per_part for p in range(2)}))
         .flat_map("split", lambda r: r.value.split())
         .key_by(lambda w: w)
         .process("count", Count(str(pids)))
         .sink("out", KafkaSink(kafka_broker.servers, out, key=lambda r: r[0])))

    def send(k: int) -> None:
        for p in range(2):
            kafka_broker.produce(topic, lines[p][k * per_part:(k + 1) * per_part], partition=p)

    send(0)
    handle = flow.start(spark=spark, checkpoint=storage(tmp_path, "ckpt"),
                        restart=ep.RestartStrategy(max_attempts=5, delay=0.1))
    recoveries, killed = [], []
    try:
        for k in range(1, parts):
            attempt = handle.metrics().get("attempt", 0)
            wait_until(lambda: handle.completed_epochs and os.listdir(pids), "no checkpoint before the kill")
            victims = sorted(os.listdir(pids))
            for name in victims:
                os.remove(pids / name)
            for name in victims[k % len(victims):] + victims[:k % len(victims)]:
                try:
                    os.kill(int(name), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed.append(int(name))
                break
            t_kill = time.monotonic()
            before = max(e["epoch"] for e in handle.completed_epochs)
            wait_until(lambda: handle.metrics().get("attempt", 0) > attempt, "the kill caused no restart")
            # epoch ids are never reused: a completed epoch above `before` is the new attempt's
            wait_until(lambda: any(e["epoch"] > before for e in handle.completed_epochs),
                       "no checkpoint after the restart", timeout=180)
            recoveries.append(time.monotonic() - t_kill)
            send(k)
        result = handle.wait(300)
    except BaseException:
        handle.cancel()
        raise
    assert len(killed) == parts - 1 and result.attempts == parts, (killed, result.failures)
    assert max(recoveries) < 30, f"recovery took {recoveries} s after the kills"
    assert committed_counts(kafka_broker, out) == running_counts(lines[0] + lines[1])
    assert kafka_broker.open_transactions(out) == {}


@pytest.mark.parametrize("target", ["postgres"], indirect=True)  # the lease is the same for every sink
def test_a_second_launch_is_refused_naming_the_running_one(kafka_broker, target, tmp_path):
    """While run 1 runs (its input not complete yet, so it cannot have finished), a second
    launch of the same job is refused at start, naming the running one: onto the same
    checkpoint storage (``resume=True``) for every sink — the job's lease — and, for
    PostgreSQL, even from another storage — the table's lock. Run 1 then finishes exact,
    and its lease is gone."""
    data = Input(kafka_broker, partitions=2, per_partition=300)
    handle = wordcount(kafka_broker, data, target).start(runtime="local", checkpoint=storage(tmp_path, "run1"))
    try:
        wait_until(lambda: handle.completed_epochs, "run 1 completed no checkpoint")
        with pytest.raises(ep.ConfigError, match=r"already running on checkpoint storage .* process \d+ on host"):
            wordcount(kafka_broker, data, target).start(runtime="local", resume=True,
                                                        checkpoint=storage(tmp_path, "run1"))
        if target.kind == "postgres":
            with pytest.raises(ep.ConfigError, match=r"another run of job 'life-wc' is writing table .* epochal job"):
                wordcount(kafka_broker, data, target).start(runtime="local", checkpoint=storage(tmp_path, "run2"))
        assert handle.running
    except BaseException:
        handle.cancel()
        raise
    data.rest()
    handle.wait(300)
    assert target.read() == running_counts(data.lines)
    assert not target.open_transactions()
    assert not (tmp_path / "run1" / "life-wc" / "_lease").exists(), "the ended job's lease is still there"


@pytest.mark.parametrize("target", ["postgres"], indirect=True)  # the check is the driver's, for every sink
def test_switching_exactly_once_to_at_least_once_first_commits_what_the_checkpoint_promised(kafka_broker, target,
                                                                                          tmp_path):
    """Run 1 (exactly-once) dies between a checkpoint's completion and its commit, with no
    restart left: that epoch is promised by the checkpoint but not in the target. Resuming
    it at-least-once would drop it (an at-least-once writer re-commits nothing), so that is
    refused, naming the setting. The documented way: resume exactly-once and stop with a
    savepoint (every transaction up to it commits), then resume at-least-once — output is
    then complete."""
    data = Input(kafka_broker, partitions=2, per_partition=400)
    config = storage(tmp_path, "ckpt")
    with pytest.raises(ep.JobFailedError):
        wordcount(kafka_broker, data, target).run(runtime="local", checkpoint=config,
                                                  restart=ep.RestartStrategy(max_attempts=0),
                                                  faults=[CrashDuringCommit("out", subtask=0, epoch=1, how="exit")])
    with pytest.raises(ep.ConfigError, match=r"guarantee: checkpoint \d+ was taken exactly-once .*stop_with_savepoint"):
        wordcount(kafka_broker, data, target).run(runtime="local", resume=True, checkpoint=config,
                                                  guarantee="at-least-once")
    handle = wordcount(kafka_broker, data, target).start(runtime="local", resume=True, checkpoint=config)
    try:
        wait_until(lambda: target.read() == running_counts(data.first_half()), "the first half was not committed")
    except BaseException:
        handle.cancel()
        raise
    handle.stop_with_savepoint(str(tmp_path / "sp"), timeout=120)
    data.rest()
    third = wordcount(kafka_broker, data, target).run(runtime="local", resume=True, checkpoint=config,
                                                      guarantee="at-least-once")
    assert third.guarantee == "at-least-once"
    assert target.read() == running_counts(data.lines)  # no failure in the at-least-once run: exact


def test_kafka_marker_group_gone_while_the_job_was_down_produces_no_duplicate(kafka_broker):
    """A writer commits epochs 1 and 2 (records and marker), but the checkpoint it is
    restored from still lists them as pending (taken before the commits). While the job is
    down the marker group disappears (deleted here; Kafka expires it after
    ``offsets.retention.minutes``). The restored writer cannot learn from the group that the
    epochs are in Kafka; it finds their tagged first records in the topic and produces
    neither again. (Before the tags, both epochs were produced twice.)"""
    from epochal.alignment.factory import SinkMode
    from epochal.epochs.lineage import Lineage
    from epochal.sinks import SinkContext

    topic = kafka_broker.create_topic(None, 2)
    sink = KafkaSink(kafka_broker.servers, topic)
    lineage = Lineage("0123456789ab")

    def ctx(generation):
        return SinkContext("out", subtask=0, parallelism=1, job="expiry", generation=generation,
                           mode=SinkMode.TRANSACTIONAL, lineage=lineage)

    first = sink.create_writer(ctx(0))
    first.restore(None)
    first.write_many([f"a{i}" for i in range(50)])
    first.snapshot(1)
    first.durability_job(1)()
    first.write_many([f"b{i}" for i in range(30)])
    state = first.snapshot(2)
    first.durability_job(2)()
    first.notify_epoch_complete(2)  # both epochs committed, with their marker
    first.release()
    want = sorted(f"a{i}".encode() for i in range(50)) + sorted(f"b{i}".encode() for i in range(30))
    assert sorted(kafka_broker.values(topic)) == sorted(want)
    group = f"epochal-expiry-out-{lineage.id}-0-epochs"
    admin = kafka_broker.admin()
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        future.result(30)
    # the group is gone: a fresh consumer of it finds no committed offset
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": kafka_broker.servers, "group.id": group})
    assert probe.committed([TopicPartition(topic, 0)], timeout=10)[0].offset < 0
    probe.close()

    second = sink.create_writer(ctx(1))
    second.restore(state)  # pending: epochs 1 and 2, both in Kafka already
    second.release()
    assert sorted(kafka_broker.values(topic)) == sorted(want), "an epoch was produced twice"


def test_kafka_source_after_a_restore_reads_new_partitions_from_their_start_and_drops_removed_topics(kafka_broker):
    """A restored KafkaSource (``starting_offsets="latest"``): a partition with no
    checkpointed offset appeared while the job was down and is read from its start — "latest"
    would skip what was written to it meanwhile — and a checkpointed partition of a topic
    no longer among ``topics`` is not read."""
    from epochal.connectors.kafka.source import split_name

    topic, gone = kafka_broker.create_topic(None, 2), kafka_broker.create_topic(None, 1)
    kafka_broker.produce(topic, [f"a{i}" for i in range(5)], partition=0)
    kafka_broker.produce(topic, [f"b{i}" for i in range(3)], partition=1)  # "new" partition: no offset restored
    kafka_broker.produce(gone, ["x0", "x1"], partition=0)
    source = KafkaSource(kafka_broker.servers, topic, starting_offsets="latest", stopping_offsets="latest",
                         deserializer=bytes.decode)
    restored = {split_name(topic, 0): {"next": 2}, split_name(gone, 0): {"next": 0}}
    reader = source.create_reader(source.splits(), restored)
    got, deadline = [], time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            poll = reader.poll(100)
            got += [r.value for r in poll.records]
            if poll.finished:
                break
    finally:
        reader.close()
    assert sorted(got) == ["a2", "a3", "a4", "b0", "b1", "b2"]


LINGER_SCRIPT = '''
import epochal as ep
from epochal.sinks import PostgresSink

WORDS = [w for i in range(1500) for w in ("ant", "bee", "cat", "dog", "eel")[: 1 + i % 5]]


def words_from(split, offset):
    yield from WORDS[offset:] if split == 0 else ()


class Count(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, word, value):
        self.n.update(self.n.value() + 1)
        yield {"word": word, "n": self.n.value()}


flow = ep.Dataflow("linger", parallelism=2)
(flow.source("words", ep.sources.GeneratorSource(words_from, num_splits=1, limit=len(WORDS),
                                                  records_per_second=3000.0))
     .key_by(lambda w: w)
     .process("count", Count())
     .sink("out", PostgresSink(DSN, TABLE)))

if __name__ == "__main__":
    flow.run()
'''


def test_lingering_prepared_transactions_are_listed_and_ended_but_never_what_a_checkpoint_promises(postgres, tmp_path):
    """A job dies between a checkpoint's completion and its commit, with no restart left: its
    prepared transactions stay on the server, and a zombie's stray one (an epoch no
    checkpoint holds) is there too. ``epochal sinks lingering`` lists both, marks the
    checkpoint's as promised; ``--abort`` rolls back only the stray one; a resume then
    commits the promised epoch and the table equals the plain-Python count, with nothing
    left prepared."""
    from epochal.cli import main
    from epochal.connectors.postgres import recovery
    from epochal.sinks import lingering
    from epochal.state.commands import load_dataflow

    table = postgres.new_table("word text NOT NULL, n bigint NOT NULL")
    script = tmp_path / "linger_job.py"
    script.write_text(f"DSN = {postgres.dsn!r}\nTABLE = {table!r}\n" + LINGER_SCRIPT)
    flow = load_dataflow(f"{script}:flow")
    scope = runpy.run_path(str(script), run_name="oracle")  # the script's own word list: the oracle's input
    oracle = running_counts([" ".join(scope["WORDS"])])
    # 0.5 s epochs, the crash at epoch 2's commit: epoch 1 may cover only the tasks' start
    # (empty under load), epoch 2 holds half a second of the 1.5 s input (or is the final one)
    config = storage(tmp_path, "ckpt", interval=0.5)
    with pytest.raises(ep.JobFailedError):
        flow.run(runtime="local", checkpoint=config, restart=ep.RestartStrategy(max_attempts=0),
                 faults=[CrashDuringCommit("out", subtask=0, epoch=2, how="exit")])
    with postgres.connect(autocommit=False) as conn:  # a zombie's prepared epoch that no checkpoint holds
        conn.execute(f"INSERT INTO {table} VALUES ('stray', 1)")
        stray = recovery.gid(recovery.sink_hash("linger", "out", table), 1, 99, 7, "0123456789ab")
        conn.execute(f"PREPARE TRANSACTION '{stray}'")
    found = lingering.find(flow, config.storage)
    promised = {i.what for i in found if i.promised}
    assert stray in {i.what for i in found if not i.promised}
    assert promised, f"the checkpoint's pending epoch is not listed as promised: {found}"
    assert main(["sinks", "lingering", config.storage, "linger", "--dataflow", f"{script}:flow", "--abort"]) == 0
    assert set(postgres.prepared()) == promised, "--abort ended a promised transaction or left the stray one"
    flow.run(runtime="local", resume=True, checkpoint=config)
    assert collections.Counter(tuple(r) for r in postgres.execute(f"SELECT word, n FROM {table}")) == oracle
    assert postgres.prepared() == []


def test_kafka_lingering_producers_are_listed_and_fencing_them_ends_their_open_transactions(kafka_broker):
    """A writer registers, streams epoch 1 into an open transaction and is lost (a cancelled
    job never resumed). The sink lists the producers that may hold open transactions — the
    writer registered in the checkpoint's lineage — and ending them fences each id, which
    aborts the open transaction: readers are no longer held at the last stable offset."""
    from epochal.alignment.factory import SinkMode
    from epochal.epochs.lineage import Lineage
    from epochal.sinks import SinkContext
    from epochal.sinks.lingering import Promised

    topic = kafka_broker.create_topic(None, 1)
    sink = KafkaSink(kafka_broker.servers, topic)
    lineage = Lineage("0123456789ab")
    lost = sink.create_writer(SinkContext("out", subtask=0, parallelism=1, job="linger", generation=3,
                                          mode=SinkMode.TRANSACTIONAL, lineage=lineage))
    lost.restore(None)
    lost.write_many(["x", "y"])
    lost._slots[0].flush(10)  # the records reached the broker inside the open transaction
    assert kafka_broker.open_transactions(topic), "epoch 1's transaction should be open"
    promised = Promised(epoch=None, lineage=lineage.id, parallelism=1)
    items = sink.lingering("linger", "out", promised)
    assert f"epochal-linger-out-{lineage.id}-0-g3-0" in {i.what for i in items} and not any(i.promised for i in items)
    sink.end_lingering("linger", "out", items, promised)
    assert kafka_broker.open_transactions(topic) == {}
    assert kafka_broker.values(topic) == []  # aborted, never visible


def test_rescale_4_to_2_after_a_crash_before_the_commit(kafka_broker, target, tmp_path):
    """Run 1 at parallelism 4 dies between a checkpoint's completion and its commits (no
    restart left), so that checkpoint promises epochs the target does not hold yet. Run 2
    resumes it at parallelism 2 — not through a clean savepoint: subtasks 0 and 1 each absorb
    an old subtask's pending transactions and commit them under the lineage and subtask
    that wrote them — then counts the rest. The target equals the plain-Python count."""
    data = Input(kafka_broker, partitions=2, per_partition=300)
    config = storage(tmp_path, "ckpt")
    with pytest.raises(ep.JobFailedError):
        wordcount(kafka_broker, data, target, parallelism=4).run(
            runtime="local", checkpoint=config, restart=ep.RestartStrategy(max_attempts=0),
            faults=[CrashDuringCommit("out", subtask=3, epoch=1, how="exit")])
    data.rest()
    second = wordcount(kafka_broker, data, target, parallelism=2).run(runtime="local", resume=True,
                                                                      checkpoint=config)
    assert second.restored_from[0] is not None, "run 2 restored no checkpoint"
    assert target.read() == running_counts(data.lines)
    assert not target.open_transactions()
