"""Processes of the Kafka latency runs (``benchmarks/kafka.py``): a paced producer, a
``read_committed`` reader that stamps each output record, and confluent-kafka alone as the
pipeline (plain consume → produce, and consume → produce in transactions committed every
N ms: :func:`relay`, which the capacity runs of ``benchmarks/kafka.py`` use too). Each runs
in its own process, as a user's producer and consumer would.

Input values are ``b"<seq>:<produce time, µs since the epoch>"``; every pipeline copies the
value unchanged, so the reader computes latency = seen − produced for each record and
checks that every sequence number arrives exactly once. Values starting with ``w:`` are
warm-up records: the measured load starts only after the reader saw one through the
pipeline (start-up excluded, a condition, not a sleep).
"""
from __future__ import annotations

import time
import uuid

from epochal.connectors.kafka.source import FETCH_PACING  # every consumer here fetches as the KafkaSource does

PARTITION_KEYS = 1000


def load(servers: str, topic: str, rate: float, seconds: float, partitions: int, go,
         commit_ms: float | None = None, warmup: float = 0.0) -> None:
    """Produce ``rate`` records/s for ``seconds`` once ``go`` is set, paced in 1 ms ticks
    (every record due by now is produced at each tick; its value carries its due time's
    actual produce time). ``commit_ms``: in transactions, committed every ``commit_ms`` ms
    (the ``broker-transactional`` floor); a commit holds the ticks up, as it would a sink's
    last hop, and records produced after it carry their own produce time. ``warmup``: the
    same load runs that many seconds first, its records marked ``u:`` (:func:`read` counts
    them apart), so the measured records find every process past its start-up."""
    from confluent_kafka import Producer

    transactional = commit_ms is not None
    conf = {"bootstrap.servers": servers, "linger.ms": 1, "queue.buffering.max.messages": 1_000_000}
    if transactional:
        conf["transactional.id"] = f"floor-{uuid.uuid4().hex}"
    producer = Producer(conf)
    if transactional:
        producer.init_transactions(30)
    go.wait()
    if transactional:
        producer.begin_transaction()
    last = time.monotonic()
    warm = int(rate * warmup)
    total = warm + int(rate * seconds)
    t0 = time.monotonic()
    i = 0
    while i < total:
        due = min(total, int((time.monotonic() - t0) * rate) + 1)
        while i < due:
            now_us = time.time_ns() // 1000
            seq = i - warm  # the measured records' sequence numbers start at 0
            try:
                if seq < 0:
                    producer.produce(topic, b"u:%d" % now_us, b"k%d" % (i % PARTITION_KEYS), partition=i % partitions)
                else:
                    producer.produce(topic, b"%d:%d" % (seq, now_us), b"k%d" % (seq % PARTITION_KEYS),
                                     partition=seq % partitions)
            except BufferError:
                producer.poll(0.001)
                continue
            i += 1
        producer.poll(0)
        if transactional and (time.monotonic() - last) * 1000 >= commit_ms:
            producer.commit_transaction(30)
            producer.begin_transaction()
            last = time.monotonic()
        time.sleep(0.001)
    if transactional:
        producer.commit_transaction(30)
    producer.flush(60)


def warm(servers: str, topic: str, partitions: int, seen, timeout: float) -> bool:
    """Produce a warm-up record every 50 ms (to every partition) until ``seen`` is set."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": servers, "linger.ms": 0})
    deadline = time.monotonic() + timeout
    while not seen.is_set() and time.monotonic() < deadline:
        for p in range(partitions):
            producer.produce(topic, b"w:%d" % (time.time_ns() // 1000), b"w", partition=p)
        producer.flush(5)
        seen.wait(0.05)
    return seen.is_set()


def read(servers: str, topic: str, partitions: int, total: int, seen, results, timeout: float,
         start: dict[int, int] | None = None) -> None:
    """Read ``topic`` read_committed from its start (or the offsets ``start``) until every one of ``total`` sequence
    numbers arrived (or ``timeout`` s after the first warm-up record); put the summary on
    ``results``: latencies (ms) p50/p99/p999/max, records seen, duplicates, missing."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex, "isolation.level": "read_committed",
                  "fetch.wait.max.ms": 1, "fetch.min.bytes": 1, **FETCH_PACING})
    c.assign([TopicPartition(topic, q, (start or {}).get(q, 0)) for q in range(partitions)])
    got = bytearray(total)
    lat: list[float] = []
    produced_at = [0] * total  # µs, per sequence number
    seen_at = [0] * total
    out_partition = bytearray(total)
    dupes = warmed = 0
    deadline = time.monotonic() + 600
    while len(lat) < total and time.monotonic() < deadline:
        for msg in c.consume(10000, 0.002):
            if msg.error():
                continue
            now_us = time.time_ns() // 1000
            seq, _, stamp = msg.value().partition(b":")
            if seq == b"u":  # the warm-up load (load(warmup=)): not measured
                warmed += 1
                continue
            if seq == b"w":
                if not seen.is_set():
                    seen.set()
                    deadline = time.monotonic() + timeout
                continue
            i = int(seq)
            if got[i]:
                dupes += 1
                continue
            got[i] = 1
            produced_at[i], seen_at[i], out_partition[i] = int(stamp), now_us, msg.partition()
            lat.append((now_us - int(stamp)) / 1000.0)
    c.close()
    lat.sort()
    summary = timeline([(p, s) for p, s, g in zip(produced_at, seen_at, got) if g])
    summary["slowest"] = slowest([(i, produced_at[i], seen_at[i], out_partition[i]) for i in range(total) if got[i]],
                                 partitions)

    def pct(q):
        return lat[max(0, min(len(lat) - 1, int(q / 100.0 * len(lat) + 0.999999) - 1))] if lat else None

    results.put({"seen": len(lat), "duplicates": dupes, "missing": total - len(lat), "warm_up_records_seen": warmed,
                 "latency_ms": {"p50": pct(50), "p99": pct(99), "p999": pct(99.9), "max": lat[-1] if lat else None},
                 **summary})


