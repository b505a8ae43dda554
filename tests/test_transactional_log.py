"""The Kafka-style transactional log: LogSink writers, read_committed readers, LogSource.

Part 1 drives writers without an engine (as tests/test_file_sink.py does): a scripted runtime
plays restore / write / snapshot (the seal) / the uploader's durability job (right away or
after the next epoch's records) / complete / notify and kills the task at chosen points, or
fails a durability step with an I/O error;
every crash restarts a NEW writer of generation + 1 from the latest completed checkpoint, and
the dead writer is kept as a zombie. Exactly-once: each partition's committed records equal
the golden run's, in order. Part 2 runs pipelines on the local runtime with injected faults,
including two pipelines chained through the log.
"""
from __future__ import annotations

import collections
import json
import pickle
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import cloudpickle
import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.alignment.factory import SinkMode
from epochal.errors import ConfigError, EpochalError, InjectedFault
from epochal.sinks import LogSink, ProducerFencedError, SinkContext, SinkWriteError, TransactionalLog, read_committed
from epochal.sinks.base import SinkCommitError, TransactionStateError
from epochal.sources import LogReader, LogSource, UnknownTopicError, read_committed_log
from epochal.testing import CrashAtRecord, CrashDuringCommit

from sinkfaults import lossy
from pipelines import canon, contains_all, line, unique_dir

TX, DIRECT = SinkMode.TRANSACTIONAL, SinkMode.DIRECT
TOPIC = "events"


class Crash(Exception):
    """The simulated task process died."""


def ctx(gen: int = 0, mode: SinkMode = TX, subtask: int = 0) -> SinkContext:
    return SinkContext("log", subtask=subtask, parallelism=2, job="job", generation=gen, mode=mode)


def by_key(record):
    return record["k"]


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    if request.param == "local":
        yield "file://" + str(tmp_path / "log")
        return
    url = f"memory://epochal-log-{uuid.uuid4().hex}"
    yield url
    drop_memory(url)


def make_epochs(sizes: list[int]) -> list[list[dict]]:
    ids = iter(range(10**6))
    return [[{"id": (i := next(ids)), "k": f"k{i % 5}", "epoch": n} for _ in range(k)] for n, k in enumerate(sizes, 1)]


def flat(log: dict) -> list:
    """All records of a read_committed_log result, partition after partition."""
    return [r for p in sorted(log) for r in log[p]]


