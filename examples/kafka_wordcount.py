"""Kafka to Kafka, exactly-once: a running word count between two topics.

It starts a throw-away Apache Kafka broker (``tests/kafka_broker.py``: jars from Maven Central,
so java and mvn) unless ``--bootstrap-servers`` names one, writes lines into a 3-partition topic, and runs a
keyed word count whose every update goes to a second topic through an exactly-once
``KafkaSink`` (one Kafka transaction per epoch and sink subtask). An injected fault kills a
sink task *after* the first checkpoint completed and *before* its Kafka transaction
committed — the case librdkafka cannot resume: epochal produces that epoch again from the
checkpoint. (The first epoch, not a later one: a small input can be read whole before a
second checkpoint is due, and then the job's only epoch is its final one.) At the end a plain ``read_committed`` consumer reads the output topic and the
result is checked against a plain-Python count: every update exactly once.

    python examples/kafka_wordcount.py [--bootstrap-servers host:port] [--lines 20000] [--no-crash]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid

import epochal as ep
from epochal.sinks import KafkaSink
from epochal.sources import KafkaSource
from epochal.testing import CrashDuringCommit

WORDS = "kafka topic partition offset epoch barrier commit marker fence producer consumer".split()


def start_broker():
    """A throw-away Apache Kafka broker on free loopback ports: the launcher the tests use
    (``tests/kafka_broker.py``; its jars come from Maven Central, so it needs java and mvn)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from kafka_broker import cannot_start_broker, start_broker as start

    why = cannot_start_broker()
    if why:
        raise SystemExit(f"no broker: {why}; or pass --bootstrap-servers")
    broker = start()
    return broker, broker.servers


def produce_lines(servers: str, topic: str, n: int) -> list[str]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, 3, 1), NewTopic(topic + "-counts", 2, 1)]).values():
        future.result(30)
    rng = random.Random(7)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5})
    for i, line in enumerate(lines):
        producer.produce(topic, line.encode(), partition=i % 3)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    return lines


def read_committed(servers: str, topic: str) -> list[dict]:
    """Every record a read_committed consumer sees in ``topic`` (up to the last stable offset)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": servers, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    partitions = range(len(c.list_topics(topic, timeout=10).topics[topic].partitions))
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    c.assign([TopicPartition(topic, p, 0) for p in partitions])
    out, done = [], {p for p, end in ends.items() if end == 0}
    while len(done) < len(ends):
        msg = c.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                done.add(msg.partition())
            continue
        out.append(json.loads(msg.value()))
    c.close()
    return out


class WordCount(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"word": word, "n": self.count.value()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--no-crash", action="store_true")
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"))
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="epochal-kafka-example-")
    broker, servers = (None, args.bootstrap_servers) if args.bootstrap_servers else start_broker()
    try:
        topic = f"lines-{uuid.uuid4().hex[:6]}"
        lines = produce_lines(servers, topic, args.lines)
        # --8<-- [start:graph]
        flow = ep.Dataflow("kafka-wordcount", parallelism=2)
        (flow.source("lines", KafkaSource(servers, topic, stopping_offsets="latest", deserializer=bytes.decode))
             .flat_map("split", lambda record: record.value.split())
             .key_by(lambda word: word)
             .process("count", WordCount())
             .sink("counts", KafkaSink(servers, topic + "-counts", key=lambda r: r["word"])))
        # --8<-- [end:graph]
        faults = [] if args.no_crash else [CrashDuringCommit("counts", subtask=1, epoch=1, how="exit")]
        t0 = time.monotonic()
        result = flow.run(checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/checkpoints"),
                          runtime=args.runtime, faults=faults)
        elapsed = time.monotonic() - t0

        updates = read_committed(servers, topic + "-counts")
        got = collections.Counter((u["word"], u["n"]) for u in updates)
        words = collections.Counter(w for line in lines for w in line.split())
        expected = collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))
        print(f"\nepochal Kafka word count ({result.runtime}, exactly-once) in {elapsed:.1f} s, "
              f"{result.attempts} attempt(s)")
        for failure in result.failures:
            print(f"  recovered from: {failure.splitlines()[0]}")
        print(f"  {len(lines)} lines from {topic} (3 partitions) -> {len(updates)} updates in {topic}-counts")
        exact = got == expected
        print(f"  read_committed output equals a plain-Python count, each update once: {'yes' if exact else 'NO'}")
        if not exact:
            raise SystemExit(f"exactly-once violated: {sum((got - expected).values())} extra, "
                             f"{sum((expected - got).values())} missing")
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
