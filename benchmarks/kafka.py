"""Kafka to Kafka: throughput and end-to-end latency of the Kafka connectors.

Throughput: a topic of ``--records`` records (``--partitions`` partitions, 100-byte values,
1,000 keys) is read by ``KafkaSource`` (bounded at the end offsets), counted per key in
keyed state and written by ``KafkaSink`` to another topic, for each mode:

* ``exactly-once``: 1 s checkpoints (``--interval``), one Kafka transaction per epoch and
  sink subtask, the epoch's records kept in the checkpoint (write-ahead log);
* ``at-least-once``: the same checkpoints, an idempotent producer flushed at each barrier;
* ``no-checkpoint``: exactly-once with no periodic epochs (only the final one);
* ``raw-client``: no engine — one Python process, a read_committed consumer feeding a plain
  producer (what confluent-kafka alone does on this machine).

Steady rate = output records / (last − first record at the sink), from the timestamps the
sink gives each record when it writes it; every mode is read back with read_committed and
must hold every input record once (exactly-once) or at least once. Modes are interleaved
across repetitions. Latency: a producer thread writes ``--latency-rate`` records/s for
``--latency-seconds``, the job runs unbounded, and a read_committed consumer timestamps
each output record: latency = seen − produced.

    python benchmarks/kafka.py [--runtime spark|local] [--records 600000] [--repetitions 3] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import harness  # noqa: E402
from kafka_broker import start_broker  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import KafkaSink  # noqa: E402
from epochal.sources import KafkaSource  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "kafka.json"
PAYLOAD = b"x" * 100
MODES = ["exactly-once", "at-least-once", "no-checkpoint", "raw-client"]


class Count(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, key, record):
        self.n.update(self.n.value() + 1)
        yield (key, record.value, record.timestamp)


def serialize(out) -> bytes:
    return out[1]


def fill(broker, topic: str, records: int, partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.servers, "linger.ms": 20, "batch.num.messages": 10000})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, PAYLOAD, f"k{i % 1000}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def output_stamps(broker, topic: str) -> list[int]:
    """The sink's write timestamps (ms) of every committed output record."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    ends = broker.end_offsets(topic)
    c = Consumer({"bootstrap.servers": broker.servers, "group.id": uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    stamps, done = [], {p for p, e in ends.items() if e == 0}
    while len(done) < len(ends):
        for msg in c.consume(10000, 1.0):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                    done.add(msg.partition())
                continue
            stamps.append(msg.timestamp()[1])
    c.close()
    return stamps


def steady_rate(stamps: list[int]) -> float | None:
    if len(stamps) < 2:
        return None
    span = (max(stamps) - min(stamps)) / 1000.0
    return (len(stamps) - 1) / span if span > 0 else None


def run_engine(broker, mode: str, args, src: str, spark) -> dict:
    out = broker.create_topic(None, args.partitions)
    flow = ep.Dataflow(f"kafka-bench-{uuid.uuid4().hex[:6]}", parallelism=args.parallelism)
    (flow.source("in", KafkaSource(broker.servers, src, stopping_offsets="latest"))
         .key_by(lambda r: r.key)
         .process("count", Count())
         .sink("out", KafkaSink(broker.servers, out, serializer=serialize, key=lambda o: o[0])))
    interval = None if mode == "no-checkpoint" else args.interval
    rec = {"mode": mode, "records": args.records}
    options = {"guarantee": "at-least-once" if mode == "at-least-once" else "exactly-once",
               "checkpoint": ep.CheckpointConfig(interval=interval,
                                                 storage="file://" + tempfile.mkdtemp(dir=args.tmp)),
               "runtime": args.runtime}
    if spark is not None:
        options["spark"] = spark
    result = harness.run_job(flow, rec, 600, **options)
    if result is None:
        return rec
    stamps = output_stamps(broker, out)
    rec.update(output_records=len(stamps), records_per_s=steady_rate(stamps), attempts=result.attempts,
               epochs=len(result.completed_epochs),
               checkpoint_bytes_p50=harness.median([e.get("bytes", 0) for e in result.completed_epochs]),
               checkpoint_s_p50=harness.median([e["duration_s"] for e in result.completed_epochs]))
    if mode == "at-least-once" and len(stamps) < args.records or mode != "at-least-once" and len(stamps) != args.records:
        rec["error"] = f"{mode}: {len(stamps)} output records for {args.records} input records"
    return rec


def run_raw(broker, args, src: str) -> dict:
    """confluent-kafka alone: read_committed consumer → plain producer, one process."""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    out = broker.create_topic(None, args.partitions)
    ends = broker.end_offsets(src)
    c = Consumer({"bootstrap.servers": broker.servers, "group.id": uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    p = Producer({"bootstrap.servers": broker.servers, "linger.ms": 5, "enable.idempotence": True})
    c.assign([TopicPartition(src, q, 0) for q in ends])
    done, n, t0 = set(), 0, time.monotonic()
    while len(done) < len(ends):
        for msg in c.consume(10000, 1.0):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                    done.add(msg.partition())
                continue
            while True:
                try:
                    p.produce(out, msg.value(), msg.key())
                    break
                except BufferError:
                    p.poll(0.05)
            n += 1
    p.flush(120)
    c.close()
    stamps = output_stamps(broker, out)
    return {"mode": "raw-client", "records": args.records, "output_records": len(stamps),
            "records_per_s": steady_rate(stamps), "wall_s": time.monotonic() - t0}


def run_latency(broker, args, guarantee: str, interval: float, spark) -> dict:
    src = broker.create_topic(None, args.partitions)
    out = broker.create_topic(None, args.partitions)
    flow = ep.Dataflow(f"kafka-lat-{uuid.uuid4().hex[:6]}", parallelism=args.parallelism)
    (flow.source("in", KafkaSource(broker.servers, src))
         .key_by(lambda r: r.key).process("count", Count())
         .sink("out", KafkaSink(broker.servers, out, serializer=lambda o: str(o[2]).encode(), key=lambda o: o[0])))
    options = {"guarantee": guarantee, "runtime": args.runtime,
               "checkpoint": ep.CheckpointConfig(interval=interval, storage="file://" + tempfile.mkdtemp(dir=args.tmp))}
    if spark is not None:
        options["spark"] = spark
    handle = flow.start(**options)
    total = int(args.latency_rate * args.latency_seconds)
    latencies, stop = [], threading.Event()

    def read():
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": broker.servers, "group.id": uuid.uuid4().hex,
                      "isolation.level": "read_committed"})
        c.assign([TopicPartition(out, q, 0) for q in range(args.partitions)])
        while not stop.is_set() and len(latencies) < total:
            for msg in c.consume(1000, 0.005):
                if not msg.error():
                    latencies.append(time.time() - int(msg.value()) / 1000.0)
        c.close()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(3.0)  # let the job start (not a protocol step: the producer waits for a running job)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.servers, "linger.ms": 1})
    t0 = time.monotonic()
    for i in range(total):
        due = t0 + i / args.latency_rate
        while (wait := due - time.monotonic()) > 0:
            time.sleep(min(0.001, wait))
        producer.produce(src, PAYLOAD, f"k{i % 1000}".encode(), partition=i % args.partitions)
        if i % 100 == 0:
            producer.poll(0)
    producer.flush(60)
    reader.join(60 + args.latency_seconds)
    stop.set()
    handle.cancel()
    try:
        handle.wait(60)
    except Exception:  # noqa: BLE001 — a cancelled job raises JobFailedError("cancelled")
        pass
    rec = {"guarantee": guarantee, "interval_s": interval, "rate": args.latency_rate, "records": total,
           "seen": len(latencies),
           "latency_s": {q: harness.percentile(latencies, v) for q, v in (("p50", 50), ("p99", 99), ("p999", 99.9))}}
    if len(latencies) < total:
        rec["error"] = f"latency {guarantee} {interval}: saw {len(latencies)} of {total} records"
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="spark", choices=["spark", "local"])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--latency-rate", type=float, default=10_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--smoke", action="store_true", help="tiny run that only checks the script works")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.records, args.repetitions, args.latency_rate, args.latency_seconds = 20_000, 1, 500, 2.0
    args.tmp = args.tmp or tempfile.mkdtemp(prefix="epochal-kafka-bench-")
    info = harness.machine()
    doc = harness.new_doc("kafka", args, info)
    doc.update(runs=[], latency=[], errors=[])
    broker = start_broker()
    spark = None
    try:
        if args.runtime == "spark":
            from epochal.runtime.launch.spark import _local_session

            spark = _local_session(2 * args.parallelism + 2)
        src = broker.create_topic(None, args.partitions)
        fill(broker, src, args.records, args.partitions)
        for rep in range(args.repetitions):
            for mode in harness.rotated(MODES, rep):
                rec = run_raw(broker, args, src) if mode == "raw-client" else run_engine(broker, mode, args, src, spark)
                rec.update(repetition=rep, loadavg_before=list(os.getloadavg()))
                doc["runs"].append(rec)
                print(json.dumps({k: rec.get(k) for k in ("mode", "repetition", "records_per_s", "error")}),
                      flush=True)
                if rec.get("error"):
                    doc["errors"].append(rec["error"])
        for guarantee, interval in (("exactly-once", 1.0), ("exactly-once", 0.1), ("at-least-once", 1.0)):
            rec = run_latency(broker, args, guarantee, interval, spark)
            rec["loadavg_before"] = list(os.getloadavg())
            doc["latency"].append(rec)
            print(json.dumps(rec), flush=True)
            if rec.get("error"):
                doc["errors"].append(rec["error"])
    finally:
        broker.stop()
    doc["modes"] = harness.compare(doc["runs"], "records_per_s", "mode", "exactly-once", MODES)
    return harness.write_and_report(args.out, doc, info, [
        f"{mode:15s} {harness.fmt(m['records_per_s']['median'])} rec/s  "
        f"vs EO {[round(x, 2) for x in m['vs_exactly_once_per_repetition']]}" for mode, m in doc["modes"].items()])


if __name__ == "__main__":
    sys.exit(main())
