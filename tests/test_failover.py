"""Failover regions (epochal.runtime.driver.failover; Flink's region failover): a job whose
parallel pipelines share no channel restarts only the pipeline that failed, while the other
pipelines keep running — their task processes never restart. Checked against a
plain-Python oracle (every generated record exactly once in the sink)."""
from __future__ import annotations

import collections
import json
import os
import time

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.epochs.coordinator import EpochCoordinator
from epochal.epochs.pending import TriggerReason
from epochal.runtime.driver.failover import failover_groups, restarts_alone
from epochal.sinks import FileSink
from epochal.testing import CrashAtRecord
from pipelines import PidFileKiller, output, unique_dir

cloudpickle.register_pickle_by_value(__import__(__name__))
pytest_plugins = ["kafka_broker"]

SPLITS = 4


def record(split: int, offset: int):
    i = offset
    while True:
        yield f"s{split}-{i}"
        i += 1


class MarkProcess:
    """A map function that leaves ``<pid>-s<split>`` in ``pid_dir`` for the first record a
    process sees: which processes ran each pipeline (``None``: marks nothing)."""

    def __init__(self, pid_dir: str | None):
        self.pid_dir, self.marked = pid_dir, pid_dir is None

    def __call__(self, r: str) -> str:
        if not self.marked:
            self.marked = True
            open(os.path.join(self.pid_dir, f"{os.getpid()}-{r.split('-')[0]}"), "w").close()
        return r


def pipelines(name: str, out: str, pid_dir: str | None, n: int | None, rate: float | None) -> ep.Dataflow:
    """``SPLITS`` forward-only pipelines: source subtask j → mark → sink subtask j (``n`` records
    per split; ``None``: unbounded)."""
    flow = ep.Dataflow(name, parallelism=SPLITS)
    (flow.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=n, records_per_second=rate))
     .map("mark", MarkProcess(pid_dir)).sink("out", FileSink(out)))
    return flow


def oracle(n: int) -> collections.Counter:
    return collections.Counter(f"s{s}-{i}" for s in range(SPLITS) for i in range(n))


def processes(pid_dir: str) -> dict[str, set[int]]:
    """split → the pids that ran its pipeline."""
    seen: dict[str, set[int]] = collections.defaultdict(set)
    for mark in os.listdir(pid_dir):
        pid, split = mark.split("-")
        seen[split].add(int(pid))
    return dict(seen)


# ------------------------------------------------------------------ plan (build time)
def test_forward_only_pipelines_are_failover_regions_and_a_shuffle_joins_them():
    flow = pipelines("groups", "/tmp/never", "/tmp/never", 10, None)
    plan = flow.plan()
    groups = failover_groups(plan)
    assert len(groups) == SPLITS and sorted(t for g in groups for t in g) == sorted(t.id for t in plan.tasks)
    assert restarts_alone(plan, ep.RestartStrategy()) == groups
    assert restarts_alone(plan, ep.RestartStrategy(failover="full")) is None
    shuffled = ep.Dataflow("shuffled", parallelism=SPLITS)
    (shuffled.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=10))
     .key_by(lambda r: r).reduce("r", lambda a, b: a).sink("out", FileSink("/tmp/never")))
    assert len(failover_groups(shuffled.plan())) == 1 and restarts_alone(shuffled.plan(), ep.RestartStrategy()) is None


def test_a_sink_without_local_recovery_restarts_every_task():
    class Shared(FileSink):
        local_recovery = False  # e.g. subtask 0 cleans every subtask's staged files (Delta, Iceberg)

    flow = ep.Dataflow("shared", parallelism=SPLITS)
    flow.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=10)).sink("out", Shared("/tmp/never"))
    assert len(failover_groups(flow.plan())) == SPLITS and restarts_alone(flow.plan(), ep.RestartStrategy()) is None


def test_failover_must_be_region_or_full():
    with pytest.raises(ep.ConfigError, match="restart.failover"):
        ep.RestartStrategy(failover="pipeline")


