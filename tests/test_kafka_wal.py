"""KafkaSink's write-ahead log beyond its byte budget (spill files) and its commit thread
(commits in flight carried by the next checkpoint), against the real broker: what a
``read_committed`` reader sees equals a plain-Python oracle, every record once."""
from __future__ import annotations

import collections
import os
import pickle
import threading

import cloudpickle
import pytest

import test_kafka
from epochal.alignment.factory import SinkMode
from epochal.connectors.kafka import wal
from epochal.errors import ConfigError
from epochal.sinks import KafkaSink, SinkContext
from epochal.testing import CrashDuringCommit
from test_kafka import Input, checkpoint, committed_counts, run_gated, running_counts, wordcount

cloudpickle.register_pickle_by_value(test_kafka)  # its Count runs in task processes

pytest_plugins = ["kafka_broker"]


def _ctx(generation: int, job: str) -> SinkContext:
    return SinkContext("out", subtask=0, parallelism=1, job=job, generation=generation, mode=SinkMode.TRANSACTIONAL)


def _spill_files(folder) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.endswith(".wal")]


def test_records_beyond_the_budget_spill_and_survive_a_crash_between_completion_and_commit(kafka_broker, tmp_path):
    """A running word count whose sink keeps at most 2 KB of its write-ahead log in memory
    (the rest spills); the sink subtask dies after checkpoint 2 completed and before it
    committed: the next generation produces epoch 2 from the checkpoint and the spill file.
    The output equals the plain-Python count, and no spill file is left behind."""
    data = Input(kafka_broker, per_partition=500)
    out = kafka_broker.create_topic(None, 2)
    wal_dir = tmp_path / "wal"
    result = run_gated(wordcount(kafka_broker, data, out, name="kafka-wal", wal_budget=2000, wal_dir=str(wal_dir)),
                       data, runtime="local", checkpoint=checkpoint(tmp_path),
                       faults=[CrashDuringCommit("out", subtask=0, epoch=2, how="exit", after_epoch=1)])
    assert result.attempts == 2, f"the fault did not fire: {result.failures}"
    assert committed_counts(kafka_broker, out) == running_counts(data.lines)
    assert kafka_broker.open_transactions(out) == {}
    assert _spill_files(wal_dir) == [], "spill files of committed epochs were not deleted"


def test_a_spilled_epoch_is_produced_again_from_its_file_once(kafka_broker, tmp_path):
    """Writer by hand: 300 records with a 1 KB budget — most spill. The checkpoint state
    holds only the records kept in memory; after a 'crash' (never committed) a new
    generation produces the epoch from memory + file, each record once and in order."""
    topic = kafka_broker.create_topic(None, 1)
    sink = KafkaSink(kafka_broker.servers, topic, wal_budget="1KB", wal_dir=str(tmp_path / "wal"))
    records = [f"r{i:04d}-" + "x" * 40 for i in range(300)]
    lost = sink.create_writer(_ctx(0, "spill"))
    lost.restore(None)
    for i in range(0, 300, 25):
        lost.write_many(records[i:i + 25])
    state = lost.snapshot(1)
    job = lost.durability_job(1)
    job()  # fsync of the spill file, flush of the producer
    (_, handle), = state.pending
    assert handle.wal.spilled > 250 and len(handle.wal) == 300, "the budget did not make the log spill"
    assert len(pickle.dumps(state)) < 4000, "the checkpoint state holds more than the budget"
    assert len(_spill_files(tmp_path / "wal")) == 1
    # the process is lost: never committed, never released

    fresh = sink.create_writer(_ctx(1, "spill"))
    fresh.restore(pickle.loads(pickle.dumps(state)))  # fences the lost writer, produces epoch 1
    fresh.release()
    assert kafka_broker.values(topic) == [r.encode() for r in records]
    assert _spill_files(tmp_path / "wal") == [], "the committed epoch's spill file is still there"


def test_a_commit_in_flight_at_the_next_barrier_is_carried_by_its_checkpoint(kafka_broker, monkeypatch):
    """Epoch 1's commit is handed to the commit thread and has not run when barrier 2
    seals epoch 2 (held on purpose); the process is then lost. Checkpoint 2's state lists
    only epoch 2 as pending — epoch 1's handle rides in it (``carried``) — and a restored
    writer publishes both epochs, each once. Without the carried handle epoch 1 is lost."""
    topic = kafka_broker.create_topic(None, 1)
    sink = KafkaSink(kafka_broker.servers, topic)
    lost = sink.create_writer(_ctx(0, "carried"))
    hold, running = threading.Event(), threading.Event()
    commit_now = lost._commit_now

    def held(txn):
        running.set()
        assert hold.wait(60)
        commit_now(txn)

    monkeypatch.setattr(lost, "_commit_now", held)
    lost.restore(None)
    lost.write_many(["a1", "b1"])
    lost.snapshot(1)
    lost.durability_job(1)()
    lost.notify_epoch_complete(1)  # submitted, held on the commit thread
    assert running.wait(30)
    lost.write_many(["a2", "b2", "c2"])
    state = lost.snapshot(2)
    lost.durability_job(2)()
    assert [e for e, _ in state.pending] == [2]
    assert [h.epoch for h in state.pending[0][1].carried] == [1]
    assert kafka_broker.values(topic) == []

    fresh = sink.create_writer(_ctx(1, "carried"))
    fresh.restore(pickle.loads(pickle.dumps(state)))
    hold.set()  # the lost writer's commit now runs into the fence
    with pytest.raises(Exception, match="fenced|FENCED"):
        lost.wait_for_commits(60)
    fresh.release()
    assert collections.Counter(kafka_broker.values(topic)) == collections.Counter([b"a1", b"b1", b"a2", b"b2", b"c2"])
    assert kafka_broker.open_transactions(topic) == {}


