"""Kafka connectors against Apache Kafka (tests/kafka_broker.py): exactly-once topic to topic under
crashes, at-least-once, rescaling, partition discovery, event time per partition, zombies
and the errors users hit. Every pipeline's output is compared with a plain-Python oracle
read back by an independent read_committed consumer."""
from __future__ import annotations

import collections
import json
import os
import signal
import time

import pytest

import epochal as ep
from epochal.alignment.factory import SinkMode
from epochal.errors import ConfigError
from epochal.sinks import KafkaSink, SinkContext, SinkWriteError
from epochal.sources import KafkaSource
from epochal.testing import CrashAtRecord, CrashDuringCommit, CrashDuringDurability
from pipelines import no_count_lost

pytest_plugins = ["kafka_broker"]

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "koi"]


def text(p: int, i: int) -> str:
    """Line ``i`` of partition ``p``: 1–5 words, a pure function of its position."""
    x = (p * 1_000_003 + i * 7919 + 12345) * 1103515245 % (1 << 31)
    return " ".join(WORDS[(x >> (3 + j)) % len(WORDS)] for j in range(1 + x % 5))


class Input:
    """A topic whose lines arrive in two halves: the first before the job starts, the second
    (:meth:`rest`) once the test saw what it waits for (a completed checkpoint, a kill). So a
    fault that waits for a completed epoch always finds records left, however loaded the
    machine: no timing decides whether it fires. ``stops``: the end offsets of both halves,
    the job's stopping offsets."""

    def __init__(self, broker, partitions: int = 3, per_partition: int = 600):
        self.broker, self.partitions, self.n = broker, partitions, per_partition
        self.topic = broker.create_topic(None, partitions)
        self.half = per_partition // 2
        self.lines = [text(p, i) for p in range(partitions) for i in range(per_partition)]
        self.stops = {(self.topic, p): per_partition for p in range(partitions)}
        self._produce(0, self.half)
        self.rest_sent = False

    def _produce(self, start: int, end: int) -> None:
        for p in range(self.partitions):
            self.broker.produce(self.topic, [text(p, i) for i in range(start, end)], partition=p)

    def first_half(self) -> list[str]:
        return [text(p, i) for p in range(self.partitions) for i in range(self.half)]

    def rest(self) -> None:
        if not self.rest_sent:
            self.rest_sent = True
            self._produce(self.half, self.n)


def after_first_checkpoint(handle, then, timeout: float = 120.0):
    """Wait until ``handle``'s job completed a checkpoint, then call ``then()``."""
    deadline = time.monotonic() + timeout
    while not handle.completed_epochs:
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.01)
    then()


def run_gated(flow, data: Input, **options):
    """Run ``flow``; the second half of ``data`` is produced once a checkpoint completed."""
    handle = flow.start(**options)
    after_first_checkpoint(handle, data.rest)
    return handle.wait(300)


def running_counts(lines) -> collections.Counter:
    """Plain Python: what a keyed running word count emits, as a multiset of (word, n)."""
    words = collections.Counter(w for line in lines for w in line.split())
    return collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))


def committed_counts(broker, topic: str) -> collections.Counter:
    return collections.Counter(tuple(json.loads(v)) for v in broker.values(topic))


def wait_for_output(broker, out: str, expected: collections.Counter, what: str, timeout: float = 60.0) -> None:
    """Wait until ``out`` holds as many committed records as ``expected``."""
    deadline = time.monotonic() + timeout
    while sum(committed_counts(broker, out).values()) < sum(expected.values()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def stop_with_savepoint(handle, tmp_path, then=None) -> None:
    """Run ``then()`` on the running job, then stop it with a savepoint (cancel if ``then`` failed)."""
    try:
        if then is not None:
            then()
    except BaseException:
        handle.cancel()
        raise
    handle.stop_with_savepoint(str(tmp_path / "sp"))
    handle.wait(60)


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
        yield [word, self.n.value()]


def wordcount(broker, data: Input, out: str, *, parallelism: int = 2, name: str = "kafka-wc", pid_dir=None,
              sink_parallelism: int | None = None, **sink_kwargs) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=parallelism)
    (flow.source("lines", KafkaSource(broker.servers, data.topic, stopping_offsets=data.stops,
                                      deserializer=bytes.decode))
         .flat_map("split", lambda r: r.value.split())
         .key_by(lambda w: w)
         .process("count", Count(pid_dir))
         .sink("out", KafkaSink(broker.servers, out, key=lambda r: r[0], **sink_kwargs),
               parallelism=sink_parallelism))
    return flow