# ------------------------------------------------------------------ the coordinator (pure)
def test_a_retracted_acknowledgement_no_longer_completes_its_epoch():
    c = EpochCoordinator(ep.CheckpointConfig(interval=None), ["a", "b"])
    c.request_trigger(TriggerReason.MANUAL, 1.0)
    epoch = c.maybe_trigger(1.0).epoch
    c.acknowledge("a", epoch, {"v": "gone"}, 1.1)
    assert c.retract(["a"], 1.2) == 1
    assert not c.acknowledge("b", epoch, {}, 1.3).completed  # a's restarted incarnation has not acked yet
    done = c.acknowledge("a", epoch, {"v": "new"}, 1.4).completed
    assert [d.epoch for d in done] == [epoch] and done[0].acks["a"]["v"] == "new"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ack", "retract", "trigger"]), st.sampled_from("abc"),
                          st.integers(0, 3)), max_size=60))
def test_no_epoch_completes_with_an_incarnation_that_was_retracted(steps):
    """Random triggers, acknowledgements and restarts (retract) of tasks a, b, c: every
    completed epoch holds, for each task, an acknowledgement of the task's incarnation
    current when it completed — never one sent before that task was restarted — and
    epochs complete in order."""
    c = EpochCoordinator(ep.CheckpointConfig(interval=None, max_concurrent=4, timeout=1e9), "abc")
    incarnation = dict.fromkeys("abc", 0)
    now, completed = 0.0, []
    for kind, task, pick in steps:
        now += 1.0
        if kind == "trigger":
            c.request_trigger(TriggerReason.MANUAL, now)
            c.maybe_trigger(now)
            continue
        if kind == "retract":
            incarnation[task] += 1
            c.retract([task], now)
            continue
        pending = c.pending
        if not pending:
            continue
        epoch = pending[pick % len(pending)].epoch
        for done in c.acknowledge(task, epoch, {"incarnation": incarnation[task]}, now).completed:
            assert {t: a["incarnation"] for t, a in done.acks.items()} == incarnation, (done.epoch, incarnation)
            completed.append(done.epoch)
    assert completed == sorted(completed)


# ------------------------------------------------------------------ local runtime
def run_past_a_failure(flow, tmp_path, ready=lambda handle: True, **options):
    """Start ``flow`` (unbounded sources), wait until it restarted something (and ``ready``)
    and completed two more epochs, then stop it with a savepoint: no timing decides whether
    the failure lands while every pipeline still reads. Returns the result and, per split,
    the offset the savepoint holds — what exactly-once output must be (a prefix of each split)."""
    handle = flow.start(**options)
    deadline = time.monotonic() + 240

    def wait_for(what, done):
        while not done():
            assert time.monotonic() < deadline and handle.running, f"no {what}"
            time.sleep(0.01)

    wait_for("restart", lambda: ready(handle) and handle.metrics().get("restarts"))
    seen = len(handle.completed_epochs)
    wait_for("epochs after the restart", lambda: len(handle.completed_epochs) >= seen + 2)
    url = handle.stop_with_savepoint(str(tmp_path / "sp"), timeout=120)
    result = handle.wait(120)
    offsets: dict[int, int] = {}
    for entry in ep.state.list_source_offsets(url):
        offsets.update({int(k): v for k, v in entry["offsets"].items()})
    return result, offsets


def prefixes(offsets: dict[int, int]) -> collections.Counter:
    """Plain Python: the records of each split before its offset, once each."""
    assert sorted(offsets) == list(range(SPLITS)) and all(m > 0 for m in offsets.values()), offsets
    return collections.Counter(f"s{s}-{i}" for s, m in offsets.items() for i in range(m))