def staged(root: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(root)
    return [p for p in fs.find(path) if "/_staging/" in p]


@dataclass
class Faults:
    """Step labels where the task dies (``("write", n, i)``, ``("durable", n)``: after the
    seal, before the durability step, ``("complete", n)``: after the pre-commit, before
    checkpoint n is durable, ``("notify", n)``, ``("restore", gen)``); ``fail_publish_at``
    numbers per-partition publishes over all writers: that one raises. ``fail_durable_at``:
    epochs whose durability step loses its batches and raises EIO (the epoch is declined)."""

    crash_at: set = field(default_factory=set)
    fail_publish_at: set = field(default_factory=set)
    notify_lag: int = 0
    aborted: frozenset = frozenset()
    fail_durable_at: set = field(default_factory=set)
    durability_lag: bool = False  # job n runs after epoch n + 1's records were written

    def copy(self) -> Faults:
        return Faults(set(self.crash_at), set(self.fail_publish_at), self.notify_lag, self.aborted,
                      set(self.fail_durable_at), self.durability_lag)


def barrier(w, n: int):
    """snapshot(n) plus its durability job, as the runtime runs them (job before the ack)."""
    state = w.snapshot(n)
    job = w.durability_job(n)
    if job is not None:
        job()
    return state


def run_job(sink: LogSink, epochs: list[list], faults: Faults | None = None, mode=TX) -> dict:
    """Drive generations of writers until one reaches close(); returns run facts."""
    faults = faults or Faults()
    completed: dict[int, bytes] = {}
    publishes, zombies = [0], []

    def tick(label):
        if label in faults.crash_at:
            faults.crash_at.discard(label)
            raise Crash(label)

    def flaky(orig):
        def publish(txn, p):
            publishes[0] += 1
            if publishes[0] - 1 in faults.fail_publish_at:
                raise InjectedFault(f"publish #{publishes[0] - 1}")
            orig(txn, p)
        return publish

    for gen in range(50):
        w = sink.create_writer(ctx(gen, mode))
        w._publish = flaky(w._publish)
        w.pre_commit = lossy(faults.fail_durable_at, w, lambda txn: [(w.log.fs, w._staged(txn, p)) for p in txn.records])
        try:
            m = max(completed, default=0)
            tick(("restore", gen))
            w.restore(pickle.loads(completed[m]) if m else None)
            notified = [m]

            def acknowledge(n, snap, job, w=w, notified=notified):
                """The uploader's part: durability job, then the ack; checkpoint n completes."""
                tick(("durable", n))
                try:
                    if job is not None:
                        job()
                except OSError:
                    return  # declined: checkpoint n never completes
                state = pickle.dumps(snap)
                tick(("complete", n))
                if n not in faults.aborted or n == len(epochs):
                    completed[n] = state
                due = n if n == len(epochs) else max((k for k in completed if k <= n - faults.notify_lag), default=0)
                if due > notified[0]:
                    tick(("notify", due))
                    w.notify_epoch_complete(due)
                    notified[0] = due

            lagged = None
            for n in range(m + 1, len(epochs) + 1):
                for i, record in enumerate(epochs[n - 1]):
                    tick(("write", n, i))
                    w.write(record)
                if lagged is not None:
                    acknowledge(*lagged)
                    lagged = None
                snap = w.snapshot(n)
                job = w.durability_job(n)
                if faults.durability_lag and n < len(epochs):
                    lagged = (n, snap, job)
                else:
                    acknowledge(n, snap, job)
            w.close()
            return {"generations": gen + 1, "zombies": zombies, "completed": completed}
        except (Crash, EpochalError, OSError):  # InjectedFault, a lost transaction (DIRECT: inline)
            zombies.append(w)
    raise AssertionError("job never finished")


def golden(epochs, mode=TX) -> dict:
    url = f"memory://epochal-golden-{uuid.uuid4().hex}"
    run_job(LogSink(url, TOPIC, partitions=3, key_fn=by_key), epochs, mode=mode)
    try:
        return read_committed_log(url, TOPIC)
    finally:
        drop_memory(url)


def drop_memory(url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


# ------------------------------------------------------------------ writer protocol vs golden

CRASHES = {
    "while writing": Faults(crash_at={("write", 2, 1)}),
    "after pre-commit, before complete": Faults(crash_at={("complete", 2)}),
    "after complete, before notify": Faults(crash_at={("notify", 2)}),
    "during commit, after one partition": Faults(fail_publish_at={4}),
    "during recovery re-commit": Faults(fail_publish_at={4, 5}),
    "during restore": Faults(crash_at={("notify", 2), ("restore", 1)}),
    "lagging notify, aborted checkpoint": Faults(crash_at={("write", 4, 0)}, notify_lag=1, aborted=frozenset({2})),
    "after the seal, before the durability step": Faults(crash_at={("durable", 2)}),
    "durability step lagging, crash in the next epoch": Faults(crash_at={("write", 2, 1)}, durability_lag=True),
    "durability step I/O error": Faults(fail_durable_at={2}),
    "durability step I/O error, lagging": Faults(fail_durable_at={2}, durability_lag=True),
    "durability step I/O error in the final epoch": Faults(fail_durable_at={4}),
}


@pytest.mark.parametrize("scenario", list(CRASHES))
def test_crash_at_each_phase_equals_golden(root, scenario):
    epochs = make_epochs([4, 6, 0, 3])
    f = CRASHES[scenario]
    facts = run_job(LogSink(root, TOPIC, partitions=3, key_fn=by_key), epochs, f.copy())
    assert facts["generations"] > 1, "the fault did not fire"
    got = read_committed_log(root, TOPIC)
    assert got == golden(epochs)  # per partition, in offset order
    assert canon(r for recs in got.values() for r in recs) == canon(r for e in epochs for r in e)
    assert staged(root) == []
    last = pickle.loads(facts["completed"][max(facts["completed"])])
    for zombie in [z for z in facts["zombies"] if z._epoch_of_producer is not None]:  # restored ones: fenced
        for _, handle in (p for p in last.pending if p[1].records):
            with pytest.raises(ProducerFencedError, match="zombie"):
                zombie.commit(handle)


def test_partial_commit_is_finished_by_recovery_and_a_second_recovery_is_a_noop(root):
    sink = LogSink(root, TOPIC, partitions=3, key_fn=by_key)
    epochs = make_epochs([10])
    w = sink.create_writer(ctx(0))
    w.restore(None)
    for r in epochs[0]:
        w.write(r)
    state = pickle.loads(pickle.dumps(w.snapshot(1)))
    orig, calls = w._publish, []

    def publish_then_die(txn, p):
        if calls:
            raise InjectedFault("crash in commit")
        calls.append(p)
        orig(txn, p)

    w._publish = publish_then_die
    with pytest.raises(InjectedFault):
        w.notify_epoch_complete(1)
    partly = read_committed_log(root, TOPIC)
    assert [p for p, recs in partly.items() if recs] == calls  # one partition visible, whole
    for gen in (1, 2):
        sink.create_writer(ctx(gen)).restore(state)  # preemptive re-commit (seed 004 §4.1.3.1)
        assert read_committed_log(root, TOPIC) == golden(epochs)


def test_empty_epochs_publish_nothing_and_offsets_are_dense(root):
    sink = LogSink(root, TOPIC, partitions=1)
    a, b = sink.create_writer(ctx(0, subtask=0)), sink.create_writer(ctx(0, subtask=1))
    a.restore(None), b.restore(None)
    for n in range(1, 4):
        for k in range(n):
            a.write({"w": "a", "n": n, "k": k})
        if n != 2:
            b.write({"w": "b", "n": n})
        a.snapshot(n), b.snapshot(n)
        b.notify_epoch_complete(n), a.notify_epoch_complete(n)
    reader = LogReader(root, TOPIC, 0)
    batches = reader.batches()
    assert [(x.base_offset, x.count) for x in batches] == [(0, 1), (1, 1), (2, 2), (4, 1), (5, 3)]
    assert [x.transactional_id[-1] for x in batches] == ["1", "0", "0", "1", "0"]
    assert reader.end_offset() == 8
    assert reader.read(3, 2) == [{"w": "a", "n": 2, "k": 1}, {"w": "b", "n": 3}]
    assert [o for o, _ in reader.records(6)] == [6, 7] and reader.read(8) == []
    with pytest.raises(ValueError, match="out of range"):
        reader.read(9)


# ------------------------------------------------------------------ fencing and isolation


def test_zombie_of_older_generation_cannot_commit_after_new_writer_restored(root):
    sink = LogSink(root, TOPIC, partitions=2, key_fn=by_key)
    zombie = sink.create_writer(ctx(0))
    zombie.restore(None)
    zombie.write({"k": "a", "e": 1})
    s1 = barrier(zombie, 1)  # checkpoint 1 completes; the notification is late
    live = sink.create_writer(ctx(1))
    live.restore(s1)  # a new producer epoch; its re-commit of epoch 1 succeeds
    with pytest.raises(ProducerFencedError, match=r"commit .*producer epoch 0 < current 1.*zombie"):
        zombie.notify_epoch_complete(1)
    with pytest.raises(TransactionStateError, match="restore a new writer"):
        zombie.write({"k": "a", "e": 2})
    live.write({"k": "a", "e": 2})
    live.snapshot(2)
    live.notify_epoch_complete(2)
    assert flat(read_committed_log(root, TOPIC)) == [{"k": "a", "e": 1}, {"k": "a", "e": 2}]
    fs, path = fsspec.core.url_to_fs(root)
    assert json.loads(fs.cat_file(f"{path}/{TOPIC}/_producers/job-log-0.json"))["producer_epoch"] == 1


def test_zombie_pre_commit_fails_early_and_its_data_never_appears(root):
    sink = LogSink(root, TOPIC, partitions=2)
    zombie = sink.create_writer(ctx(0, subtask=1))
    zombie.restore(None)
    zombie.write({"zombie": 1})
    sink.create_writer(ctx(1, subtask=1)).restore(None)  # deletes the zombie's staged batch
    zombie.snapshot(1)  # the seal does no I/O...
    with pytest.raises(ProducerFencedError, match="pre_commit"):
        zombie.durability_job(1)()  # ...its durability step finds the fence: epoch 1 is declined
    with pytest.raises(SinkCommitError, match="durability step of epoch 1 raised ProducerFencedError"):
        zombie.snapshot(2)
    assert read_committed_log(root, TOPIC) == {0: [], 1: []} and staged(root) == []


def test_zombie_commit_racing_the_fence_is_invisible(root):
    sink = LogSink(root, TOPIC, partitions=2)
    zombie = sink.create_writer(ctx(0))
    zombie.restore(None)
    zombie.write({"zombie": 1})
    zombie.snapshot(1)
    TransactionalLog(root, TOPIC).init_producer("job-log-0")  # a new writer starts: the fence
    zombie._check_not_fenced = lambda op, txn: None  # the zombie checked just before the fence
    zombie.notify_epoch_complete(1)  # ... and created its marker after it
    assert read_committed_log(root, TOPIC) == {0: [], 1: []}
    assert TransactionalLog(root, TOPIC).marker(0, 1)["type"] == "commit"  # the marker is there


def test_read_committed_never_sees_open_prepared_or_aborted_data(root):
    w = LogSink(root, TOPIC, partitions=2, key_fn=by_key).create_writer(ctx(0))
    w.restore(None)
    for i in range(6):
        w.write({"k": i, "e": 1})
    w.snapshot(1)
    assert staged(root) and read_committed_log(root, TOPIC) == {0: [], 1: []}  # pre-committed
    w.write({"k": 0, "e": 2})
    w.close()  # aborts the open transaction of epoch 2; epoch 1 stays pending
    assert read_committed_log(root, TOPIC) == {0: [], 1: []}
    assert all("e0000000001" in p for p in staged(root))
    w2 = LogSink(root, TOPIC).create_writer(ctx(1))
    w2.restore(None)  # checkpoint 1 never completed: a fresh start removes its staged data
    assert staged(root) == [] and read_committed_log(root, TOPIC) == {0: [], 1: []}


# ------------------------------------------------------------------ DIRECT, errors, config


def test_direct_mode_publishes_at_barrier_and_crash_gives_at_least_once(root):
    epochs = make_epochs([3, 4, 2])
    expected = golden(epochs, DIRECT)
    run_job(LogSink(root, TOPIC, partitions=3, key_fn=by_key), epochs,
            Faults(crash_at={("complete", 2), ("write", 3, 1)}), mode=DIRECT)
    got = read_committed_log(root, TOPIC)
    for p in expected:
        assert contains_all(canon(got[p]), canon(expected[p])) and set(canon(got[p])) == set(canon(expected[p]))
    assert sum(map(len, got.values())) > sum(map(len, expected.values()))  # duplicates, nothing lost


def failing_key(record):
    if record.get("ok"):
        return 0
    raise KeyError("no key")


def x_key(record):
    return record["x"]


@pytest.mark.parametrize("record, key_fn, reason", [
    ({"x": object()}, None, "not JSON-serializable"),
    ({"x": 1}, failing_key, "key_fn raised KeyError"),
    ({"x": [1]}, x_key, "cannot partition by key"),
])
def test_sink_write_error_names_sink_record_reason_and_publishes_nothing(root, record, key_fn, reason):
    sink = LogSink(root, TOPIC, partitions=2, key_fn=key_fn)
    w = sink.create_writer(ctx(0))
    w.restore(None)
    w.write({"x": 0, "ok": True})
    s1 = barrier(w, 1)
    w.write({"x": 2, "ok": True})
    with pytest.raises(SinkWriteError) as info:
        w.write(record)
    assert "'log'" in str(info.value) and reason in str(info.value) and info.value.sink_name == "log"
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)
    with pytest.raises(TransactionStateError):
        w.snapshot(2)
    sink.create_writer(ctx(1)).restore(s1)
    assert flat(read_committed_log(root, TOPIC)) == [{"x": 0, "ok": True}]
    assert staged(root) == []


def test_config_errors_and_topic_metadata(root):
    for bad in [{"topic": "a/b"}, {"partitions": 0}, {"key_fn": 3}, {"transactional_id": "x y"}]:
        with pytest.raises(ConfigError):
            LogSink(root, **{"topic": TOPIC, **bad})
    with pytest.raises(UnknownTopicError, match="does not exist"):
        read_committed_log(root, "missing")
    with pytest.raises(UnknownTopicError, match="partitions="):
        LogSource(root, "missing").splits()
    assert TransactionalLog.create_topic(root, TOPIC, 3).partitions == 3
    assert TransactionalLog.create_topic(root, TOPIC, 3).partitions == 3  # idempotent
    with pytest.raises(ConfigError, match="exists with 3 partitions"):
        TransactionalLog.create_topic(root, TOPIC, 4)
    with pytest.raises(ConfigError, match="exists with 3 partitions"):
        LogSink(root, TOPIC, partitions=2).create_writer(ctx(0))
    assert LogSink(root, TOPIC).create_writer(ctx(0)).log.partitions == 3  # existing topic
    assert LogSink(root, "auto").create_writer(ctx(0)).log.partitions == 2  # one per subtask
    sink = cloudpickle.loads(cloudpickle.dumps(LogSink(root, TOPIC, key_fn=by_key, transactional_id="app")))
    assert sink.create_writer(ctx(0, subtask=1)).txid == "app-1"


# ------------------------------------------------------------------ Hypothesis


@st.composite
def crash_plans(draw):
    sizes = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5))
    n = len(sizes)
    return sizes, Faults(
        crash_at={("write", e, i) for e, i in draw(st.lists(st.tuples(st.integers(1, n), st.integers(0, 3)),
                                                            max_size=2))}
        | {(kind, draw(st.integers(1, n))) for kind in draw(st.sets(st.sampled_from(["durable", "complete",
                                                                                     "notify"])))},
        fail_publish_at=set(draw(st.lists(st.integers(0, 10), max_size=2))),
        notify_lag=draw(st.integers(0, 2)),
        aborted=frozenset(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=2))) if n > 1 else frozenset(),
        fail_durable_at=set(draw(st.lists(st.integers(1, n), max_size=2))),
        durability_lag=draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(plan=crash_plans(), mode=st.sampled_from([TX, DIRECT]))
