"""Recovery never waits on a broker answer an open transaction can hold back (issue 47),
against Apache Kafka (tests/kafka_broker.py).

Kafka answers a *stable* offset read (librdkafka's ``read_committed`` consumers ask for
one) only once no transaction holds offsets of the group, and an *unstable* one without
a commit whose markers the coordinator is still writing. A sink writer's marker is read
unstable to find whom to fence, and stable once they are fenced
(``Generations._settle``); these tests drive writers by hand, the fault injected from
outside: a process SIGKILLed while it holds a transaction open."""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import time

from epochal.alignment.factory import SinkMode
from epochal.connectors.kafka import recovery
from epochal.epochs.lineage import Lineage
from epochal.sinks import KafkaSink, SinkContext
from epochal.sinks.transactions import TwoPhaseCommitState

pytest_plugins = ["kafka_broker"]

LINEAGE = "6c7d8e9f0a1b"

#: a writer of generation 1 killed while it registers: its replay slot's transaction holds
#: the marker offset (send_offsets_to_transaction) and never commits
_DIES_WHILE_REGISTERING = """
import sys
from confluent_kafka import Consumer, Producer, TopicPartition
servers, topic, group, txid, meta = sys.argv[1:6]
p = Producer({"bootstrap.servers": servers, "transactional.id": txid})
p.init_transactions(60)
p.begin_transaction()
c = Consumer({"bootstrap.servers": servers, "group.id": group})
p.send_offsets_to_transaction([TopicPartition(topic, 0, 1, metadata=meta)], c.consumer_group_metadata(), 60)
print("open", flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _writer(sink: KafkaSink, generation: int):
    ctx = SinkContext("out", subtask=0, parallelism=1, job="fencing", generation=generation,
                      mode=SinkMode.TRANSACTIONAL, lineage=Lineage(LINEAGE))
    return sink.create_writer(ctx)


def _run_epochs(writer, epochs: dict[int, list[str]]) -> None:
    """Drive ``writer`` through ``epochs`` (epoch -> rows) as the task does, then wait for Kafka."""
    for epoch, rows in epochs.items():
        writer.write_many(rows)
        writer.snapshot(epoch)
        durable = writer.durability_job(epoch)
        if durable is not None:
            durable()
        writer.notify_epoch_complete(epoch)
    writer.wait_for_commits(60)


def _stable_read_is_held_back(broker, topic: str, group: str) -> bool:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": broker.servers, "group.id": group, "isolation.level": "read_committed"})
    try:
        c.committed([TopicPartition(topic, 0)], timeout=3)
        return False
    except KafkaException as exc:
        return exc.args[0].name() == "_TIMED_OUT"
    finally:
        c.close()


def test_a_generation_killed_while_it_registers_does_not_hold_the_next_one_back(kafka_broker, caplog):
    """Generation 0 commits epoch 1; generation 1 is SIGKILLed while its registration
    transaction is open (its replay slot sent the marker offset, never committed). Kafka
    holds that transaction — and every stable read of the marker group — until
    ``transaction.timeout.ms`` (15 min). Generation 2 starts within seconds anyway: the
    open transaction is named by generation and fenced, not waited for. The topic holds
    every row once; no transaction is left open."""
    topic = kafka_broker.create_topic(None, 1)
    sink = KafkaSink(kafka_broker.servers, topic, producers=1)
    first = _writer(sink, 0)
    first.restore(None)
    epoch1 = [f"g0-{i}" for i in range(20)]
    try:
        _run_epochs(first, {1: epoch1})
    finally:
        first.release()
    prefix = first._prefix
    group = recovery.marker_group(prefix, 0, LINEAGE)
    txid = recovery.transactional_id(prefix, 0, 1, recovery.REPLAY_SLOT, LINEAGE)
    meta = recovery.MarkerMeta(1, 1, 1, LINEAGE, 0).encode()
    zombie = subprocess.Popen([sys.executable, "-c", _DIES_WHILE_REGISTERING, kafka_broker.servers, topic, group,
                               txid, meta], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert zombie.stdout.readline().strip() == "open", "the registering writer did not open its transaction"
    finally:
        zombie.kill()
        zombie.wait(30)
    # the fault fired: Kafka holds the group's offsets for the killed writer's transaction
    assert _stable_read_is_held_back(kafka_broker, topic, group)

    third = _writer(sink, 2)
    caplog.set_level(logging.INFO, logger="epochal")
    started = time.monotonic()
    epoch2 = [f"g2-{i}" for i in range(20)]
    try:
        third.restore(TwoPhaseCommitState(epoch=1))  # its checkpoint: epoch 1 complete
        took = time.monotonic() - started
        _run_epochs(third, {2: epoch2})
        assert third._read_marker(third._own, stable=True).epoch == 2
    finally:
        third.release()
    assert took < 30, f"generation 2 waited {took:.0f} s for the open transaction"
    assert any("never registered" in r.getMessage() for r in caplog.records), "the open transaction was not fenced"
    assert collections.Counter(kafka_broker.values(topic)) == collections.Counter(r.encode() for r in epoch1 + epoch2)
    assert kafka_broker.open_transactions(topic) == {}
    assert not _stable_read_is_held_back(kafka_broker, topic, group)


def _pids(folder) -> list[int]:
    return sorted(int(name) for name in os.listdir(folder))


def _uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def _started_after(pid: int, since: float) -> bool:
    """Whether process ``pid`` runs (not a zombie) and started after uptime ``since``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[19]) / os.sysconf("SC_CLK_TCK") > since