def checkpoint(tmp_path, interval: float = 0.1) -> ep.CheckpointConfig:
    return ep.CheckpointConfig(interval=interval, storage="file://" + str(tmp_path / "ckpt"))


# --------------------------------------------------------------------------- exactly-once under faults

FAULTS = {
    "crash-at-record": CrashAtRecord("count", subtask=1, record=900, how="exit", after_epoch=1),
    "crash-during-durability": CrashDuringDurability("out", subtask=0, epoch=2, how="exit"),
    "crash-between-completion-and-commit": CrashDuringCommit("out", subtask=0, epoch=2, how="exit", after_epoch=1),
}


@pytest.mark.parametrize("fault", list(FAULTS), ids=list(FAULTS))
def test_keyed_count_topic_to_topic_exactly_once_under_a_crash(kafka_broker, tmp_path, fault):
    """A 3-partition topic → running word count → another topic; one process crash. The
    output topic, read with read_committed, equals the plain-Python count: no duplicate,
    no gap, and no transaction is left open."""
    data = Input(kafka_broker)
    out = kafka_broker.create_topic(None, 2)
    result = run_gated(wordcount(kafka_broker, data, out), data, runtime="local", checkpoint=checkpoint(tmp_path),
                       faults=[FAULTS[fault]])
    assert result.attempts == 2, f"the fault did not fire: {result.failures}"
    assert "disconnected without finishing" in result.failures[0]
    if fault == "crash-between-completion-and-commit":  # it fires once epoch 2 completed
        assert result.restored_from[1] is not None
    assert committed_counts(kafka_broker, out) == running_counts(data.lines)
    assert kafka_broker.open_transactions(out) == {}


@pytest.mark.slow  # the same fault at parallelism 2: test_keyed_count_..._under_a_crash[crash-between-completion-and-commit]
def test_a_crash_between_completion_and_commit_produces_the_epoch_from_the_checkpoint(kafka_broker, tmp_path):
    """The hard case, watched closely: the sink subtask dies after checkpoint n completed
    and before it committed n's Kafka transaction, whose producer is gone with the process.
    The next generation finds epoch n missing from Kafka (its marker) and produces it from
    the restored handle (the write-ahead log)."""
    data = Input(kafka_broker, per_partition=400)
    out = kafka_broker.create_topic(None, 1)
    result = run_gated(wordcount(kafka_broker, data, out, parallelism=1), data, runtime="local",
                       checkpoint=checkpoint(tmp_path),
                       faults=[CrashDuringCommit("out", epoch=2, how="exit", after_epoch=1)])
    assert result.attempts == 2 and result.restored_from[1] is not None
    assert committed_counts(kafka_broker, out) == running_counts(data.lines)
    assert kafka_broker.open_transactions(out) == {}


def test_sigkill_of_the_sink_task_process_from_outside(kafka_broker, tmp_path):
    """The test SIGKILLs the process running count[0] → out[0] once the first checkpoint
    completed (not an epochal.testing hook), then sends the second half of the input: the
    output still equals the oracle."""
    data = Input(kafka_broker, per_partition=800)
    out = kafka_broker.create_topic(None, 2)
    pids = tmp_path / "pids"
    pids.mkdir()
    handle = wordcount(kafka_broker, data, out, pid_dir=str(pids)).start(runtime="local",
                                                                        checkpoint=checkpoint(tmp_path))
    killed = []

    def kill():
        for name in sorted(os.listdir(pids)):
            try:
                os.kill(int(name), signal.SIGKILL)
                killed.append(int(name))
                break
            except ProcessLookupError:
                continue
        data.rest()

    after_first_checkpoint(handle, kill)
    result = handle.wait(300)
    assert killed, "no task process was killed"
    assert result.attempts >= 2, f"the SIGKILL of {killed} caused no restart"
    assert committed_counts(kafka_broker, out) == running_counts(data.lines)
    assert kafka_broker.open_transactions(out) == {}