@pytest.mark.parametrize("failover", ["region", "full"])
def test_a_failed_pipeline_restarts_alone(tmp_path, failover):
    """Pipeline 2 crashes after an epoch completed: with ``failover="region"`` only its
    tasks restart (the other three pipelines' processes run on), with ``"full"`` every
    task restarts; either way the committed output is exactly each split's records before
    the stop's savepoint."""
    out, pids = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "pids")
    os.makedirs(pids)
    result, offsets = run_past_a_failure(
        pipelines(f"failover-{failover}", out, pids, None, rate=1500.0), tmp_path, runtime="local",
        checkpoint=ep.CheckpointConfig(interval=0.05, storage=f"file://{tmp_path}/ck"),
        restart=ep.RestartStrategy(failover=failover),
        faults=[CrashAtRecord("mark", subtask=2, record=400, after_epoch=2)])
    assert collections.Counter(json.loads(t) for t in output(out)) == prefixes(offsets)
    assert any("injected CrashAtRecord" in f for f in result.failures)
    ran = processes(pids)
    assert sorted(ran) == [f"s{s}" for s in range(SPLITS)]
    if failover == "region":
        assert [f["tasks"] for f in result.failovers] == [["gen[2]"]] and result.attempts == 2, result.failures
        assert result.failovers[0]["restored_epoch"] >= 2
        assert 0 < result.failovers[0]["down_s"] <= result.failovers[0]["running_s"]
        assert len(ran["s2"]) == 2 and all(len(ran[f"s{s}"]) == 1 for s in (0, 1, 3)), ran
    else:
        assert result.failovers == [] and all(len(p) == 2 for p in ran.values()), ran


# ------------------------------------------------------------------ Spark, a SIGKILL from outside
@pytest.mark.spark
def test_a_sigkilled_pipeline_restarts_alone_on_spark(tmp_path, spark):
    """Four pipelines on embedded Spark (one barrier stage each). Once an epoch completed,
    the test SIGKILLs pipeline 2's task process from outside while every pipeline runs:
    only that pipeline restarts (a second process for split 2, one for each other split),
    and the committed output is exactly each split's records before the stop's savepoint."""
    out, pids = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "pids")
    os.makedirs(pids)
    killers: list = []

    def killed(handle) -> bool:
        if not killers:  # started with the job: kills pipeline 2 once an epoch completed
            killers.append(PidFileKiller(pids, ready=lambda: handle.completed_epochs and len(os.listdir(pids)) == SPLITS,
                                         running=lambda: handle.running, only=lambda name: name.endswith("-s2")))
        return bool(killers[0].killed)

    result, offsets = run_past_a_failure(
        pipelines("spark-failover", out, pids, None, rate=1000.0), tmp_path, ready=killed, spark=spark,
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert collections.Counter(json.loads(t) for t in output(out)) == prefixes(offsets)
    ran = processes(pids)
    assert [f["tasks"] for f in result.failovers] == [["gen[2]"]], result.failures
    assert len(ran["s2"]) == 2 and all(len(ran[f"s{s}"]) == 1 for s in (0, 1, 3)), ran


def fails_on_s1_50(r: str) -> str:
    if r == "s1-50":
        raise ValueError("cannot take s1-50")
    return r


def test_a_poison_record_in_a_failover_region_stops_the_job_naming_it(tmp_path, caplog):
    """Pipeline 1's function fails on one record every time: its failover region restarts
    once, fails on it again, and the job stops retrying with the record in the error
    (instead of spending every restart)."""
    flow = ep.Dataflow("poison-failover", parallelism=SPLITS)
    (flow.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=200))
     .map("parse", fails_on_s1_50).sink("out", FileSink(unique_dir(tmp_path, "o"))))
    with pytest.raises(ep.JobFailedError, match=r"stopped retrying: operator 'parse'.*s1-50") as failed:
        flow.run(runtime="local", restart=ep.RestartStrategy(max_attempts=5),
                 checkpoint=ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "c")))
    assert len(failed.value.causes) == 2, failed.value.causes  # the failover, then the attempt
    assert [r.message for r in caplog.records if "restarts alone" in r.message] != []


def test_the_dashboard_lists_a_failover_beside_the_attempts():
    from epochal.ui.model import _attempts

    rows = _attempts([{"generation": 0, "started_s": 0.0, "restored_epoch": None}],
                     [{"generation": 3, "restored_epoch": 2, "tasks": ["gen[2]"], "cause": "killed"}])
    assert [(r["generation"], r["restored_epoch"]) for r in rows] == [(0, None), (3, 2)]
    assert rows[1]["cause"] == "failover region gen[2] restarted alone: killed"