def test_sigkills_from_outside_repeatedly_also_during_recovery_end_in_exact_output(kafka_broker, tmp_path):
    """Keyed count Kafka → Kafka on the local runtime. The test SIGKILLs a task process once
    the first checkpoint completed, then — three more times — the first process a restart
    starts, as soon as it opened its operators: while the job recovers (its sinks fence,
    read markers, register), before the restarted attempt completes a checkpoint. Only
    then does the second half of the input arrive. The job finishes by itself, its
    read_committed output equals the plain-Python count, and no transaction is left open
    (issue 47: such kills left every later restart unable to read a marker)."""
    import cloudpickle
    import test_kafka
    from test_kafka import Input, checkpoint, committed_counts, running_counts, wordcount

    import epochal as ep

    cloudpickle.register_pickle_by_value(test_kafka)  # its Count runs in the task processes

    data = Input(kafka_broker, per_partition=800)
    out = kafka_broker.create_topic(None, 2)
    pids = tmp_path / "pids"
    pids.mkdir()
    handle = wordcount(kafka_broker, data, out, pid_dir=str(pids)).start(
        runtime="local", checkpoint=checkpoint(tmp_path), restart=ep.RestartStrategy(max_attempts=8))
    killed: list[int] = []
    during_recovery = 0
    deadline = time.monotonic() + 240
    try:
        while not handle.completed_epochs:
            assert time.monotonic() < deadline, "no checkpoint completed"
            time.sleep(0.01)
        since, epochs_at_kill, rnd = 0.0, None, random.Random(47)
        while len(killed) < 4:
            assert time.monotonic() < deadline, f"no restarted task process appeared after kills {killed}"
            # a process of the attempt after the last kill: started after it, still running
            fresh = [pid for pid in _pids(pids) if _started_after(pid, since)]
            if not fresh:
                time.sleep(0.005)
                continue
            time.sleep(rnd.uniform(0.0, 0.4))  # a random moment of the restart: open, fence, register, replay
            epochs = len(handle.completed_epochs)
            with contextlib.suppress(ProcessLookupError):
                since = _uptime()
                os.kill(fresh[0], signal.SIGKILL)
                killed.append(fresh[0])
                # no checkpoint completed since the last kill: this one landed in the recovery
                during_recovery += epochs_at_kill is not None and epochs == epochs_at_kill
                epochs_at_kill = epochs
    except BaseException:
        handle.cancel()
        raise
    data.rest()
    result = handle.wait(300)
    print(f"killed {killed}; {during_recovery} during a recovery; {result.attempts} attempts")
    assert len(killed) == 4 and result.attempts >= 5, f"kills {killed}, attempts {result.attempts}"
    assert during_recovery >= 1, "no kill landed while the job recovered"
    assert committed_counts(kafka_broker, out) == running_counts(data.lines)
    assert kafka_broker.open_transactions(out) == {}