def test_at_least_once_contains_every_record(kafka_broker, tmp_path):
    data = Input(kafka_broker, per_partition=600)
    out = kafka_broker.create_topic(None, 2)
    result = run_gated(wordcount(kafka_broker, data, out), data, runtime="local", guarantee="at-least-once",
                       checkpoint=checkpoint(tmp_path),
                       faults=[CrashAtRecord("count", subtask=0, record=1200, how="exit", after_epoch=1)])
    assert result.attempts == 2
    assert not no_count_lost(committed_counts(kafka_broker, out), running_counts(data.lines))


@pytest.mark.slow  # Kafka on Spark: test_lifecycle.py's three external SIGKILLs on Spark; the commit crash:
#                   test_keyed_count_..._under_a_crash[crash-between-completion-and-commit] (same task code)
def test_on_spark_with_a_crash_between_completion_and_commit(kafka_broker, tmp_path, spark):
    data = Input(kafka_broker, per_partition=400)
    out = kafka_broker.create_topic(None, 2)
    result = run_gated(wordcount(kafka_broker, data, out), data, spark=spark, checkpoint=checkpoint(tmp_path),
                       faults=[CrashDuringCommit("out", subtask=1, epoch=2, how="exit", after_epoch=1)])
    assert result.runtime == "spark" and result.attempts == 2
    assert committed_counts(kafka_broker, out) == running_counts(data.lines)
    assert kafka_broker.open_transactions(out) == {}


# --------------------------------------------------------------------------- rescaling, discovery

def test_rescale_source_and_sink_2_to_3(kafka_broker, tmp_path):
    """The first half of the input is counted with parallelism 2 and the job stops with a
    savepoint; the rest is counted after resuming from it with parallelism 3: partitions
    move to other subtasks with their offsets, sink subtasks change, and the output still
    equals the oracle."""
    data = Input(kafka_broker, per_partition=600)
    out = kafka_broker.create_topic(None, 3)
    handle = wordcount(kafka_broker, data, out, parallelism=2).start(runtime="local", checkpoint=checkpoint(tmp_path))
    wait_for_output(kafka_broker, out, running_counts(data.first_half()), "the first half was not counted", 120)
    savepoint = handle.stop_with_savepoint(str(tmp_path / "sp"))
    assert handle.wait(60).stopped_with_savepoint == savepoint
    data.rest()
    result = wordcount(kafka_broker, data, out, parallelism=3).run(
        runtime="local", restore_from=savepoint, checkpoint=ep.CheckpointConfig(
            interval=0.1, storage="file://" + str(tmp_path / "ckpt2")))
    assert result.restored_from[0] is not None
    assert committed_counts(kafka_broker, out) == running_counts(data.lines)


def test_partitions_added_while_running_are_discovered(kafka_broker, tmp_path):
    """An unbounded source over a 2-partition topic; a third partition is added and written
    while the job runs. Its records are read (from its start) and counted exactly once."""
    src = kafka_broker.create_topic(None, 2)
    out = kafka_broker.create_topic(None, 1)
    first = [text(p, i) for p in range(2) for i in range(100)]
    for p in range(2):
        kafka_broker.produce(src, first[p * 100:(p + 1) * 100], partition=p)
    flow = ep.Dataflow("kafka-discovery", parallelism=2)
    (flow.source("lines", KafkaSource(kafka_broker.servers, src, deserializer=bytes.decode,
                                      discovery_interval=0.2))
         .flat_map("split", lambda r: r.value.split()).key_by(lambda w: w).process("count", Count())
         .sink("out", KafkaSink(kafka_broker.servers, out, key=lambda r: r[0])))
    handle = flow.start(runtime="local", checkpoint=checkpoint(tmp_path))
    added = [text(2, i) for i in range(150)]
    oracle = running_counts(first + added)

    def add_a_partition():
        wait_for_output(kafka_broker, out, running_counts(first), "the first partitions were not read")
        kafka_broker.add_partitions(src, 3)
        kafka_broker.produce(src, added, partition=2)
        wait_for_output(kafka_broker, out, oracle, "the added partition was not read")

    stop_with_savepoint(handle, tmp_path, add_a_partition)
    assert committed_counts(kafka_broker, out) == oracle