def test_a_bad_wal_budget_is_refused_when_built():
    with pytest.raises(ConfigError, match="wal_budget"):
        KafkaSink("localhost:9092", "t", wal_budget="lots")
    with pytest.raises(ConfigError, match="wal_budget"):
        KafkaSink("localhost:9092", "t", wal_budget=-1)
    assert KafkaSink("localhost:9092", "t", wal_budget="64MB").wal_budget == 64_000_000


def test_without_a_budget_nothing_spills(kafka_broker, tmp_path):
    """``wal_budget=None``: the whole epoch stays in the writer's state (the checkpoint), no
    spill file is written, and the sink names no spill directory for a cluster to check."""
    topic = kafka_broker.create_topic(None, 1)
    sink = KafkaSink(kafka_broker.servers, topic, wal_budget=None, wal_dir=str(tmp_path / "wal"))
    assert sink.locations() == ()
    writer = sink.create_writer(_ctx(0, "nobudget"))
    writer.restore(None)
    records = [f"r{i:04d}-" + "x" * 40 for i in range(300)]
    writer.write_many(records)
    state = writer.snapshot(1)
    writer.durability_job(1)()
    (_, handle), = state.pending
    assert handle.wal.spilled == 0 and len(handle.wal.records) == 300
    assert _spill_files(tmp_path / "wal") == []
    writer.release()


def test_a_cluster_refuses_a_spill_directory_not_every_host_sees(tmp_path):
    """On a cluster a spilled epoch must be readable from whichever host restarts the task:
    the default (host-local) ``wal_dir`` is refused at start naming the sink and the path; a
    ``wal_dir`` under ``ClusterConfig.shared_paths``, or no budget, is accepted."""
    import epochal as ep
    from epochal.runtime.launch.cluster import check_storage_visible_from_every_host

    def plan(**options):
        flow = ep.Dataflow("wal-cluster")
        flow.source("s", ep.sources.CollectionSource([1])).sink("out", KafkaSink("k:9092", "t", **options))
        return flow.plan()

    with pytest.raises(ConfigError, match=r"sink 'out': file://.*epochal-kafka-wal is on the local disk"):
        check_storage_visible_from_every_host(plan(), "s3://b/ckpt", (), "spark://m:7077")
    shared = str(tmp_path / "nfs")
    check_storage_visible_from_every_host(plan(wal_dir=shared + "/wal"), "s3://b/ckpt", (shared,), "spark://m:7077")
    check_storage_visible_from_every_host(plan(wal_budget=None), "s3://b/ckpt", (), "spark://m:7077")


def test_a_segment_travels_in_a_checkpoint_as_it_was_written():
    """The records in memory are pickled as one blob without a memo (wal.WalSegment.__getstate__):
    every row comes back equal and in order — shared objects, headers, None keys and values —
    and a segment pickled before the blob existed (its ``records`` in the state) still loads."""
    shared = b"same object in many rows"
    rows = [(None if i % 3 == 0 else b"k%d" % i, shared if i % 2 else b"v%d" % i,
             [("h", b"x"), ("epoch", b"%d" % i)] if i % 5 == 0 else None, 1_700_000_000_000 + i) for i in range(1000)]
    rows.append((b"k", None, None, 1))  # a tombstone
    segment = wal.WalSegment()
    segment.append_many(rows, sum(len(r[1] or b"") for r in rows), wal.Budget(None), lambda: "unused")
    back = pickle.loads(pickle.dumps({"handle": segment}))["handle"]
    assert list(back) == rows and back.mem_bytes == segment.mem_bytes and back.first_ts == rows[0][3]
    assert "records" not in segment.__getstate__(), "the records were not pickled as one blob"
    legacy = wal.WalSegment.__new__(wal.WalSegment)
    legacy.__setstate__({"records": rows[:3], "mem_bytes": 7, "path": None, "spilled": 0, "spilled_bytes": 0,
                         "first_ts": rows[0][3]})
    assert list(legacy) == rows[:3]
