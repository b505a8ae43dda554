"""The README's "Results" tables of the connector benchmarks (``kafka.py``, ``postgres.py``,
``tables.py``): one ``section_<name>(doc)`` per ``benchmarks/results/<name>.json``, shaped
like :mod:`report_sections` (a title, what was measured and how, one table).
"""
from __future__ import annotations

from report_sections import _command, _median, _ms, _n, _table


def _loads(runs: list[dict]) -> str:
    """The range of the one-minute load average before the runs: how noisy the machine was."""
    loads = [r["loadavg_before"][0] for r in runs if r.get("loadavg_before")]
    return f"{min(loads, default=0):.1f}–{max(loads, default=0):.1f}"


def _per_rep(values: list) -> str:
    return ", ".join(_n(x, ".2f") for x in values)


def section_kafka(doc: dict) -> str:
    cfg = doc["config"]
    rows = [[name, _n(m["records_per_s"]["median"]),
             f"{_n(m['records_per_s']['min'])}–{_n(m['records_per_s']['max'])}",
             _per_rep(m["vs_client_per_repetition"])] for name, m in doc.get("modes", {}).items()]

    def ms(r, q):
        v = (r.get("latency_ms") or {}).get(q)
        return "-" if v is None else f"{v:,.0f}"

    lat = [[r["mode"], _n(r["rate"]), "-" if r["epoch_ms"] is None else str(r["epoch_ms"]),
            f"{r.get('seen', 0):,} / {r['records']:,}", f"{ms(r, 'p50')} / {ms(r, 'p99')} / {ms(r, 'p999')}",
            f"{r['loadavg_before'][0]:.1f}"] for r in doc.get("latency", [])]
    every = all(r.get("output_records") == r.get("records") for r in doc["runs"] if r.get("mode") != "at-least-once")
    return (f"### Kafka: topic to topic\n\n"
            f"Records pass through unchanged (value, key) from a {cfg['partitions']}-partition topic to another, "
            f"parallelism {cfg['parallelism']}, runtime `{cfg['runtime']}`, broker: {doc.get('broker', 'noida-db 0.2.3')}. "
            f"`exactly-once`: `KafkaSource` → map → `KafkaSink`; `at-least-once`: the sink's idempotent producer "
            f"flushed at each barrier; `client`: confluent-kafka alone, consume → produce in one process; "
            f"`client-transactional`: the same committing offsets and records in a transaction every epoch; "
            f"latency only, no pipeline: `broker`, the reader reads the input topic, and `broker-transactional`, "
            f"the producer commits its own transactions every epoch — the floor of an exactly-once last hop"
            + (f"; the engines users would pick instead, on the same broker and input topic: `spark-rtm` (Spark "
               f"Structured Streaming's Real-Time Mode with Spark's own Kafka connector, **at-least-once**), "
               f"`pyflink` (PyFlink's Kafka connector, `EXACTLY_ONCE`, checkpoints every epoch)"
               if any(r.get("mode") in ("spark-rtm", "pyflink", "spark-microbatch") for r in doc.get("latency", []))
               else "")
            + (f". The latency runs' first {doc['config']['warmup_seconds']:g} s of load are not measured "
               f"(`--warmup-seconds`)" if doc["config"].get("warmup_seconds") else "")
            + ".\n\n"
            + (f"Capacity on a backlog of {cfg['records']:,} records (100-byte values), {cfg['interval']:g} s epochs; "
               f"rate = output records / (last − first write time); median and range of {cfg['repetitions']} "
               f"interleaved repetitions, ratio to `client` per repetition; every exactly-once run's output "
               f"{'held every record once' if every else 'did NOT hold every record once'} (load average before "
               f"{_loads(doc['runs'])}; {_command(doc)}):\n\n"
               + _table(["mode", "records/s", "min–max", "vs client"], rows) if rows else "")
            + (f"\n\nLatency, produce → visible to a read_committed consumer (its own process), producer in its own "
               f"process, {cfg['latency_seconds']:g} s per run, start-up excluded:\n\n"
               + _table(["mode", "records/s", "epoch ms", "seen", "p50 / p99 / p99.9 ms", "load"], lat)
               if lat else ""))


def section_postgres(doc: dict) -> str:
    cfg = doc["config"]
    rows = []
    for name, m in doc["modes"].items():
        runs = [r for r in doc["runs"] if r["mode"] == name and not r.get("error")]
        rows.append([name, _n(m["records_per_s"]["median"]),
                     f"{_n(m['records_per_s']['min'])}–{_n(m['records_per_s']['max'])}",
                     _per_rep(m["vs_file_parquet_per_repetition"]),
                     _ms(_median([r["checkpoint_s_p50"] for r in runs if r.get("checkpoint_s_p50")]))])
    return (f"### PostgreSQL sink vs FileSink\n\n"
            f"{cfg['rows']:,} rows `(id, key, value, t)`, parallelism 2, unthrottled, {cfg['interval']:g} s "
            f"checkpoints, runtime `{cfg['runtime']}`, a throw-away {doc.get('server', 'PostgreSQL').split(' on ')[0]} "
            f"on this machine. `postgres`: COPY per epoch, PREPARE TRANSACTION at the barrier, COMMIT PREPARED on "
            f"completion; `postgres-at-least-once`: committed at each barrier; `postgres-upsert`: exactly-once with "
            f"`upsert_key` (every key twice; its rows are buffered and written by one `executemany` in the durability "
            f"step, so its rate counts rows reaching the sink and its checkpoint time carries the writes). Rate = rows / (first to last stamp, taken by a map chained before the "
            f"sink); every run's output read back held every row once. Median and range of {cfg['repetitions']} "
            f"interleaved repetitions, ratio to FileSink parquet per repetition (load average before the runs "
            f"{_loads(doc['runs'])}; {_command(doc)}):\n\n"
            + _table(["mode", "rows/s", "min–max", "vs FileSink parquet", "checkpoint p50 ms"], rows))


def section_tables(doc: dict) -> str:
    cfg = doc["config"]
    rows = []
    for name, s in doc["sinks"].items():
        sink, shape = name.split("/")
        runs = [r for r in doc["runs"] if r["sink"] == sink and r["shape"] == shape and not r.get("error")]
        rows.append([sink, shape, _n(s["rows_per_s"]["median"]), _n(s["vs_filesink_median"], ".2f"),
                     _per_rep(s["vs_filesink_per_repetition"]),
                     _ms(_median([r["checkpoint_s_p50"] for r in runs if r.get("checkpoint_s_p50")])),
                     str(len(runs))])
    return (f"### Table sinks: Delta Lake and Iceberg vs FileSink\n\n"
            f"Rows `{{id, key, value, payload}}` from an unthrottled source through a map that stamps each row "
            f"as it reaches the sink, parallelism {cfg['parallelism']}, exactly-once, {cfg['interval']:g} s "
            f"checkpoints, runtime `{cfg['runtime']}`: {cfg['rows']:,} dict rows (records) or "
            f"{cfg['columnar_rows']:,} rows in 8,192-row Arrow batches (columnar). Steady rate = (rows − 1) / "
            f"(last − first stamp) over the rows read back from the committed output with each system's own reader "
            f"(every row exactly once in every run); median of {cfg['repetitions']} interleaved repetitions, ratio "
            f"to FileSink per repetition (same invocation; load average before the runs {_loads(doc['runs'])}; "
            f"{_command(doc)}):\n\n"
            + _table(["sink", "shape", "rows/s", "vs FileSink", "per repetition", "checkpoint p50 ms", "runs"], rows))
