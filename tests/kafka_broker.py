"""A real Kafka-protocol broker for tests and benchmarks: ``noida-db`` (DESIGN.md "Facts").

Load it as a plugin (``pytest_plugins = ["kafka_broker"]``) for the session fixture
``kafka_broker``, or use :func:`start_broker` directly. The broker listens on a free
loopback port with a fresh data directory and is killed at the end. Readers here are plain
confluent-kafka consumers: the independent view of what a topic holds.

A noida-db quirk the helpers work around, not the engine: its fetch responses list *every*
aborted transaction of a producer id, also those that ended before the fetch offset, so a
read_committed consumer that starts after an abort skips that producer id's later committed
records (seen with noida-db 0.2.3). :func:`read_committed` therefore always reads from the
start of a partition, where it meets the abort markers; epochal's sink never writes again
with a producer id it aborted (``epochal.connectors.kafka.recovery``).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest


def _binary() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "noida-db")
    return here if os.path.exists(here) else shutil.which("noida-db")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """A running broker: ``servers`` to connect to, helpers to create, fill and read topics."""

    def __init__(self, proc: subprocess.Popen, port: int, data_dir: str):
        self.proc, self.port, self.data_dir = proc, port, data_dir
        self.servers = f"127.0.0.1:{port}"

    # ------------------------------------------------------------------ topics
    def admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.servers})

    def create_topic(self, name: str | None = None, partitions: int = 1) -> str:
        from confluent_kafka.admin import NewTopic

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = self.admin()  # alive until the futures resolved
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(30)
        return name

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        admin = self.admin()
        for future in admin.create_partitions([NewPartitions(topic, total)]).values():
            future.result(30)

    def produce(self, topic: str, values, *, partition: int | None = None, key=None, timestamps=None) -> None:
        """Produce ``values`` (str or bytes) and wait until every one is acknowledged."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.servers, "linger.ms": 5})
        failed = []
        for i, value in enumerate(values):
            kwargs = {}
            if partition is not None:
                kwargs["partition"] = partition
            if timestamps is not None:
                kwargs["timestamp"] = timestamps[i]
            while True:
                try:
                    producer.produce(topic, value.encode() if isinstance(value, str) else value, key,
                                     on_delivery=lambda err, msg: failed.append(err) if err else None, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
        left = producer.flush(60)
        assert left == 0 and not failed, f"produce to {topic}: {left} undelivered, errors {failed[:3]}"

    def end_offsets(self, topic: str, committed: bool = True) -> dict[int, int]:
        """Per partition: the last stable offset (``committed``) or the log end offset."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.servers, "group.id": f"ends-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed" if committed else "read_uncommitted"})
        try:
            n = len(self.admin().list_topics(timeout=10).topics[topic].partitions)
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(n)}
        finally:
            c.close()

    def open_transactions(self, topic: str) -> dict[int, int]:
        """Partitions whose last stable offset lags the log end: a transaction is open there."""
        stable, end = self.end_offsets(topic, True), self.end_offsets(topic, False)
        return {p: end[p] - stable[p] for p in end if end[p] != stable[p]}

    def read_committed(self, topic: str, timeout: float = 30.0) -> dict[int, list]:
        """Every record a read_committed consumer sees, per partition in offset order, as
        ``(offset, key, value)`` with bytes. Reads from offset 0 up to the last stable offset."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        ends = self.end_offsets(topic, True)
        c = Consumer({"bootstrap.servers": self.servers, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed", "enable.partition.eof": True,
                      "enable.auto.commit": False})
        out: dict[int, list] = {p: [] for p in ends}
        try:
            c.assign([TopicPartition(topic, p, 0) for p in ends])
            done = {p for p, e in ends.items() if e == 0}
            deadline = time.monotonic() + timeout
            while len(done) < len(ends):
                if time.monotonic() > deadline:
                    raise AssertionError(f"reading {topic}: partitions {sorted(set(ends) - done)} did not reach "
                                         f"their last stable offsets {ends} within {timeout} s")
                msg = c.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[msg.partition()]:
                            done.add(msg.partition())
                        continue
                    raise AssertionError(f"reading {topic}: {msg.error()}")
                out[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
        finally:
            c.close()
        return out

    def values(self, topic: str) -> list[bytes]:
        """Every committed value of ``topic`` (all partitions)."""
        return [v for records in self.read_committed(topic).values() for _, _, v in records]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def cannot_start_broker() -> str | None:
    if _binary() is None:
        return "the noida-db broker is not installed (pip install -e '.[test]')"
    with contextlib.suppress(ImportError):
        import confluent_kafka  # noqa: F401

        return None
    return "confluent-kafka is not installed (pip install -e '.[test]')"


def start_broker(timeout: float = 30.0) -> Broker:
    """Start noida-db on a free port; return once it answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    data_dir = tempfile.mkdtemp(prefix="epochal-kafka-")
    for _ in range(5):  # another process may take the port between the probe and the bind
        port = _free_port()
        proc = subprocess.Popen([_binary(), "start", "--data-dir", data_dir, "--only", "kafka", "--kafka-port",
                                 str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        if proc.poll() is None:
            AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=timeout)
            return Broker(proc, port, data_dir)
    raise RuntimeError(f"noida-db did not start: {proc.stderr.read().decode(errors='replace')[-2000:]}")


@pytest.fixture(scope="session")
def kafka_broker():
    why = cannot_start_broker()
    if why:
        pytest.skip(why)
    broker = start_broker()
    yield broker
    broker.stop()
