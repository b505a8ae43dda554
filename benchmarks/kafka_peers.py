"""The peer engines of the side-by-side Kafka benchmark (``benchmarks/kafka.py``), each the
engine's own Kafka → Kafka job, run in a process of its own:

    python benchmarks/kafka_peers.py ENGINE --servers S --src T --out O --start '{"0": 12, "1": 9}'
        --interval-ms E --work DIR --stop FILE --result FILE [--bounded] [--jars a.jar,b.jar]

* ``spark-microbatch``: Spark Structured Streaming, ``readStream.format("kafka")`` →
  ``writeStream.format("kafka")`` (key, value unchanged) with ``trigger(processingTime=E ms)``
  and a checkpoint location; Spark's Kafka sink is **at-least-once** (a micro-batch replayed
  after a failure is written again);
* ``spark-rtm``: the same query in Real-Time Mode, ``trigger(realTime=E ms)`` (long-running
  tasks, records forwarded as they come; checkpoints at the end of each E-long batch); its
  Kafka sink is **at-least-once** as well;
* ``pyflink``: PyFlink DataStream, ``KafkaSource`` → ``KafkaSink`` with
  ``DeliveryGuarantee.EXACTLY_ONCE`` (Kafka transactions committed when a checkpoint
  completes), checkpoints every E ms, ``CheckpointingMode.EXACTLY_ONCE``; the pipeline stays in
  the JVM (no Python function, so no Beam worker). Runs in PyFlink's own virtualenv.

Every engine reads ``src`` from the given ``--start`` offsets (the end offsets before it
started: it reads only its own run's records) and writes ``out``. Unbounded (latency) runs go
on until the ``--stop`` file exists; ``--bounded`` (capacity) reads up to the end offsets at
start and stops by itself where the engine can (Spark micro-batch: ``availableNow``; Flink:
``set_bounded(latest)``) — RTM cannot, so the caller stops it once the output is complete.
The result file gets ``{"ok": bool, "error": str | None, "versions": …}``.

Only the standard library is imported at the top: each engine imports its own package in its
function (pyspark from epochal's environment, pyflink from its own).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ENGINES = ("spark-microbatch", "spark-rtm", "pyflink")
#: how the JSON and the tables describe each engine's delivery
GUARANTEES = {"spark-microbatch": "at-least-once (Spark's Kafka sink)",
              "spark-rtm": "at-least-once (Spark's Kafka sink, Real-Time Mode)",
              "pyflink": "exactly-once (KafkaSink DeliveryGuarantee.EXACTLY_ONCE)"}


def _stopped(args) -> bool:
    return Path(args.stop).exists()


def run_spark(args, real_time: bool) -> dict:
    import pyspark
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # RTM runs one long-lived task per source partition and per stage: slots for all of them
    spark = (SparkSession.builder.master(f"local[{max(4, 2 * len(args.start) + 2)}]").appName(args.engine)
             .config("spark.jars", args.jars)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(len(args.start)))
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC")
             # RTM refuses batches shorter than this (5 s by default): lowered to the cadence asked for
             .config("spark.sql.streaming.realTimeMode.minBatchDuration", f"{args.interval_ms}ms")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    start = json.dumps({args.src: {str(p): o for p, o in args.start.items()}})
    frame = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.servers)
             .option("subscribe", args.src).option("startingOffsets", start)
             .option("failOnDataLoss", "true").load())
    writer = (frame.selectExpr("key", "value").writeStream.format("kafka")
              .option("kafka.bootstrap.servers", args.servers).option("topic", args.out)
              .option("checkpointLocation", str(Path(args.work) / "checkpoint")).outputMode("update"))
    if real_time:
        writer = writer.trigger(realTime=f"{args.interval_ms} milliseconds")
    elif args.bounded:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.interval_ms} milliseconds")
    query = writer.start()
    try:
        if args.bounded and not real_time:
            query.awaitTermination()
        else:
            while not _stopped(args) and query.isActive:
                query.awaitTermination(0.05)
        if query.exception() is not None:
            raise RuntimeError(f"the Spark query failed: {query.exception()}")
    finally:
        query.stop()
        spark.stop()
    return {"versions": {"pyspark": pyspark.__version__, "connector_jars": [Path(j).name for j in args.jars.split(",")]}}


def run_pyflink(args) -> dict:
    from pyflink.common import Configuration, Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import (KafkaOffsetsInitializer, KafkaRecordSerializationSchema,
                                                     KafkaSink, KafkaSource, KafkaTopicPartition)
    from pyflink.version import __version__

    conf = Configuration()
    conf.set_string("pipeline.jars", ";".join("file://" + j for j in args.jars.split(",")))
    conf.set_string("taskmanager.numberOfTaskSlots", str(len(args.start)))
    conf.set_string("restart-strategy.type", "none")
    conf.set_string("execution.checkpointing.dir", "file://" + str(Path(args.work) / "checkpoints"))
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(len(args.start))
    env.enable_checkpointing(args.interval_ms, CheckpointingMode.EXACTLY_ONCE)
    starting = {KafkaTopicPartition(args.src, int(p)): o for p, o in args.start.items()}
    builder = (KafkaSource.builder().set_bootstrap_servers(args.servers).set_topics(args.src)
               .set_group_id(f"flink-{Path(args.work).name}")
               .set_starting_offsets(KafkaOffsetsInitializer.offsets(starting))
               .set_value_only_deserializer(SimpleStringSchema()))
    if args.bounded:
        builder = builder.set_bounded(KafkaOffsetsInitializer.latest())
    sink = (KafkaSink.builder().set_bootstrap_servers(args.servers)
            .set_record_serializer(KafkaRecordSerializationSchema.builder().set_topic(args.out)
                                   .set_value_serialization_schema(SimpleStringSchema()).build())
            .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
            .set_transactional_id_prefix(f"flink-{Path(args.work).name}")
            .set_property("transaction.timeout.ms", "600000").build())
    (env.from_source(builder.build(), WatermarkStrategy.no_watermarks(), "kafka-in", Types.STRING())
        .sink_to(sink).name("kafka-out"))
    if args.bounded:
        env.execute("kafka-bench-pyflink")
    else:
        client = env.execute_async("kafka-bench-pyflink")
        while not _stopped(args):
            time.sleep(0.05)  # polling the caller's stop file, not standing in for a protocol step
        client.cancel().result()
    return {"versions": {"apache-flink": __version__, "connector_jars": [Path(j).name for j in args.jars.split(",")]}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine", choices=ENGINES)
    p.add_argument("--servers", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--start", type=json.loads, required=True, help='{"partition": offset, ...}')
    p.add_argument("--interval-ms", type=int, required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--jars", default="")
    p.add_argument("--bounded", action="store_true")
    args = p.parse_args(argv)
    rec: dict = {"engine": args.engine, "ok": False, "error": None}
    try:
        if args.engine == "pyflink":
            rec.update(run_pyflink(args))
        else:
            rec.update(run_spark(args, real_time=args.engine == "spark-rtm"))
        rec["ok"] = True
    except Exception as exc:  # noqa: BLE001 — the caller records it beside the other engines
        rec["error"] = f"{args.engine}: {type(exc).__name__}: {str(exc)[:1500]}"
        traceback.print_exc()
    Path(args.result).write_text(json.dumps(rec))
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