# --------------------------------------------------------------------------- event time per partition

def test_event_time_per_partition_with_one_skewed_partition(kafka_broker, tmp_path):
    """Partition 1's timestamps run 60 s behind partition 0's. One source subtask reads
    both; with per-partition watermarks no record of the slow partition is late, so
    1-minute tumbling counts from Kafka timestamps equal the plain-Python windows."""
    from epochal.windows import Sum, Tumbling

    topic = kafka_broker.create_topic(None, 2)
    base = int(time.time()) // 60 * 60_000 - 10 * 60_000  # recent: the broker's retention deletes old records
    events = {0: [(f"k{i % 3}", base + 60_000 + i * 100) for i in range(1200)],
              1: [(f"k{i % 3}", base + i * 100) for i in range(1200)]}
    for p, evs in events.items():
        kafka_broker.produce(topic, [k for k, _ in evs], partition=p, timestamps=[ts for _, ts in evs])
    out = str(tmp_path / "windows")
    flow = ep.Dataflow("kafka-event-time", parallelism=1)
    (flow.source("in", KafkaSource(kafka_broker.servers, topic, stopping_offsets="latest", deserializer=bytes.decode))
         .with_watermarks("ts", timestamp=lambda r: r.timestamp, timestamp_unit="ms", max_out_of_orderness="1s")
         .key_by(lambda r: r.value)
         .window(Tumbling("1min"))
         .aggregate("per-minute", Sum(lambda r: 1))
         .sink("out", ep.sinks.FileSink(out)))
    result = flow.run(runtime="local", checkpoint=checkpoint(tmp_path))
    assert result.attempts == 1
    got = collections.Counter((r["key"], r["start"], r["value"]) for r in ep.sinks.read_committed(out))
    oracle = collections.Counter()
    for evs in events.values():
        for k, ts in evs:
            oracle[(k, ts // 60_000 * 60)] += 1
    assert got == collections.Counter((k, start, n) for (k, start), n in oracle.items())
    assert result.task_metrics and sum(t.get("late_dropped", 0) for t in result.task_metrics.values()) == 0


# --------------------------------------------------------------------------- zombies, at the writer

def _ctx(generation: int, mode=SinkMode.TRANSACTIONAL, subtask: int = 0, parallelism: int = 1) -> SinkContext:
    return SinkContext("out", subtask=subtask, parallelism=parallelism, job="zombies", generation=generation,
                       mode=mode)


def test_a_restored_writer_fences_the_zombie_and_publishes_each_epoch_once(kafka_broker):
    """Generation 0 writes epochs 1 and 2 and pre-commits both; epoch 1 commits, then the
    process is 'lost' (never closed). Generation 1 restores from checkpoint 2 — its pending
    epochs 1 and 2: epoch 1 is in Kafka already (the marker says so) and is skipped,
    epoch 2 is produced from the handle. The zombie's late commit of epoch 2 is fenced."""
    topic = kafka_broker.create_topic(None, 1)
    sink = KafkaSink(kafka_broker.servers, topic)
    zombie = sink.create_writer(_ctx(0))
    zombie.restore(None)
    zombie.write_many(["a1", "b1"])
    zombie.snapshot(1)
    zombie.durability_job(1)()
    zombie.write_many(["a2", "b2", "c2"])
    state = zombie.snapshot(2)
    zombie.durability_job(2)()
    zombie.notify_epoch_complete(1)
    zombie.wait_for_commits()  # the commit thread commits; the test looks once it did
    assert sorted(kafka_broker.values(topic)) == [b"a1", b"b1"]
    assert kafka_broker.open_transactions(topic), "epoch 2's transaction should be open"

    fresh = sink.create_writer(_ctx(1))
    fresh.restore(state)  # pending: epochs 1 (committed) and 2 (not)
    assert sorted(kafka_broker.values(topic)) == [b"a1", b"a2", b"b1", b"b2", b"c2"]
    assert kafka_broker.open_transactions(topic) == {}, "the zombie's open transaction was not aborted"
    with pytest.raises(Exception, match="fenced|FENCED"):
        zombie.notify_epoch_complete(2)
        zombie.wait_for_commits()
    again = sink.create_writer(_ctx(2))
    again.restore(state)  # a second recovery from the same checkpoint is a no-op
    assert sorted(kafka_broker.values(topic)) == [b"a1", b"a2", b"b1", b"b2", b"c2"]


def test_an_epoch_produced_at_commit_when_no_producer_is_free(kafka_broker):
    """With one streaming producer, epoch 2 begins while epoch 1 awaits completion: it is
    kept in the handle only and produced at its commit; both epochs appear exactly once."""
    topic = kafka_broker.create_topic(None, 1)
    w = KafkaSink(kafka_broker.servers, topic, producers=1).create_writer(_ctx(0))
    w.restore(None)
    w.write_many(["e1"])
    w.snapshot(1)
    w.write_many(["e2a", "e2b"])
    state = w.snapshot(2)
    assert [h.slot for _, h in state.pending] == [0, None]
    w.durability_job(2)()
    w.notify_epoch_complete(2)
    w.wait_for_commits()
    assert sorted(kafka_broker.values(topic)) == [b"e1", b"e2a", b"e2b"]


# --------------------------------------------------------------------------- errors users hit

def test_unreachable_broker_fails_fast_naming_the_address():
    dead = "127.0.0.1:9"  # discard port: nothing listens
    flow = ep.Dataflow("kafka-dead")
    flow.source("in", KafkaSource(dead, "t", stopping_offsets="latest")).sink("out", ep.sinks.FileSink("/tmp/x"))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"cannot reach the Kafka brokers at 127\.0\.0\.1:9"):
        flow.run(runtime="local")
    assert time.monotonic() - t0 < 30


def test_missing_topics_are_named_for_source_and_sink(kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(None, 1)
    flow = ep.Dataflow("kafka-missing-in")
    flow.source("in", KafkaSource(kafka_broker.servers, "no-such-topic")).sink("out", ep.sinks.FileSink(str(tmp_path)))
    with pytest.raises(ConfigError, match=r"topic\(s\) \['no-such-topic'\] do not exist"):
        flow.run(runtime="local")
    flow = ep.Dataflow("kafka-missing-out")
    flow.source("in", KafkaSource(kafka_broker.servers, topic, stopping_offsets="latest")).sink(
        "sink-x", KafkaSink(kafka_broker.servers, "no-such-output"))
    with pytest.raises(ConfigError, match=r"sink 'sink-x'.*\['no-such-output'\] do not exist"):
        flow.run(runtime="local")


def test_transaction_timeout_shorter_than_an_epoch_is_refused(kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(None, 1)
    flow = ep.Dataflow("kafka-timeout")
    flow.source("in", KafkaSource(kafka_broker.servers, topic, stopping_offsets="latest")).sink(
        "out", KafkaSink(kafka_broker.servers, topic, transaction_timeout="30s"))
    with pytest.raises(ConfigError, match=r"sink 'out': transaction_timeout=30 s is shorter"):
        flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval="10s", timeout="60s"))


def test_a_record_the_serializer_cannot_take_names_the_sink_and_record(kafka_broker):
    topic = kafka_broker.create_topic(None, 1)
    w = KafkaSink(kafka_broker.servers, topic).create_writer(_ctx(0))
    w.restore(None)
    with pytest.raises(SinkWriteError, match=r"sink 'out' cannot write record \{1, 2\}.*not JSON serializable"):
        w.write({1, 2})


def test_a_record_the_deserializer_rejects_names_partition_and_offset(kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(None, 1)
    kafka_broker.produce(topic, [b'{"a": 1}', b"not json"], partition=0)
    flow = ep.Dataflow("kafka-bad-record")
    flow.source("in", KafkaSource(kafka_broker.servers, topic, stopping_offsets="latest",
                                  deserializer=json.loads)).sink("out", ep.sinks.FileSink(str(tmp_path / "o")))
    with pytest.raises(ep.JobFailedError, match=rf"offset 1 of partition {topic}:0"):
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=0))