def test_any_crash_points_keep_the_guarantee(plan, mode):
    sizes, faults = plan
    epochs = make_epochs(sizes)
    url = f"memory://epochal-hyp-{uuid.uuid4().hex}"
    run_job(LogSink(url, TOPIC, partitions=3, key_fn=by_key), epochs, faults, mode=mode)
    got, expected = read_committed_log(url, TOPIC), golden(epochs, mode)
    drop_memory(url)
    if mode is TX:
        assert got == expected
    else:
        assert all(set(canon(got[p])) == set(canon(expected[p])) for p in expected)


# ------------------------------------------------------------------ LogSource


def test_log_source_reads_committed_offsets_and_restores(root):
    w = LogSink(root, TOPIC, partitions=2, key_fn=by_key).create_writer(ctx(0))
    w.restore(None)
    for i in range(10):
        w.write({"k": i, "i": i})
    w.snapshot(1), w.notify_epoch_complete(1)
    src = cloudpickle.loads(cloudpickle.dumps(LogSource(root, TOPIC)))
    assert src.splits() == [0, 1]
    r = src.create_reader([0, 1], None)
    first = r.poll(3).records
    state = r.snapshot()
    assert len(first) == 3 and sum(state.values()) == 3
    rest = src.create_reader([0, 1], json.loads(json.dumps(state)))
    polls = [rest.poll(4) for _ in range(5)]
    assert polls[-1].finished and not polls[-1].records
    assert sorted(x["i"] for x in first + [x for p in polls for x in p.records]) == list(range(10))
    assert LogSource(root, TOPIC, limit=2).create_reader([1], None).poll(10).records == read_committed_log(
        root, TOPIC)[1][:2]