# ------------------------------------------------------------------ Kafka to Kafka, exactly-once
@pytest.mark.parametrize("fault", ["crash-at-record", "crash-between-completion-and-commit"])
def test_a_kafka_pipeline_restarts_alone_and_the_topic_stays_exactly_once(kafka_broker, tmp_path, fault):
    """Two partitions → two forward-only pipelines (KafkaSource → map → KafkaSink). Pipeline 1
    crashes (at a record, or after an epoch completed but before its sink committed it): it
    restarts alone, fences its old producers, produces what it had not committed, and the
    read_committed output equals the input exactly, with no transaction left open."""
    from epochal.connectors.kafka import KafkaSink, KafkaSource
    from epochal.testing import CrashDuringCommit
    from test_kafka import Input

    data = Input(kafka_broker, partitions=2, per_partition=800)
    out = kafka_broker.create_topic(None, 2)
    flow = ep.Dataflow(f"kafka-failover-{fault}", parallelism=2)
    (flow.source("lines", KafkaSource(kafka_broker.servers, data.topic, stopping_offsets=data.stops,
                                      deserializer=bytes.decode))
     .map("value", lambda r: r.value).sink("out", KafkaSink(kafka_broker.servers, out)))
    faults = {"crash-at-record": CrashAtRecord("value", subtask=1, record=500, how="exit", after_epoch=1),
              "crash-between-completion-and-commit": CrashDuringCommit("out", subtask=1, epoch=2, how="exit",
                                                                       after_epoch=1)}
    handle = flow.start(runtime="local", faults=[faults[fault]],
                        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + str(tmp_path / "ckpt")))

    def wait_for(what, done):
        deadline = time.monotonic() + 120
        while not done():
            if time.monotonic() >= deadline:  # say what each task read, and leave no job running
                read = {t: (m["records_in"], m["records_out"]) for t, m in handle.metrics().get("tasks", {}).items()}
                handle.cancel()
                raise AssertionError(f"no {what} within 120 s; (records in, out) per task: {read}; "
                                     f"epochs completed: {len(handle.completed_epochs)}")
            time.sleep(0.01)

    # the input grows in steps, so the crash always lands while both pipelines still read
    # (a failure once every source is exhausted restarts every task, by design)
    wait_for("checkpoint", lambda: handle.completed_epochs)
    data._produce(data.half, data.half + 200)
    wait_for("failover", lambda: handle.metrics().get("restarts"))
    data._produce(data.half + 200, data.n)
    result = handle.wait(300)
    assert [f["tasks"] for f in result.failovers] == [["lines[1]"]], result.failures
    got = collections.Counter(v.decode() for v in kafka_broker.values(out))
    assert got == collections.Counter(data.lines)
    assert kafka_broker.open_transactions(out) == {}


# ------------------------------------------------------------------ a restart slower than checkpoint.timeout
def test_a_pending_epochs_timeout_counts_from_the_rejoin():
    """Scripted: epoch 1 waits for task a, which restarts alone (retract) and stays down
    longer than the timeout; it does not time out while a is down, and after the rejoin it
    gets a whole timeout again before it is aborted."""
    c = EpochCoordinator(ep.CheckpointConfig(interval=None, timeout=1.0), ["a", "b"])
    c.request_trigger(TriggerReason.MANUAL, 0.0)
    epoch = c.maybe_trigger(0.0).epoch
    c.acknowledge("b", epoch, {}, 0.1)
    c.retract(["a"], 0.2)
    assert not c.check_timeouts(5.0).aborted, "an epoch timed out while its failover region was down"
    c.rejoin(["a"], 5.0)
    assert not c.check_timeouts(5.9).aborted, "the timeout did not count from the rejoin"
    assert [a.epoch for a in c.check_timeouts(6.0).aborted] == [epoch]  # a whole timeout after the rejoin
    c.request_trigger(TriggerReason.MANUAL, 6.0)
    later = c.maybe_trigger(6.0).epoch  # without a restart, a timeout counts from the trigger
    assert [a.epoch for a in c.check_timeouts(7.0).aborted] == [later]