def test_bad_arguments_are_refused_when_built():
    with pytest.raises(ConfigError, match="bootstrap_servers"):
        KafkaSource("", "t")
    with pytest.raises(ConfigError, match="topics"):
        KafkaSource("h:1", [])
    with pytest.raises(ConfigError, match="starting_offsets"):
        KafkaSource("h:1", "t", starting_offsets="middle")
    with pytest.raises(ConfigError, match=r"config\['transactional.id'\]: set by epochal"):
        KafkaSink("h:1", "t", config={"transactional.id": "x"})
    with pytest.raises(ConfigError, match="commit_offsets=True needs config\\['group.id'\\]"):
        KafkaSource("h:1", "t", commit_offsets=True)


def test_starting_at_latest_and_group_offsets_for_lag_monitoring(kafka_broker, tmp_path):
    """``starting_offsets="latest"`` skips what the topic held when the job started (resolved
    to concrete offsets at once, so the first checkpoint holds them); ``commit_offsets``
    commits each completed epoch's offsets to the consumer group, which lag monitoring
    reads — and which end at the topic's end once the job stopped with a savepoint."""
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka_broker.create_topic(None, 2)
    out = kafka_broker.create_topic(None, 1)
    old = [text(9, i) for i in range(50)]
    kafka_broker.produce(topic, old, partition=0)
    group = f"lag-{topic}"
    flow = ep.Dataflow("kafka-latest", parallelism=1)
    (flow.source("lines", KafkaSource(kafka_broker.servers, topic, starting_offsets="latest", deserializer=bytes.decode,
                                      commit_offsets=True, config={"group.id": group}))
         .flat_map("split", lambda r: r.value.split()).key_by(lambda w: w).process("count", Count())
         .sink("out", KafkaSink(kafka_broker.servers, out, key=lambda r: r[0])))
    handle = flow.start(runtime="local", checkpoint=checkpoint(tmp_path))
    new = [text(8, i) for i in range(80)]

    def produce_later():
        deadline = time.monotonic() + 30
        while len(handle.completed_epochs) < 2:  # the reader resolved "latest" before these
            assert time.monotonic() < deadline
            time.sleep(0.02)
        kafka_broker.produce(topic, new[:40], partition=0)
        kafka_broker.produce(topic, new[40:], partition=1)
        wait_for_output(kafka_broker, out, running_counts(new), "the new records were not read")

    stop_with_savepoint(handle, tmp_path, produce_later)
    assert committed_counts(kafka_broker, out) == running_counts(new)
    ends = kafka_broker.end_offsets(topic)
    c = Consumer({"bootstrap.servers": kafka_broker.servers, "group.id": group})
    try:
        deadline = time.monotonic() + 10
        while True:  # the commit is asynchronous
            got = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in ends], timeout=10)}
            if got == ends or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        c.close()
    assert got == ends


def test_the_kafka_example_runs_and_checks_itself(tmp_path):
    """examples/kafka_wordcount.py (its own broker, a crash between completion and commit)
    on the local runtime: it exits non-zero if the output differs from its plain-Python count."""
    import subprocess
    import sys

    from kafka_broker import cannot_start_broker

    if cannot_start_broker():
        pytest.skip(cannot_start_broker())
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "kafka_wordcount.py")
    proc = subprocess.run([sys.executable, example, "--runtime", "local", "--lines", "6000"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 attempt(s)" in proc.stdout and "each update once: yes" in proc.stdout