def slowest(rows: list[tuple[int, int, int, int]], partitions: int, share: float = 0.01) -> dict:
    """The slowest ``share`` of the records ``(seq, produced µs, seen µs, output partition)``:
    how many came from each input partition (``seq % partitions``, as :func:`load` writes)
    and went to each output partition, and when (s after the first record) they were
    produced and seen — a stall of one input partition, one output partition or one
    stretch of time tells itself apart here."""
    if not rows:
        return {}
    t0 = min(r[1] for r in rows)
    rows = sorted(rows, key=lambda r: r[2] - r[1], reverse=True)[:max(1, int(len(rows) * share))]
    by_in: dict[int, int] = {}
    by_out: dict[int, int] = {}
    for seq, _, _, out in rows:
        by_in[seq % partitions] = by_in.get(seq % partitions, 0) + 1
        by_out[out] = by_out.get(out, 0) + 1
    return {"records": len(rows), "by_input_partition": by_in, "by_output_partition": by_out,
            "produced_s": [round((min(r[1] for r in rows) - t0) / 1e6, 2), round((max(r[1] for r in rows) - t0) / 1e6, 2)],
            "seen_s": [round((min(r[2] for r in rows) - t0) / 1e6, 2), round((max(r[2] for r in rows) - t0) / 1e6, 2)]}


def timeline(stamps: list[tuple[int, int]], bucket_s: float = 0.5) -> dict:
    """Where in the run the latency went: ``max_ms_by_produce_time`` is the highest
    latency (ms) of the records produced in each ``bucket_s`` of the load (from its first
    record); ``longest_gap_ms`` the longest time the reader saw no record between the first
    and the last, and ``gap_at_s`` when it began (s after the first record was produced):
    at a steady rate, a gap far above the epoch length is a stall."""
    if not stamps:
        return {"max_ms_by_produce_time": [], "longest_gap_ms": None, "gap_at_s": None}
    t0 = min(p for p, _ in stamps)
    buckets: dict[int, float] = {}
    for p, s in stamps:
        b = int((p - t0) / 1e6 / bucket_s)
        buckets[b] = max(buckets.get(b, 0.0), (s - p) / 1000.0)
    seen = sorted(s for _, s in stamps)
    gap, at = max(((b - a, a) for a, b in zip(seen, seen[1:])), default=(0, t0))
    return {"max_ms_by_produce_time": [round(buckets.get(b, 0.0)) for b in range(max(buckets) + 1)],
            "longest_gap_ms": round(gap / 1000.0, 1), "gap_at_s": round((at - t0) / 1e6, 2)}


def clients(servers: str, transactional: bool, linger_ms: float = 1, **consumer_conf):
    """A read_committed consumer (no group commits) and an idempotent producer — a
    transactional one, initialised, when ``transactional``: confluent-kafka alone as a
    hand-written pipeline sets them up."""
    from confluent_kafka import Consumer, Producer

    group = uuid.uuid4().hex
    c = Consumer({"bootstrap.servers": servers, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed", **FETCH_PACING, **consumer_conf})
    conf = {"bootstrap.servers": servers, "linger.ms": linger_ms, "enable.idempotence": True}
    if transactional:
        conf["transactional.id"] = f"bench-{group}"
    p = Producer(conf)
    if transactional:
        p.init_transactions(30)
    return c, p


def relay(c, p, out: str, commit_ms: float | None, finished, on_error=None, wait_s: float = 0.001) -> None:
    """confluent-kafka alone: consume → produce ``out`` (value and key as they are) until
    ``finished()``. ``commit_ms`` None: the producer is plain. Else it is transactional and
    commits the consumed offsets with the records every ``commit_ms`` ms
    (``send_offsets_to_transaction``): the hand-written exactly-once loop. Error messages
    go to ``on_error(msg)``."""
    transactional = commit_ms is not None
    if transactional:
        p.begin_transaction()

    def commit():
        offsets = c.position(c.assignment())
        if offsets:
            p.send_offsets_to_transaction(offsets, c.consumer_group_metadata(), 30)
        p.commit_transaction(30)

    last = time.monotonic()
    while not finished():
        for msg in c.consume(10000, wait_s):
            if msg.error():
                if on_error is not None:
                    on_error(msg)
                continue
            while True:
                try:
                    p.produce(out, msg.value(), msg.key())
                    break
                except BufferError:
                    p.poll(0.001)
        p.poll(0)
        if transactional and (time.monotonic() - last) * 1000 >= commit_ms:
            commit()
            p.begin_transaction()
            last = time.monotonic()
    if transactional:
        commit()
    p.flush(120)
    c.close()


def pipe(servers: str, src: str, out: str, partitions: int, commit_ms: float | None, stop,
         start: dict[int, int] | None = None) -> None:
    """The latency runs' client pipeline (its own process): :func:`relay` of ``src``
    (subscribed, from its start; or assigned at the offsets ``start``) until ``stop`` is set."""
    from confluent_kafka import TopicPartition

    c, p = clients(servers, commit_ms is not None, **{"auto.offset.reset": "earliest", "fetch.wait.max.ms": 1})
    if start is None:
        c.subscribe([src])
    else:
        c.assign([TopicPartition(src, q, o) for q, o in start.items()])
    relay(c, p, out, commit_ms, stop.is_set)
