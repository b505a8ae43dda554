"""Settings and paths of the Kafka connectors that keep short epochs fast (issue 34).

KafkaSource's fetch keeps a short epoch fed: a poll takes what the consumer
already holds without waiting, and when it holds nothing it waits for the *first* message
only — never for a whole batch, which librdkafka's ``consume(n, timeout)`` does until n
messages came or the timeout passed (up to ``POLL_WAIT_S`` of every poll at low rates,
holding the records and the next barrier back).

KafkaSink keeps the task thread and the commit thread off slow Kafka calls: its producers
are all initialised when the writer starts, and an epoch produced at its commit is not
looked for in the topic when the writer began it itself."""
from __future__ import annotations

import collections
import json
import logging
import time

import epochal as ep
from epochal.alignment.factory import SinkMode
from epochal.connectors.kafka import probes
from epochal.connectors.kafka import source as kafka_source
from epochal.epochs.lineage import Lineage
from epochal.sinks import KafkaSink, SinkContext
from epochal.sources import KafkaSource

pytest_plugins = ["kafka_broker"]


class RecordingConsumer:
    """Passes every call to the real consumer; records ``consume``'s arguments."""

    def __init__(self, consumer):
        self._consumer = consumer
        self.calls: list[tuple[int, float]] = []

    def consume(self, num_messages=1, timeout=-1):
        self.calls.append((num_messages, timeout))
        return self._consumer.consume(num_messages=num_messages, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self._consumer, name)


def test_a_poll_never_waits_for_more_than_one_message(kafka_broker):
    topic = kafka_broker.create_topic(None, 1)
    kafka_broker.produce(topic, [f"r{i}" for i in range(30)], partition=0)
    src = KafkaSource(kafka_broker.servers, topic)
    reader = src.create_reader(src.splits(), None, subtask=0, parallelism=1)
    spy = reader._consumer = RecordingConsumer(reader._consumer)
    got: list[bytes] = []
    deadline = time.monotonic() + 60

    def poll_until(done):
        while not done() and time.monotonic() < deadline:
            got.extend(r.value for r in reader.poll(1000).records)

    try:
        poll_until(lambda: len(got) >= 30)
        poll_until(lambda: any(t != 0 for _, t in spy.calls))  # the topic holds no more: a poll must wait
        kafka_broker.produce(topic, [f"r{i}" for i in range(30, 60)], partition=0)
        poll_until(lambda: len(got) >= 60)
        assert [v.decode() for v in got] == [f"r{i}" for i in range(60)]
        waiting = [(n, t) for n, t in spy.calls if t != 0]
        assert waiting, "no poll waited for the brokers"
        assert all(n == 1 and t <= kafka_source.POLL_WAIT_S for n, t in waiting), (
            f"a consume call waited for a batch of messages: {sorted(set(waiting))}")
    finally:
        reader.close()


def test_too_few_producers_for_the_epochs_in_flight_is_named(caplog):
    """``producers`` below ``max_concurrent + 2`` makes epochs wait for their commit to be
    produced: the sink says so when the job starts, naming itself and the number to pass."""
    sink = KafkaSink("127.0.0.1:9", "t", producers=3)
    concurrent = ep.CheckpointConfig(interval="10ms", max_concurrent=3)
    with caplog.at_level(logging.WARNING, logger="epochal"):
        sink.check_run("out", concurrent, SinkMode.TRANSACTIONAL)
    assert "sink 'out': producers=3" in caplog.text and "producers=5)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="epochal"):
        KafkaSink("127.0.0.1:9", "t", producers=5).check_run("out", concurrent, SinkMode.TRANSACTIONAL)
        sink.check_run("out", ep.CheckpointConfig(interval="10ms"), SinkMode.TRANSACTIONAL)
        sink.check_run("out", concurrent, SinkMode.DIRECT)
    assert "producers" not in caplog.text


