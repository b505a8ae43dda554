"""KafkaSink: one Kafka transaction per epoch and sink subtask, exactly-once for
``read_committed`` readers.

Table 4.1 of seed 004 (Kafka row), mapped onto :class:`~epochal.sinks.base.TwoPhaseCommitSink`
under librdkafka's constraints:

=========  ===============================================================================
Start      a handle for the epoch; on its first record a free producer of the subtask's
           small pool begins a Kafka transaction, and records stream into it (invisible to
           read_committed readers). With no free producer (earlier epochs still await
           completion) the epoch is only kept in the handle and produced at commit.
write      serialize a batch; produce it into the transaction and append the very bytes
           produced, ``(key, value, headers, timestamp)``, to the handle's **write-ahead
           log** (:mod:`~epochal.connectors.kafka.wal`): in memory, part of the checkpoint,
           up to ``wal_budget`` bytes per writer; spilled to a local file beyond it
Pre-commit seal at the barrier (task thread, O(1)): attach the commits still in flight
           (below) to the handle; durability step (uploader thread): fsync the epoch's
           spill file, if any, and flush the producer, so the commit later is short. The
           epoch's records are durable in the checkpoint itself (the handle), whatever
           happens to the Kafka transaction.
Commit     ``send_offsets_to_transaction`` of the **marker** (offset = epoch for the group
           ``<prefix>-<subtask>-epochs``) + ``commit_transaction``: records and marker become
           visible atomically — on the writer's commit thread
           (:mod:`~epochal.connectors.kafka.committer`), in epoch order, while the task
           thread goes on with the next epoch; a commit still in flight at the next barrier
           travels in that epoch's handle (``carried``). Idempotent: a writer that did not
           produce the transaction itself (after a restart, a rescale) asks Kafka for the
           marker and, if the epoch is missing, produces the handle's records again in a
           fresh transaction with the marker
Abort      ``abort_transaction`` of the open transaction (at a clean end: it is empty)
=========  ===============================================================================

librdkafka cannot resume another producer's open transaction after a crash (Flink does it by
reflection on the Java client), hence the write-ahead log: a crash between checkpoint
completion and the commit loses nothing, the next generation produces the epoch from the
restored handle (and its spill file). Its cost is the epoch's serialized records written
once more, into the checkpoint or the spill file (``benchmarks/kafka.py`` measures it); it
is released (memory given back, file deleted) once Kafka holds the epoch.

**Fencing.** Transactional ids are ``<prefix>-<subtask>-g<generation>-<slot>``: fresh per
generation, never reused. Before a new writer commits anything it fences
(``init_transactions``) every id the last registered generation of its subtask — and, after
a rescale, of the subtasks it absorbs — may hold, which aborts their open transactions and
makes a zombie's late commit fail; then it *registers* its own generation in its marker's
metadata, in a transaction of its own. See :mod:`~epochal.connectors.kafka.recovery`.

**At-least-once** (``SinkMode.DIRECT``): one idempotent producer, no transactions; records
are visible as soon as they are delivered, and every barrier waits until all of them were
(``flush``): after a restore, records of epochs after it are written again.

Modules: this one holds the sink's configuration and its driver-side hooks;
:mod:`~epochal.connectors.kafka.writer` the per-task writer (its hooks, transaction slots,
producing); :mod:`~epochal.connectors.kafka.generations` how a writer fences earlier
generations, reads and commits markers and replays epochs from their handles;
:mod:`~epochal.connectors.kafka.handle` the picklable epoch handle.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from epochal.alignment.factory import SinkMode
from epochal.config import parse_duration
from epochal.connectors.kafka import probes, wal
from epochal.connectors.kafka.client import check_servers, check_topic, client_config, kafka, require_topics
from epochal.connectors.kafka.generations import KAFKA_CALL_TIMEOUT_S
from epochal.connectors.kafka.handle import KafkaTransaction
from epochal.connectors.kafka.writer import COMMIT_DRAIN_S, MARKER_REFRESH_S, RELEASE_DRAIN_S, KafkaSinkWriter
from epochal.errors import ConfigError
from epochal.sinks.base import Sink, SinkContext
from epochal.sinks.lingering import Lingering

log = logging.getLogger("epochal")

__all__ = ["COMMIT_DRAIN_S", "DEFAULT_COMMIT_TIMEOUT_S", "DEFAULT_TRANSACTION_TIMEOUT_MS", "DEFAULT_WAL_BUDGET", "KAFKA_CALL_TIMEOUT_S",
           "MARKER_REFRESH_S", "RELEASE_DRAIN_S", "KafkaSink", "KafkaSinkWriter", "KafkaTransaction"]

#: the default ``transaction.timeout.ms``: Kafka brokers' default ``transaction.max.timeout.ms``
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
#: the default ``commit_timeout``, seconds
DEFAULT_COMMIT_TIMEOUT_S = 30.0
#: the default ``wal_budget``: bytes of not yet committed epochs a writer keeps in memory
DEFAULT_WAL_BUDGET = 64 * 1024 * 1024

_RESERVED = ("transactional.id", "enable.idempotence", "transaction.timeout.ms")


class KafkaSink(Sink):
    """Write records to a Kafka topic, exactly-once for ``read_committed`` readers under the
    exactly-once guarantee (see the module docstring), at-least-once otherwise.

    Args:
        bootstrap_servers: ``"host:port[,host:port]"`` (or a list).
        topic: the topic to write; it must exist.
        serializer: ``record -> bytes | None`` for the value; default
            :func:`~epochal.connectors.kafka.records.default_serializer` (bytes as they are,
            str as UTF-8, anything else as JSON; a ``KafkaRecord``'s own value).
        key: ``record -> bytes | str | int | None``: the message key, which also picks the
            partition (murmur2, as Java clients do). Default: none, or a ``KafkaRecord``'s
            own key and headers.
        config: more librdkafka producer settings (security, compression, ...). epochal sets
            ``transactional.id`` and ``enable.idempotence`` itself.
        producers: producers per subtask that stream epochs into their own transactions
            while earlier epochs await completion and commit (an epoch without a free one is
            produced at its commit instead, which delays it). 3 covers the open epoch, one
            awaiting completion and one committing.
        transaction_timeout: Kafka's ``transaction.timeout.ms`` (a duration): how long a
            transaction may stay open before the broker aborts it. It must cover an epoch
            plus its checkpoint (checked when the job starts); the broker must allow it
            (``transaction.max.timeout.ms``, 15 min by default).
        commit_timeout: how long (a duration) each Kafka call of an epoch's commit —
            ``send_offsets_to_transaction``, ``commit_transaction`` — may take. One that has
            not returned by then (plus a second) fails the writer and the job restarts; its
            next generation fences the producer and commits the epoch from the checkpoint.
            librdkafka does not always keep this timeout itself: after a broker restart its
            ``send_offsets_to_transaction`` can wait forever (confluentinc/librdkafka#5456,
            #5511), and the writer notices it here.
        transactional_id_prefix: default ``f"epochal-{job}-{sink}"``; two jobs writing one
            topic under one job and sink name need different prefixes.
        wal_budget: bytes (int, or ``"64MB"``) of keys and values of epochs not yet
            committed that a writer keeps in memory — and in its checkpoints — as the
            write-ahead log; records beyond it spill to a file under ``wal_dir`` (exactly-once).
            ``None``: no budget — the whole log stays in memory and in checkpoints, nothing
            spills (what a cluster without a shared ``wal_dir`` needs).
        wal_dir: where spill files go; default ``<tmp>/epochal-<random>/epochal-kafka-wal``
            (private: :mod:`~epochal.connectors.kafka.wal`). A task restarted
            on another host needs it to be a path every host shares: on a cluster it is one
            of the sink's :meth:`locations`, so a job whose ``wal_dir`` is not under
            ``ClusterConfig.shared_paths`` is refused at start, naming it.

    Raises:
        ConfigError: for an invalid argument, when the sink is built.
    """

    local_recovery = True  # each subtask recovers only its own output (failover regions)

    def __init__(self, bootstrap_servers, topic: str, *, serializer: Callable[[Any], Any] | None = None,
                 key: Callable[[Any], Any] | None = None, config: Mapping | None = None, producers: int = 3,
                 transaction_timeout: float | str = DEFAULT_TRANSACTION_TIMEOUT_MS / 1000,
                 commit_timeout: float | str = DEFAULT_COMMIT_TIMEOUT_S, transactional_id_prefix: str | None = None, wal_budget: int | str | None = DEFAULT_WAL_BUDGET,
                 wal_dir: str | None = None):
        what = "KafkaSink"
        self.servers = check_servers(bootstrap_servers, what)
        self.topic = check_topic(topic, what)
        for name, fn in (("serializer", serializer), ("key", key)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{what} {name}: expected a callable record -> bytes, got {fn!r}")
        if isinstance(producers, bool) or not isinstance(producers, int) or producers < 1:
            raise ConfigError(f"{what} producers: expected an integer >= 1, got {producers!r}")
        if transactional_id_prefix is not None:
            check_topic(transactional_id_prefix, f"{what} transactional_id_prefix")
        self.serializer, self.key = serializer, key
        self.producers = producers
        self.transaction_timeout = parse_duration(transaction_timeout, "KafkaSink transaction_timeout")
        self.commit_timeout = parse_duration(commit_timeout, "KafkaSink commit_timeout")
        if self.commit_timeout <= 0:
            raise ConfigError(f"{what} commit_timeout: expected a positive duration, got {commit_timeout!r}")
        self.transactional_id_prefix = transactional_id_prefix
        self.wal_budget = None if wal_budget is None else wal.parse_bytes(wal_budget, f"{what} wal_budget")
        if wal_dir is not None and (not isinstance(wal_dir, (str, os.PathLike)) or not str(wal_dir)):
            raise ConfigError(f"{what} wal_dir: expected a directory path, got {wal_dir!r}")
        self.wal_dir = str(wal_dir) if wal_dir is not None else wal.default_dir()
        self.config = client_config(self.servers, config, what, reserved=_RESERVED)

    def __repr__(self) -> str:
        return f"KafkaSink({self.servers!r}, {self.topic!r})"

    def create_writer(self, ctx: SinkContext) -> KafkaSinkWriter:
        return KafkaSinkWriter(self, ctx)

    def locations(self) -> tuple[str, ...]:
        """The spill directory of the write-ahead log, when records may spill (a finite
        ``wal_budget``): a replay after a restart on another host must find its files."""
        return () if self.wal_budget is None else ("file://" + os.path.abspath(self.wal_dir),)

    def claim(self, job: str, sink: str, resume: bool) -> None:
        """On the driver: the brokers answer and the topic exists (else ConfigError naming both)."""
        kafka()
        require_topics(self.config, [self.topic], f"sink {sink!r} ({self!r})")

    def check_run(self, sink: str, checkpoint, mode: SinkMode) -> None:
        """Refuse a ``transaction_timeout`` the broker would hit: an epoch's transaction stays
        open for up to one checkpoint interval plus its checkpoint (``checkpoint.timeout``).
        Warn (exactly-once) when ``producers`` is below ``checkpoint.max_concurrent + 2``:
        epochs would be produced at their commit instead of streaming."""
        need = (checkpoint.interval or 0.0) + checkpoint.timeout
        if self.transaction_timeout < need:
            raise ConfigError(
                f"sink {sink!r}: transaction_timeout={self.transaction_timeout:g} s is shorter than a checkpoint "
                f"interval plus its timeout ({checkpoint.interval} + {checkpoint.timeout:g} s): Kafka would abort "
                "the epoch's transaction before it can commit; raise transaction_timeout (the broker's "
                "transaction.max.timeout.ms must allow it) or lower checkpoint.interval / checkpoint.timeout")
        if mode is SinkMode.TRANSACTIONAL and self.producers < checkpoint.max_concurrent + 2:
            log.warning(
                "sink %r: producers=%d cannot stream every epoch with checkpoint.max_concurrent=%d (the open "
                "epoch, %d awaiting completion and one committing need %d): an epoch that finds no free producer is "
                "produced at its commit, which delays it; pass KafkaSink(..., producers=%d)", sink, self.producers,
                checkpoint.max_concurrent, checkpoint.max_concurrent, checkpoint.max_concurrent + 2,
                checkpoint.max_concurrent + 2)

    def lingering(self, job: str, sink: str, promised) -> list[Lingering]:
        """Producers that may hold open transactions (:func:`~epochal.connectors.kafka.probes.registered_producers`)."""
        return probes.registered_producers(self, job, sink, promised)

    def end_lingering(self, job: str, sink: str, items: list, promised) -> None:
        """Fence every item (:func:`~epochal.connectors.kafka.probes.fence`)."""
        probes.fence(self, items)

    def prefix(self, ctx: SinkContext) -> str:
        return self.transactional_id_prefix or f"epochal-{ctx.job}-{ctx.sink_name}"