def test_log_source_follow_idles_until_new_commits(root):
    w = LogSink(root, TOPIC, partitions=1).create_writer(ctx(0))
    w.restore(None)
    r = LogSource(root, TOPIC, follow=True, poll_interval=0).create_reader([0], None)
    assert r.poll(5).idle
    w.write({"n": 1}), w.snapshot(1)
    assert r.poll(5).idle  # pre-committed only
    w.notify_epoch_complete(1)
    assert r.poll(5).records == [{"n": 1}] and r.poll(5).idle
    assert LogSource(root, TOPIC, follow=True, limit=1).create_reader([0], {"0": 1}).poll(5).finished


# ------------------------------------------------------------------ end to end (local runtime)

N_LINES, SPLITS = 2000, 4
CHANNELS = ep.ChannelConfig(batch_size=32, linger="2ms")
RESTART = ep.RestartStrategy(max_attempts=3, delay=0)
#: faults of successive generations (a fault of generation 1 fires in the second attempt) need
#: every task restarted: with failover regions (the default) only the failed pipeline would be
#: (it alone becomes generation 1), so the other pipeline's generation-1 fault would never fire
FULL_RESTART = ep.RestartStrategy(max_attempts=3, delay=0, failover="full")


def event(split: int, offset: int):
    i = offset
    while True:
        yield {"split": split, "i": i, "line": line(split, i)}
        i += 1


