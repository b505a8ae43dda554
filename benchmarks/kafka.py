"""Kafka to Kafka: end-to-end latency and capacity of the Kafka connectors, side by side
with confluent-kafka alone (issue 34) and with Spark's and Flink's own Kafka jobs (issue 47),
all in one invocation on one Apache Kafka broker (the one the tests start, ``tests/kafka_broker.py``).

The pipeline is the same everywhere: records pass through unchanged (value, key), from a
``--partitions``-partition topic to another. Modes:

* ``exactly-once``: KafkaSource → map → KafkaSink, epochs of E ms (``checkpoint.interval``),
  read back ``read_committed``;
* ``at-least-once``: the same job, the sink's idempotent producer flushed at each barrier;
* ``client``: confluent-kafka alone in one process, a consumer feeding an idempotent producer;
* ``client-transactional``: confluent-kafka alone, consume → produce in transactions that
  commit the consumed offsets with the records every E ms: the hand-written exactly-once loop;
* ``spark-microbatch`` / ``spark-rtm``: Spark Structured Streaming with Spark's own Kafka
  connector (``spark-sql-kafka-0-10_2.13``), ``trigger(processingTime=E ms)`` / Real-Time Mode
  ``trigger(realTime=E ms)``; **at-least-once** (Spark's Kafka sink) — checked as such;
* ``pyflink``: PyFlink KafkaSource → KafkaSink, ``DeliveryGuarantee.EXACTLY_ONCE``, checkpoints
  every E ms, in its own virtualenv (:mod:`kafka_peers`, :mod:`kafka_peer_runs`; what cannot
  be installed here is recorded under ``unavailable`` with the reason);
* ``broker`` (latency only): no pipeline — the reader reads the input topic itself: the
  floor every mode stands on (producer, broker, reader and this machine's scheduling);
* ``broker-transactional`` (latency only): no pipeline either, but the producer writes in
  transactions committed every E ms: the floor of any exactly-once pipeline whose last hop
  commits every E ms on this broker (one producer; an engine has one per sink subtask).

**Latency** (``--rates`` × ``--epochs``), every run on the same broker and the same input
topic, each engine reading it from its end offsets when the run starts (so it reads only its
own run's records) and writing an output topic of its own: a producer process writes R records/s for
``--latency-seconds`` into the input topic, each value carrying its produce time; a
``read_committed`` reader process stamps every output record: latency = seen − produced,
p50/p99/p999 over all records; every record must be seen exactly once (at least once for
the at-least-once modes, whose duplicates are counted). Start-up is excluded: the load
starts once a warm-up record came through (:mod:`kafka_latency`), and its first
``--warmup-seconds`` (default 5) are not measured — every engine's first seconds of load
after a start ran behind here (epochal's by 0.3–1.6 s, catching up after 3–4 s, while the
fresh broker served its first transactions); ``--warmup-seconds 0`` measures them.

**Capacity**: a topic of ``--records`` records (100-byte values, 1,000 keys) is read from
its start (bounded at its end offsets); steady rate = output records / (last − first
record's append time) — output topics use ``LogAppendTime``, so the broker stamps every
engine's records alike (Flink's sink would copy the input records' timestamps). Beside it, the CPU seconds each run cost
apart from the broker's (``cpu_s``: the engine's process tree, or the client's process)
and the broker's own (``broker_cpu_s``): on a machine where the broker shares the cores,
records per CPU-second is the steadier comparison. ``--runtime local`` only: under Spark
the process tree did not hold all of the tasks' CPU (0.2–1.2 CPU-s measured for 600k
records that the local runtime's tasks need 4 CPU-s for), so no per-CPU figure is given. Exactly-once runs report the checkpoint
size per epoch: the sink's write-ahead log is most of it (``--wal-budget`` spills it).

``spark-rtm`` runs with ``--rtm-batch-ms`` (5 s, Spark's default minimum) batches, not the
epoch length: Real-Time Mode forwards records as they come within a batch, so its latency
does not wait for the batch to end, but each batch ends its long-running tasks and starts
new ones. With 100 ms batches (``--rtm-batch-ms 0``, the minimum lowered to match) it fell
behind 2,000 records/s: 78 batches in 108 s read 273 records (load 12–15).

Every record carries ``loadavg_before`` / ``loadavg_after`` (``os.getloadavg()``), the
document ``loadavg_start`` / ``loadavg_end``: on this shared 2-core machine a figure means
little without the load beside it.

    python benchmarks/kafka.py [--runtime spark|local] [--rates 10000,50000] [--epochs 10,20,50,100]
                               [--records 600000] [--repetitions 3] [--quick]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import harness  # noqa: E402
import kafka_latency  # noqa: E402
import kafka_peer_runs  # noqa: E402
from kafka_broker import BROKER_NAME, JVM_FLAGS, KAFKA_JVM_FLAGS, start_broker  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import KafkaSink  # noqa: E402
from epochal.sources import KafkaSource  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "kafka-apache.json"
PAYLOAD = b"x" * 100
ENGINE_MODES = ("exactly-once", "at-least-once")
PEER_MODES = kafka_peer_runs.ENGINES  # spark-microbatch, spark-rtm, pyflink
LATENCY_MODES = ["exactly-once", "at-least-once", "client", "client-transactional", *PEER_MODES, "broker",
                 "broker-transactional"]
UNTIMED_MODES = ("client", "broker")  # latency modes without epochs or commit intervals
MODES = ["exactly-once", "at-least-once", "client", "client-transactional", *PEER_MODES]
#: modes whose output may hold duplicates: they must hold every record at least once
AT_LEAST_ONCE = ("at-least-once", "spark-microbatch", "spark-rtm")
GUARANTEES = {"exactly-once": "exactly-once (epochal KafkaSink, transactions per epoch)",
              "at-least-once": "at-least-once (epochal KafkaSink, idempotent producer flushed per barrier)",
              "client": "confluent-kafka alone, idempotent producer (no failure handling)",
              "client-transactional": "exactly-once (confluent-kafka alone, a transaction every E ms)",
              "broker": "no pipeline (floor)", "broker-transactional": "no pipeline, transactional producer (floor)",
              **kafka_peer_runs.GUARANTEES}


def check_count(mode: str, seen: int, expected: int, duplicates: int = 0) -> str | None:
    """Why ``seen`` output records (``duplicates`` among them) break ``mode``'s guarantee
    for ``expected`` input records, or None."""
    if mode in AT_LEAST_ONCE:
        return None if seen >= expected else f"{mode}: {seen} distinct output records for {expected} input records"
    if seen != expected or duplicates:
        return f"{mode}: {seen} output records ({duplicates} duplicates) for {expected} input records"
    return None


def output_topic(broker, partitions: int) -> str:
    """A fresh topic whose records the broker stamps (``LogAppendTime``): every engine's
    output timed alike."""
    from confluent_kafka.admin import NewTopic

    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = broker.admin()
    for future in admin.create_topics([NewTopic(name, partitions, 1,
                                                config={"message.timestamp.type": "LogAppendTime"})]).values():
        future.result(30)
    broker._await_leaders(admin, name, partitions)
    return name


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


def sink_settings(args) -> dict:
    """The KafkaSink options the command line sets."""
    options = {"wal_budget": args.wal_budget} if args.wal_budget is not None else {}
    if args.producers is not None:
        options["producers"] = args.producers
    if args.sink_config:
        options["config"] = args.sink_config
    return options


def run_engine(broker, mode: str, args, src: str, spark) -> dict:
    """Capacity of the engine: the pass-through job over the full topic ``src``."""
    out = output_topic(broker, args.partitions)
    flow = ep.Dataflow(f"kafka-bench-{uuid.uuid4().hex[:6]}", parallelism=args.parallelism)
    sink_options = sink_settings(args)
    (flow.source("in", KafkaSource(broker.servers, src, stopping_offsets="latest"))
         .map("pass", lambda r: r)
         .sink("out", KafkaSink(broker.servers, out, **sink_options)))
    rec: dict = {}
    options = {"guarantee": mode,
               "checkpoint": ep.CheckpointConfig(interval=args.interval,
                                                 storage="file://" + tempfile.mkdtemp(dir=args.tmp)),
               "runtime": args.runtime}
    if spark is not None:
        options["spark"] = spark
    result = harness.run_job(flow, rec, 600, **options)
    if result is None:
        return rec
    stamps = output_stamps(broker, out)
    sizes = [e.get("bytes", 0) for e in result.completed_epochs]
    rec.update(output_records=len(stamps), records_per_s=steady_rate(stamps), attempts=result.attempts,
               epochs=len(result.completed_epochs),
               checkpoint_bytes_p50=harness.median(sizes), checkpoint_mb_max=max(sizes, default=0) / 1e6,
               checkpoint_s_p50=harness.median([e["duration_s"] for e in result.completed_epochs]))
    if mode == "at-least-once" and len(stamps) < args.records or mode != "at-least-once" and len(stamps) != args.records:
        rec["error"] = f"{mode}: {len(stamps)} output records for {args.records} input records"
    return rec


def run_peer(broker, mode: str, args, src: str, setup: dict) -> dict:
    """Capacity of a peer engine's own job over the full topic ``src`` (bounded where the
    engine can stop by itself; RTM is stopped once its output holds every record)."""
    out = output_topic(broker, args.partitions)
    cadence = int(args.interval * 1000)
    if mode == "spark-rtm" and args.rtm_batch_ms:
        cadence = max(cadence, args.rtm_batch_ms)
    job = kafka_peer_runs.PeerJob(setup, mode, broker.servers, src, out, {p: 0 for p in range(args.partitions)},
                                  cadence, args.tmp, bounded=True)
    t0 = time.monotonic()
    if mode == "spark-rtm":
        kafka_peer_runs.wait_output(broker, out, args.records, job, 600)
    else:
        job.wait(600)
    result = job.stop()
    stamps = output_stamps(broker, out)
    rec = {"output_records": len(stamps), "records_per_s": steady_rate(stamps), "wall_s": time.monotonic() - t0,
           "guarantee": GUARANTEES[mode], "versions": setup.get("versions")}
    error = result.get("error") if not result.get("ok") else None
    if mode == "spark-rtm" and error and len(stamps) >= args.records:
        error = None  # stopped from outside once complete: the query's own stop error is expected
    rec["error"] = error or check_count(mode, len(stamps), args.records)
    return {k: v for k, v in rec.items() if v is not None}


def run_raw(broker, args, src: str, mode: str) -> dict:
    """Capacity of confluent-kafka alone, one process: read_committed consumer → producer
    (``client``: idempotent; ``client-transactional``: offsets and records committed in a
    transaction every ``--interval`` s)."""
    from confluent_kafka import KafkaError, TopicPartition

    out = output_topic(broker, args.partitions)
    ends = broker.end_offsets(src)
    transactional = mode == "client-transactional"
    c, p = kafka_latency.clients(broker.servers, transactional, linger_ms=5,
                                 **{"enable.partition.eof": True})
    c.assign([TopicPartition(src, q, 0) for q in ends])
    done: set[int] = set()

    def at_end(msg):
        if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
            done.add(msg.partition())

    t0, cpu0 = time.monotonic(), time.process_time()
    kafka_latency.relay(c, p, out, args.interval * 1000 if transactional else None,
                        lambda: len(done) >= len(ends), at_end, wait_s=1.0)
    cpu = time.process_time() - cpu0  # this process's threads: the loop and librdkafka's
    stamps = output_stamps(broker, out)
    rec = {"output_records": len(stamps), "records_per_s": steady_rate(stamps), "wall_s": time.monotonic() - t0,
           "cpu_s": cpu}
    if len(stamps) != args.records:
        rec["error"] = f"{mode}: {len(stamps)} output records for {args.records} input records"
    return rec


def latency_job(broker, args, guarantee: str, epoch_s: float, src: str, out: str, spark, start: dict[int, int]):
    """Start KafkaSource (from the offsets ``start``) → map → KafkaSink (records pass
    through: value, key) unbounded."""
    flow = ep.Dataflow(f"kafka-lat-{uuid.uuid4().hex[:6]}", parallelism=args.parallelism)
    sink_options = sink_settings(args)
    offsets = {(src, p): o for p, o in start.items()}
    (flow.source("in", KafkaSource(broker.servers, src, starting_offsets=offsets, config=args.source_config))
         .map("pass", lambda r: r)
         .sink("out", KafkaSink(broker.servers, out, **sink_options)))
    options = {"guarantee": guarantee, "runtime": args.runtime,
               "checkpoint": ep.CheckpointConfig(interval=epoch_s, max_concurrent=args.max_concurrent,
                                                 inline_state=args.inline_state,
                                                 storage="file://" + tempfile.mkdtemp(dir=args.tmp))}
    if spark is not None:
        options["spark"] = spark
    return flow.start(**options)


def run_latency(broker, args, mode: str, rate: float, epoch_s: float | None, spark, src: str,
                peers: dict) -> dict:
    """One latency run: ``mode`` (exactly-once / at-least-once: the engine with epochs of
    ``epoch_s``; client / client-transactional: confluent-kafka alone, committing every
    ``epoch_s``; a peer engine's own job at that cadence) under ``rate`` records/s for
    ``--latency-seconds``, reading the shared input topic ``src`` from its end offsets now;
    every record must be seen exactly once (at least once: :data:`AT_LEAST_ONCE`) by the
    read_committed reader."""
    ctx = mp.get_context("spawn")
    start = broker.end_offsets(src)
    floor = mode.startswith("broker")
    out = src if floor else broker.create_topic(None, args.partitions)
    total = int(rate * args.latency_seconds)
    seen, go, stop, results = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=kafka_latency.read, args=(broker.servers, out, args.partitions, total, seen, results,
                                                          args.latency_seconds + args.warmup_seconds + 60,
                                                          start if floor else None),
                         daemon=True)
    commit_ms = epoch_s * 1000 if mode == "broker-transactional" else None
    loader = ctx.Process(target=kafka_latency.load, args=(broker.servers, src, rate, args.latency_seconds,
                                                          args.partitions, go, commit_ms, args.warmup_seconds),
                          daemon=True)
    rec = {"mode": mode, "guarantee": GUARANTEES[mode], "rate": rate,
           "epoch_ms": None if epoch_s is None else round(epoch_s * 1000),
           "records": total, "warmup_s": args.warmup_seconds, "loadavg_before": list(os.getloadavg())}
    if mode in PEER_MODES:
        rec["versions"] = peers[mode].get("versions")
    reader.start()
    loader.start()
    handle = piper = peer = None
    try:
        if mode in ENGINE_MODES:
            handle = latency_job(broker, args, mode, epoch_s, src, out, spark, start)
        elif mode in PEER_MODES:
            cadence = rec["epoch_ms"]
            if mode == "spark-rtm" and args.rtm_batch_ms:  # one run per rate: the batch does not vary
                cadence = rec["rtm_batch_ms"] = args.rtm_batch_ms
            peer = kafka_peer_runs.PeerJob(peers[mode], mode, broker.servers, src, out, start, cadence, args.tmp)
        elif not floor:
            piper = ctx.Process(target=kafka_latency.pipe, args=(
                broker.servers, src, out, args.partitions,
                None if mode == "client" else epoch_s * 1000, stop, start), daemon=True)
            piper.start()
        if not kafka_latency.warm(broker.servers, src, args.partitions, seen, args.start_timeout):
            rec["error"] = f"latency {mode} {rate}/s {rec['epoch_ms']} ms: the pipeline never started" + (
                f"; {peer.log_tail()}" if peer is not None else "")
            return rec
        cpu0 = harness.tree_cpu_seconds()
        go.set()
        try:
            rec.update(results.get(timeout=args.latency_seconds + args.warmup_seconds + 120))
        except queue.Empty:
            rec["error"] = f"latency {mode} {rate}/s {rec['epoch_ms']} ms: the reader did not finish"
            return rec
        cpu1 = harness.tree_cpu_seconds()
        rec["cpu_s"] = None if cpu0 is None or cpu1 is None or peer is not None else cpu1 - cpu0
        rec["loadavg_after"] = list(os.getloadavg())
        why = check_count(mode, rec["seen"], total, rec["duplicates"])
        if why:
            rec["error"] = f"latency {rate}/s {rec['epoch_ms']} ms: {why}"
        return rec
    finally:
        stop.set()
        go.set()
        if handle is not None:
            handle.cancel()
            try:
                handle.wait(60)
            except Exception:  # noqa: BLE001 — a cancelled job raises JobFailedError("cancelled")
                pass
        if peer is not None:
            result = peer.stop()
            if not result.get("ok") and mode != "spark-rtm" and not rec.get("error"):
                rec["error"] = result.get("error")  # RTM's stop interrupts a batch: its error says nothing
        for proc in (piper, loader, reader):
            if proc is not None:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="spark", choices=["spark", "local"])
    parser.add_argument("--records", type=int, default=600_000,
                        help="capacity backlog (records)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0, help="capacity runs: checkpoint interval (s)")
    parser.add_argument("--repetitions", type=int, default=3, help="capacity runs")
    parser.add_argument("--rates", default="10000,50000", help="latency runs: records/s, comma-separated")
    parser.add_argument("--epochs", default="10,20,50,100", help="latency runs: epoch lengths (ms)")
    parser.add_argument("--latency-modes", default=",".join(LATENCY_MODES))
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--warmup-seconds", type=float, default=5.0,
                        help="latency runs: seconds of the same load before the measured records (not measured: "
                             "the first seconds after a start caught up from 0.3-1.6 s behind here, on the broker's "
                             "first transactions); 0 measures from the start")
    parser.add_argument("--start-timeout", type=float, default=420.0,
                        help="latency runs: seconds a pipeline may take to start (a Spark session took 2.5 min "
                             "to run its first batch at load 31 here)")
    parser.add_argument("--wal-budget", default=None, help="KafkaSink wal_budget (bytes or '64MB')")
    parser.add_argument("--producers", type=int, default=None, help="KafkaSink producers (default: the sink's)")
    parser.add_argument("--max-concurrent", type=int, default=1,
                        help="latency runs: checkpoint.max_concurrent (epochs pending at once)")
    parser.add_argument("--inline-state", type=int, default=ep.CheckpointConfig.inline_state,
                        help="latency runs: CheckpointConfig.inline_state (bytes)")
    parser.add_argument("--source-config", type=json.loads, default=None,
                        help="latency runs: more KafkaSource consumer settings, a JSON object")
    parser.add_argument("--sink-config", type=json.loads, default=None,
                        help="more KafkaSink producer settings, a JSON object")
    parser.add_argument("--capacity-modes", default=",".join(MODES))
    parser.add_argument("--rtm-batch-ms", type=int, default=5000,
                        help="spark-rtm: Real-Time Mode batch (checkpoint) length at least this (ms; Spark's own "
                             "minimum, spark.sql.streaming.realTimeMode.minBatchDuration, is 5000). 0: the epoch "
                             "length — at 100 ms batches RTM relaunches its tasks every batch and fell behind "
                             "2,000 records/s here (module docstring)")
    parser.add_argument("--broker-jvm", default="tests", choices=["tests", "kafka"],
                        help="the broker's JVM: the tests' quick-start flags, or Kafka's own start-script flags")
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--quick", "--smoke", dest="quick", action="store_true",
                        help="a few seconds per engine (plus its start-up): checks every engine runs and is checked")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    if args.quick:
        args.records, args.repetitions, args.latency_seconds = 20_000, 1, 2.0
        args.warmup_seconds = min(args.warmup_seconds, 1.0)
        args.rates, args.epochs = "2000", "100"
    rates = [float(x) for x in args.rates.split(",") if x]
    epochs = [int(x) for x in args.epochs.split(",") if x]
    modes = [m for m in args.latency_modes.split(",") if m]
    capacity_modes = [m for m in args.capacity_modes.split(",") if m]
    args.tmp = args.tmp or tempfile.mkdtemp(prefix="epochal-kafka-bench-")
    os.makedirs(args.tmp, exist_ok=True)  # a --tmp that does not exist yet
    info = harness.machine()
    doc = harness.new_doc("kafka", args, info)
    broker_flags = KAFKA_JVM_FLAGS if args.broker_jvm == "kafka" else JVM_FLAGS
    doc.update(runs=[], latency=[], errors=[], broker=BROKER_NAME, broker_jvm=list(broker_flags), guarantees=GUARANTEES,
               loadavg_start=list(os.getloadavg()), cpu_count=os.cpu_count())
    wanted = sorted({m for m in [*([] if args.skip_latency else modes), *([] if args.skip_capacity else capacity_modes)]
                     if m in PEER_MODES})
    peers = kafka_peer_runs.prepare(wanted)
    doc["peers"] = {m: {k: v for k, v in p.items() if k != "python"} for m, p in peers.items()}
    doc["unavailable"] = {m: p["unavailable"] for m, p in peers.items() if "unavailable" in p}
    for m, why in doc["unavailable"].items():
        print(f"{m}: not run: {why}", flush=True)
    modes = [m for m in modes if m not in doc["unavailable"]]
    capacity_modes = [m for m in capacity_modes if m not in doc["unavailable"]]
    broker = None
    spark = None
    try:
        if args.runtime == "spark":
            from epochal.runtime.launch.spark import _local_session

            spark = _local_session(2 * args.parallelism + 2)
        # one broker for the whole invocation: every engine on the same one
        broker = start_broker(flags=broker_flags)
        if not args.skip_latency:
            src = broker.create_topic(None, args.partitions)  # ... and the same input topic
            for rate in rates:
                for mode in modes:
                    untimed = mode in UNTIMED_MODES or mode == "spark-rtm" and args.rtm_batch_ms
                    for epoch_ms in ([None] if untimed else epochs):
                        rec = run_latency(broker, args, mode, rate, None if epoch_ms is None else epoch_ms / 1000,
                                          spark, src, peers)
                        doc["latency"].append(rec)
                        harness.write_json(args.out, doc)  # what finished survives a run killed later
                        print(json.dumps({k: rec.get(k) for k in ("mode", "rate", "epoch_ms", "latency_ms", "seen",
                                                                  "duplicates", "longest_gap_ms", "gap_at_s",
                                                                  "loadavg_before", "error")}),
                              flush=True)
                        if rec.get("error"):
                            doc["errors"].append(rec["error"])
        if not args.skip_capacity:
            src = broker.create_topic(None, args.partitions)
            fill(broker, src, args.records, args.partitions)
            for rep in range(args.repetitions):
                for mode in harness.rotated(capacity_modes, rep):
                    rec = {"mode": mode, "records": args.records, "loadavg_before": list(os.getloadavg())}
                    broker_cpu0 = harness.process_cpu_seconds(broker.proc.pid)
                    if mode in ENGINE_MODES:
                        rec.update(run_engine(broker, mode, args, src, spark))
                    elif mode in PEER_MODES:
                        rec.update(run_peer(broker, mode, args, src, peers[mode]))
                    else:
                        rec.update(run_raw(broker, args, src, mode))
                    broker_cpu = harness.process_cpu_seconds(broker.proc.pid)
                    if broker_cpu0 is not None and broker_cpu is not None:
                        rec["broker_cpu_s"] = broker_cpu - broker_cpu0
                        if mode in ENGINE_MODES and rec.get("cpu_s") is not None:
                            rec["cpu_s"] -= rec["broker_cpu_s"]  # the tree includes the broker (our child)
                    if args.runtime == "spark" and mode in ENGINE_MODES:
                        rec.pop("cpu_s", None)  # not all of it (module docstring)
                    elif rec.get("cpu_s") and rec.get("output_records"):
                        rec["records_per_cpu_s"] = rec["output_records"] / rec["cpu_s"]
                    rec["repetition"] = rep
                    rec["loadavg_after"] = list(os.getloadavg())
                    doc["runs"].append(rec)
                    harness.write_json(args.out, doc)
                    print(json.dumps({k: rec.get(k) for k in ("mode", "repetition", "records_per_s", "records_per_cpu_s",
                                                              "broker_cpu_s",
                                                              "checkpoint_bytes_p50", "loadavg_before", "error")}),
                          flush=True)
                    if rec.get("error"):
                        doc["errors"].append(rec["error"])
    finally:
        if broker is not None:
            broker.stop()
    doc["loadavg_end"] = list(os.getloadavg())
    lines = []
    if doc["runs"]:
        doc["modes"] = harness.compare(doc["runs"], "records_per_s", "mode", "client",
                                       sorted({r["mode"] for r in doc["runs"]}, key=MODES.index))
        lines += [f"capacity {mode:22s} {harness.fmt(m['records_per_s']['median'])} rec/s  vs client "
                  f"{[round(x, 2) for x in m['vs_client_per_repetition']]}" for mode, m in doc["modes"].items()]
        if all(r.get("records_per_cpu_s") for r in doc["runs"]):
            doc["modes_per_cpu_s"] = harness.compare(doc["runs"], "records_per_cpu_s", "mode", "client",
                                                     sorted({r["mode"] for r in doc["runs"]}, key=MODES.index))
            lines += [f"per CPU-s {mode:21s} {harness.fmt(m['records_per_cpu_s']['median'])} rec/CPU-s  vs client "
                      f"{[round(x, 2) for x in m['vs_client_per_repetition']]}"
                      for mode, m in doc["modes_per_cpu_s"].items()]
    lines += [f"latency {r['mode']:22s} {r['guarantee'].split(' (')[0][:13]:13s} {r['rate']:>8,.0f}/s "
              f"{str(r['epoch_ms']):>4s} ms  "
              f"p50/p99/p999 {(r.get('latency_ms') or {}).get('p50')}/{(r.get('latency_ms') or {}).get('p99')}/"
              f"{(r.get('latency_ms') or {}).get('p999')} ms  load {r['loadavg_before'][0]:.1f}"
              for r in doc["latency"]]
    return harness.write_and_report(args.out, doc, info, lines)


if __name__ == "__main__":
    sys.exit(main())
