"""What the Kafka sink asks the brokers from outside a writer's own transactions: the marker
of any group, the producers a job's runs may have left with open transactions (and fencing
them), and whether an epoch's tagged first record is in the topic.

Used by recovery when a marker group is gone (:func:`epoch_in_topic`) and by ``epochal sinks
lingering`` (:func:`registered_producers`, :func:`fence`; :mod:`epochal.sinks.lingering`).
"""
from __future__ import annotations

import time

from epochal.connectors.kafka import recovery
from epochal.connectors.kafka.client import kafka
from epochal.sinks.base import SinkCommitError
from epochal.sinks.lingering import Lingering

#: seconds a probe's Kafka call may take
PROBE_TIMEOUT_S = 60.0


def _consumer(sink, group: str, **settings):
    """A consumer of ``group`` with the sink's security settings (never joins the group)."""
    conf = {k: v for k, v in sink.config.items() if k.startswith(("security.", "sasl.", "ssl.", "client."))}
    conf.update({"bootstrap.servers": sink.servers, "enable.auto.commit": False, "group.id": group}, **settings)
    return kafka().Consumer(conf)


def read_marker(sink, prefix: str, lineage: str, subtask: int) -> recovery.Marker | None:
    """The marker of one group, without waiting for open transactions."""
    ck = kafka()
    consumer = _consumer(sink, recovery.marker_group(prefix, subtask, lineage), **{"isolation.level": "read_uncommitted"})
    try:
        found = consumer.committed([ck.TopicPartition(sink.topic, 0)], timeout=PROBE_TIMEOUT_S)[0]
    finally:
        consumer.close()
    return recovery.Marker(found.offset, recovery.MarkerMeta.decode(found.metadata, subtask)) \
        if found.offset >= 0 else None


def registered_producers(sink, job: str, name: str, promised) -> list[Lingering]:
    """The transactional ids of the writers last registered in the marker groups of the
    checkpoint's lineage (and of the lineages its pending epochs name): each may hold an open
    transaction (librdkafka cannot list them). None is promised: a pending epoch lives in the
    checkpoint's write-ahead log and a resume produces it again if needed, so fencing them
    never loses one."""
    lineages = {promised.lineage} | {getattr(h, "lineage", "") for h in promised.handles}
    prefix = sink.transactional_id_prefix or f"epochal-{job}-{name}"
    found: dict[str, Lingering] = {}
    for lineage in sorted(lineages):
        j = 0
        while True:
            marker = read_marker(sink, prefix, lineage, j)
            if marker is None and j >= promised.parallelism:
                break
            if marker is not None and marker.meta is not None:
                meta = marker.meta
                # nobody is "this writer" here ("-" is no lineage): every registered writer is named
                for txid in recovery.fence_ids(prefix, {(lineage, j): marker}, "-", -1):
                    found.setdefault(txid, Lingering(
                        name, "kafka", txid, False,
                        f"producer of lineage {meta.lineage or '(legacy)'} subtask {meta.subtask} generation "
                        f"{meta.generation}; last committed epoch {marker.epoch} "
                        f"(group {recovery.marker_group(prefix, j, lineage)})"))
            j += 1
    return list(found.values())


def fence(sink, items: list[Lingering]) -> None:
    """``init_transactions`` with each item's transactional id: Kafka aborts its open
    transaction, and a zombie holding the id can no longer commit."""
    ck = kafka()
    for item in items:
        ck.Producer(dict(sink.config, **{"transactional.id": item.what})).init_transactions(PROBE_TIMEOUT_S)


def epoch_in_topic(sink, prefix: str, tag: bytes, since_ms: int, what: str) -> bool:
    """Whether the record carrying ``tag`` in its :data:`recovery.TAG_HEADER` header — an
    epoch transaction's first record — is visible to read_committed readers: the epoch was
    committed (transactions are atomic). Asked only when the marker group that would say so
    is gone (a group expires ``offsets.retention.minutes`` after its last commit, 7 days by
    default, e.g. while the job was down). Reads every partition from ``since_ms`` (the
    epoch's first write time; records carry it) to the end. ``what`` names the epoch in errors."""
    ck = kafka()
    consumer = _consumer(sink, f"{prefix}-scan", **{"isolation.level": "read_committed",
                                                    "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(sink.topic, timeout=PROBE_TIMEOUT_S).topics[sink.topic]
        wanted = [ck.TopicPartition(sink.topic, p, since_ms) for p in meta.partitions]
        start = [tp for tp in consumer.offsets_for_times(wanted, timeout=PROBE_TIMEOUT_S) if tp.offset >= 0]
        todo = {tp.partition for tp in start}
        consumer.assign(start)
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while todo:
            if time.monotonic() > deadline:
                raise SinkCommitError(f"{what}: looking for it in topic {sink.topic!r} took over {PROBE_TIMEOUT_S:.0f} s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == ck.KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                    continue
                raise SinkCommitError(f"{what}: reading topic {sink.topic!r}: {msg.error()}")
            if (recovery.TAG_HEADER, tag) in (msg.headers() or ()):
                return True
        return False
    finally:
        consumer.close()