def test_stage_tracing_records_every_stage_of_every_committed_epoch(kafka_broker, tmp_path, monkeypatch):
    """``EPOCHAL_KAFKA_TRACE``: the job's processes write the fetch and per-epoch events that
    ``benchmarks/kafka_trace.py`` reads; every epoch that committed records has all of them,
    and the records the trace says were committed are the records of the topic."""

    src, out = kafka_broker.create_topic(None, 1), kafka_broker.create_topic(None, 1)
    kafka_broker.produce(src, [f"r{i}" for i in range(200)], partition=0)
    folder = tmp_path / "trace"
    monkeypatch.setenv("EPOCHAL_KAFKA_TRACE", str(folder))  # the task processes inherit it
    flow = ep.Dataflow("kafka-trace")
    flow.source("in", KafkaSource(kafka_broker.servers, src, stopping_offsets="latest")).sink(
        "out", KafkaSink(kafka_broker.servers, out))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval="50ms", storage=f"file://{tmp_path}/ck"))
    events = [json.loads(line) for f in folder.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sum(e["n"] for e in events if e["kind"] == "fetch") >= 200
    epochs: dict[int, dict] = {}
    for e in events:
        if "epoch" in e:
            epochs.setdefault(e["epoch"], {})[e["kind"]] = e
    written = {n: kinds for n, kinds in epochs.items() if kinds.get("seal", {}).get("count")}
    assert sum(k["seal"]["count"] for k in written.values()) == 200
    for n, kinds in written.items():
        assert {"write", "seal", "flushed", "complete", "commit_sent", "commit_ack"} <= set(kinds), (n, sorted(kinds))
        assert kinds["seal"]["t"] <= kinds["complete"]["t"] <= kinds["commit_sent"]["t"] <= kinds["commit_ack"]["t"]
    assert sum(len(v) for v in kafka_broker.read_committed(out).values()) == 200


def _writer(sink: KafkaSink, job: str):
    """A fresh job's writer, driven by hand: its lineage's marker group does not exist yet."""
    ctx = SinkContext("out", subtask=0, parallelism=1, job=job, generation=0, mode=SinkMode.TRANSACTIONAL,
                      lineage=Lineage("5a1b2c3d4e5f"))
    return sink.create_writer(ctx)


def test_every_producer_is_initialised_before_the_first_record(kafka_broker, monkeypatch):
    """``init_transactions`` takes 50–550 ms against this broker; done on the task thread
    when an epoch first needed its producer, the first three epochs after start each held
    their records and the barrier behind them back that long. A started writer opens its
    whole pool at once: streaming three epochs creates no producer."""
    topic = kafka_broker.create_topic(None, 1)
    writer = _writer(KafkaSink(kafka_broker.servers, topic, producers=3), "pool")
    writer.restore(None)
    created = []
    new_producer = writer._new_producer
    monkeypatch.setattr(writer, "_new_producer", lambda slot: created.append(slot) or new_producer(slot))
    try:
        for epoch in (1, 2, 3):  # none completes: each needs a producer of its own
            writer.write_many([f"e{epoch}-{i}" for i in range(20)])
            writer.snapshot(epoch)
            writer.durability_job(epoch)()
        assert created == [], f"producers of slots {created} were created while records streamed"
        for epoch in (1, 2, 3):
            writer.notify_epoch_complete(epoch)
        writer.wait_for_commits(60)
    finally:
        writer.release()
    want = [f"e{e}-{i}".encode() for e in (1, 2, 3) for i in range(20)]
    assert collections.Counter(kafka_broker.values(topic)) == collections.Counter(want)


def test_an_epoch_produced_at_its_commit_is_not_looked_for_in_the_topic(kafka_broker, monkeypatch):
    """With one producer, epoch 2 begins while epoch 1's transaction awaits its commit:
    epoch 2 is produced at its commit, from its handle. Its writer began it, so the topic
    cannot hold it: the writer must not scan the topic for it, although its (fresh) marker
    group had no marker at the start — that scan cost ~100 ms per epoch and fed a commit
    backlog that stalled the pipeline for seconds (issue 34). Every record lands once."""
    topic = kafka_broker.create_topic(None, 2)
    scans = []
    scan = probes.epoch_in_topic
    monkeypatch.setattr(probes, "epoch_in_topic", lambda *a, **k: scans.append(a[2]) or scan(*a, **k))
    writer = _writer(KafkaSink(kafka_broker.servers, topic, producers=1), "at-commit")
    writer.restore(None)
    try:
        writer.write_many([f"a{i}" for i in range(30)])
        writer.snapshot(1)
        writer.durability_job(1)()
        writer.write_many([f"b{i}" for i in range(40)])  # the only producer still holds epoch 1
        handle = dict(writer.snapshot(2).pending)[2]
        assert handle.slot is None and handle.count == 40, "epoch 2 was streamed, not produced at its commit"
        writer.notify_epoch_complete(1)
        writer.notify_epoch_complete(2)
        writer.wait_for_commits(60)
    finally:
        writer.release()
    assert scans == [], "the writer scanned the topic for an epoch it began itself"
    want = [f"a{i}".encode() for i in range(30)] + [f"b{i}".encode() for i in range(40)]
    assert collections.Counter(kafka_broker.values(topic)) == collections.Counter(want)


def test_a_commit_backlog_of_epochs_produced_at_commit_is_committed_in_one_transaction(kafka_broker, monkeypatch):
    """The commit thread falls behind (epoch 1's commit held on purpose); with one producer
    epochs 2–4 are produced at their commit and queue up. Once it runs again it commits
    the three in one transaction with epoch 4's marker — one round trip for the backlog, so
    it shrinks instead of feeding itself. Every record lands once, no transaction is left
    open, and the marker says epoch 4."""
    import threading

    topic = kafka_broker.create_topic(None, 2)
    sink = KafkaSink(kafka_broker.servers, topic, producers=1)
    writer = _writer(sink, "backlog")
    hold, running = threading.Event(), threading.Event()
    commit_now, together = writer._commit_now, writer._commit_together
    joined: list[list[int]] = []

    def held(txn):
        running.set()
        assert hold.wait(60)
        commit_now(txn)

    monkeypatch.setattr(writer, "_commit_now", held)
    monkeypatch.setattr(writer._committer, "_join", lambda txns: joined.append([t.epoch for t in txns]) or together(txns))
    want = []
    writer.restore(None)
    try:
        for epoch in (1, 2, 3, 4):
            rows = [f"e{epoch}-{i}" for i in range(25)]
            want += [r.encode() for r in rows]
            writer.write_many(rows)
            writer.snapshot(epoch)
            durable = writer.durability_job(epoch)  # None for an epoch produced at its commit
            if durable is not None:
                durable()
            writer.notify_epoch_complete(epoch)
            assert running.wait(30)
        hold.set()
        writer.wait_for_commits(60)
        assert writer._read_marker(writer._own, stable=True).epoch == 4
    finally:
        hold.set()
        writer.release()
    assert joined == [[2, 3, 4]], f"the backlog was not committed together: {joined}"
    assert collections.Counter(kafka_broker.values(topic)) == collections.Counter(want)
    assert kafka_broker.open_transactions(topic) == {}


def test_an_exactly_once_epoch_goes_to_the_broker_as_one_request_per_partition(kafka_broker):
    """An epoch's records are invisible until it commits, so the exactly-once producers
    linger (``writer.TRANSACTIONAL_LINGER_MS``) and the durability step's flush sends the
    epoch at once. With librdkafka's 5 ms the producers sent a request per partition every
    5 ms, filled the idempotent window of 5 in flight whenever the broker answered slower
    than 25 ms, and their threads spun (issue 47). Ten writes 10 ms apart, then the seal:
    the producer's statistics count one Produce request per partition, and the epoch
    commits in full."""
    topic = kafka_broker.create_topic(None, 2)
    stats: list[dict] = []
    sink = KafkaSink(kafka_broker.servers, topic, producers=1,
                     config={"statistics.interval.ms": 5, "stats_cb": lambda s: stats.append(json.loads(s))})
    writer = _writer(sink, "one-request")
    writer.restore(None)
    want = [f"r{i}-{j}" for i in range(10) for j in range(20)]
    try:
        for i in range(10):  # the epoch's records arrive over 100 ms, as a running task writes them
            writer.write_many(want[i * 20:(i + 1) * 20])
            time.sleep(0.01)
        writer.snapshot(1)
        writer.durability_job(1)()
        producer = writer._slots[0]
        stats.clear()
        while not stats:  # served by poll: the counters as they stand after the flush
            producer.poll(0.05)
        latest = {s["name"]: s for s in stats}
        produced = sum(b["req"].get("Produce", 0) for s in latest.values() for b in s["brokers"].values())
        assert 1 <= produced <= 2, f"epoch 1 went to the broker in {produced} Produce requests (2 partitions)"
        writer.notify_epoch_complete(1)
        writer.wait_for_commits(60)
    finally:
        writer.release()
    assert collections.Counter(kafka_broker.values(topic)) == collections.Counter(w.encode() for w in want)