def test_a_failover_slower_than_the_checkpoint_timeout_does_not_fail_the_job(tmp_path):
    """Pipeline 2 crashes and waits ``restart.delay`` = 2.5 s before it is relaunched, longer
    than ``checkpoint.timeout`` = 1 s with ``tolerable_failures=0``: the epochs pending
    meanwhile wait for its rejoin instead of timing out, so only pipeline 2 restarts (one
    failover, no restart of every task) and the output is exactly each split's prefix."""
    out, pids = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "pids")
    os.makedirs(pids)
    result, offsets = run_past_a_failure(
        pipelines("failover-slow", out, pids, None, rate=1000.0), tmp_path, runtime="local",
        checkpoint=ep.CheckpointConfig(interval=0.05, timeout=1.0, tolerable_failures=0,
                                       storage=f"file://{tmp_path}/ck"),
        restart=ep.RestartStrategy(delay=2.5, max_attempts=3),
        faults=[CrashAtRecord("mark", subtask=2, record=400, after_epoch=2)])
    assert [f["tasks"] for f in result.failovers] == [["gen[2]"]], result.failures
    assert result.failovers[0]["down_s"] > 1.0, "the region came back within the timeout"
    assert result.attempts == 2 and not [a for a in result.aborted_epochs if a["reason"] == "timeout"], \
        (result.failures, result.aborted_epochs)
    assert collections.Counter(json.loads(t) for t in output(out)) == prefixes(offsets)


class DiesInARelaunch(MarkProcess):
    """:class:`MarkProcess` whose unpickling — in a task process, before the task says
    hello — exits the process once, in the first process that starts after every pipeline
    ran (a failover region's relaunch): a relaunch that dies before it joins."""

    def __init__(self, pid_dir: str):
        super().__init__(pid_dir)
        self.driver_pid = os.getpid()

    def __setstate__(self, state):
        self.__dict__.update(state)
        died = os.path.join(self.pid_dir, "..", "died-before-hello")
        if (os.getpid() != self.driver_pid and len(os.listdir(self.pid_dir)) >= SPLITS
                and not os.path.exists(died)):
            open(died, "w").close()
            os._exit(17)


def test_a_relaunch_that_dies_before_it_joins_is_restarted_again(tmp_path):
    """Pipeline 2 crashes; its relaunch dies while loading the dataflow, before its task
    says hello: that is handled as a failure at once (another relaunch, one more restart of
    the budget), not after the start-up timeout — only pipeline 2 restarts, and the output
    is exactly each split's prefix."""
    out, pids = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "pids")
    os.makedirs(pids)
    flow = ep.Dataflow("failover-relaunch", parallelism=SPLITS)
    (flow.source("gen", ep.sources.GeneratorSource(record, num_splits=SPLITS, limit=None, records_per_second=1000.0))
     .map("mark", DiesInARelaunch(pids)).sink("out", FileSink(out)))
    t0 = time.monotonic()
    result, offsets = run_past_a_failure(
        flow, tmp_path, runtime="local", restart=ep.RestartStrategy(max_attempts=3),
        checkpoint=ep.CheckpointConfig(interval=0.05, storage=f"file://{tmp_path}/ck"),
        faults=[CrashAtRecord("mark", subtask=2, record=400, after_epoch=2)])
    assert os.path.exists(os.path.join(pids, "..", "died-before-hello")), "no relaunch died before it joined"
    assert time.monotonic() - t0 < 60, "the failed relaunch waited for a timeout"
    assert [f["tasks"] for f in result.failovers] == [["gen[2]"]], result.failures
    assert result.attempts == 3, (result.attempts, result.failures)  # the crash, then the relaunch that died
    assert "injected CrashAtRecord" in result.failures[0] and "failed before its tasks joined" in result.failures[1]
    ran = processes(pids)
    assert len(ran["s2"]) == 2 and all(len(ran[f"s{s}"]) == 1 for s in (0, 1, 3)), ran
    assert collections.Counter(json.loads(t) for t in output(out)) == prefixes(offsets)