def split_key(record):
    return record["split"]


def tag(record):
    return {**record, "tagged": True}


class RunningCount(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, key, value):
        self.n.update(self.n.value() + 1)
        yield {"word": key, "n": self.n.value()}


def words_of(record):
    return record["line"].split()


def producer(root: str, *, splits=SPLITS, keyed=True, partitions=3) -> ep.Dataflow:
    flow = ep.Dataflow("producer", parallelism=2)
    src = ep.sources.GeneratorSource(event, num_splits=splits, limit=N_LINES // splits, records_per_second=1500.0)
    flow.source("events", src).map("tag", tag).sink(
        "log", LogSink(root, TOPIC, partitions=partitions, key_fn=split_key if keyed else None))
    return flow


def paced(record):
    """Stage 2 reads the log much faster than stage 1 wrote it; pacing keeps its run
    spanning several epochs, so its faults fire after a checkpoint completed."""
    time.sleep(0.0005)
    return record


def consumer(source: LogSource, out: str) -> ep.Dataflow:
    flow = ep.Dataflow("consumer", parallelism=2)
    (flow.source("log", source).map("paced", paced).flat_map("words", words_of).key_by(lambda w: w)
     .process("count", RunningCount()).sink("out", ep.sinks.FileSink(out)))
    return flow


def expected_counts(splits=SPLITS) -> collections.Counter:
    words = collections.Counter(w for s in range(splits) for i in range(N_LINES // splits) for w in line(s, i).split())
    return canon({"word": w, "n": n} for w, c in words.items() for n in range(1, c + 1))


def run(flow, tmp_path, guarantee="exactly-once", faults=()):
    cfg = ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "ckpt"))
    restart = FULL_RESTART if len({f.generation for f in faults}) > 1 else RESTART
    return flow.start(guarantee=guarantee, checkpoint=cfg, restart=restart, channels=CHANNELS, runtime="local",
                      faults=faults)


def by_split(log: dict) -> dict:
    """(partition, split) -> the records' ``i`` in offset order."""
    out = collections.defaultdict(list)
    for p, records in log.items():
        for r in records:
            out[p, r["split"]].append(r["i"])
    return dict(out)


@pytest.fixture(scope="module")
def golden_log(tmp_path_factory):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # module fixtures run before conftest's
    tmp = tmp_path_factory.mktemp("golden-log")
    root = str(tmp / "log")
    run(producer(root), tmp).wait(120)
    log = read_committed_log(root, TOPIC)
    assert {k: v for k, v in by_split(log).items()} == {
        (p, s): list(range(N_LINES // SPLITS)) for (p, s) in by_split(log)}
    assert sorted(s for _, s in by_split(log)) == list(range(SPLITS))
    return root, log


class Watcher(threading.Thread):
    """Polls read_committed_log while a job runs; keeps every distinct view."""

    def __init__(self, root: str):
        super().__init__(daemon=True)
        self.root, self.views, self.error, self.stop = root, [], None, threading.Event()

    def run(self):
        try:
            while not self.stop.is_set():
                try:
                    view = read_committed_log(self.root, TOPIC)
                except UnknownTopicError:
                    view = None
                if view is not None and (not self.views or view != self.views[-1]):
                    self.views.append(view)
                self.stop.wait(0.005)
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            self.error = e


PRODUCER_FAULTS = {
    "map-raises": [CrashAtRecord("tag", record=400, subtask=1, after_epoch=1)],
    "sink-exits-during-commit": [CrashDuringCommit("log", epoch=2, subtask=0, how="exit", after_epoch=1)],
    # attempt 1 crashes at its first commit (every epoch of attempt 1 is >= 2, and even a
    # loaded machine completes at least its final epoch): the fault cannot miss
    "two-attempts": [CrashAtRecord("log", record=300, how="exit", after_epoch=1),
                     CrashDuringCommit("log", epoch=2, subtask=1, generation=1, after_epoch=0)],
}


@pytest.mark.parametrize("fault", list(PRODUCER_FAULTS))
def test_pipeline_to_log_exactly_once_equals_golden_and_readers_see_whole_transactions(tmp_path, golden_log, fault):
    root = str(tmp_path / "log")
    watcher = Watcher(root)
    watcher.start()
    result = run(producer(root), tmp_path, faults=PRODUCER_FAULTS[fault]).wait(120)
    watcher.stop.set()
    watcher.join()
    assert result.attempts == 1 + len({f.generation for f in PRODUCER_FAULTS[fault]}), result.failures
    assert all(e is not None for e in result.restored_from[1:])
    final = read_committed_log(root, TOPIC)
    assert by_split(final) == by_split(golden_log[1]) and canon(flat(final)) == canon(flat(golden_log[1]))
    assert watcher.error is None and len(watcher.views) > 2, watcher.error
    for view in watcher.views:  # every view: committed prefixes, no gap, nothing rolled back
        assert all(final[p][:len(recs)] == recs for p, recs in view.items())
        assert all(seq == list(range(len(seq))) for seq in by_split(view).values())


def test_pipeline_to_log_at_least_once_contains_golden(tmp_path, golden_log):
    root = str(tmp_path / "log")
    result = run(producer(root), tmp_path, guarantee="at-least-once",
                 faults=[CrashAtRecord("tag", record=400, subtask=1, how="exit", after_epoch=1)]).wait(120)
    assert result.attempts == 2, result.failures
    got = read_committed_log(root, TOPIC)
    for p, records in golden_log[1].items():
        assert contains_all(canon(got[p]), canon(records))


def test_two_stage_pipeline_through_the_log_equals_golden(tmp_path, golden_log):
    root, out = str(tmp_path / "log"), unique_dir(tmp_path, "out")
    r1 = run(producer(root), tmp_path, faults=PRODUCER_FAULTS["sink-exits-during-commit"]).wait(120)
    assert r1.attempts == 2 and r1.restored_from[1] is not None, r1.failures
    result = run(consumer(LogSource(root, TOPIC), out), tmp_path,
                 faults=[CrashAtRecord("count", record=700, subtask=1, how="exit", after_epoch=1)]).wait(120)
    assert result.attempts == 2 and result.restored_from[1] is not None, result.failures
    assert canon(read_committed(out)) == expected_counts()
    golden_out = unique_dir(tmp_path, "golden-out")
    run(consumer(LogSource(golden_log[0], TOPIC), golden_out), tmp_path).wait(120)
    assert canon(read_committed(golden_out)) == expected_counts()


def test_chained_pipelines_run_concurrently_with_faults_in_both(tmp_path):
    """Stage 2 follows the log while stage 1 writes it: each producer subtask owns one
    partition (no key_fn), so each partition ends at N_LINES // 2 records (the ``limit``)."""
    root, out = str(tmp_path / "log"), unique_dir(tmp_path, "out")
    follower = LogSource(root, TOPIC, follow=True, limit=N_LINES // 2, poll_interval=0.01, partitions=2)
    stage2 = run(consumer(follower, out), tmp_path,
                 faults=[CrashAtRecord("count", record=500, subtask=0, after_epoch=2)])
    stage1 = run(producer(root, splits=2, keyed=False, partitions=2), tmp_path,
                 faults=[CrashAtRecord("tag", record=300, subtask=1, how="exit", after_epoch=1)])
    r1, r2 = stage1.wait(120), stage2.wait(120)
    assert r1.attempts == 2 and r2.attempts == 2, (r1.failures, r2.failures)
    assert canon(read_committed(out)) == expected_counts(splits=2)


@pytest.mark.spark
def test_log_sink_on_spark_with_commit_and_recommit_faults_equals_golden(tmp_path, spark, golden_log):
    """On Spark: the sink process dies during commit (some partitions published, some not),
    then the restarted attempt dies while re-committing during recovery."""
    root = str(tmp_path / "log")
    cfg = ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "ckpt"))
    faults = [CrashDuringCommit("log", epoch=2, subtask=0, how="exit", after_epoch=1),
              CrashDuringCommit("log", epoch=1, subtask=1, generation=1, how="exit")]
    result = producer(root).run(checkpoint=cfg, restart=FULL_RESTART, channels=CHANNELS, runtime="spark", spark=spark,
                                faults=faults)
    assert result.attempts == 3, result.failures
    assert by_split(read_committed_log(root, TOPIC)) == by_split(golden_log[1])
