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
"""
from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epochal.alignment.factory import SinkMode
from epochal.config import parse_duration
from epochal.connectors.kafka import committer, probes, recovery, wal
from epochal.connectors.kafka.client import (
    check_servers,
    check_topic,
    client_config,
    describe_error,
    kafka,
    require_topics,
)
from epochal.connectors.kafka.records import KafkaRecord, default_serializer, to_key
from epochal.errors import ConfigError
from epochal.sinks.base import Sink, SinkCommitError, SinkContext, SinkWriteError, TwoPhaseCommitSink
from epochal.sinks.lingering import Lingering

log = logging.getLogger("epochal")

#: seconds a Kafka call of the sink may take (transactions, markers, flushes)
KAFKA_CALL_TIMEOUT_S = 60.0
#: the default ``transaction.timeout.ms``: Kafka brokers' default ``transaction.max.timeout.ms``
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
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
        transactional_id_prefix: default ``f"epochal-{job}-{sink}"``; two jobs writing one
            topic under one job and sink name need different prefixes.
        wal_budget: bytes (int, or ``"64MB"``) of keys and values of epochs not yet
            committed that a writer keeps in memory — and in its checkpoints — as the
            write-ahead log; records beyond it spill to a file under ``wal_dir`` (exactly-once).
            ``None``: no budget — the whole log stays in memory and in checkpoints, nothing
            spills (what a cluster without a shared ``wal_dir`` needs).
        wal_dir: where spill files go; default ``<tmp>/epochal-kafka-wal``. A task restarted
            on another host needs it to be a path every host shares: on a cluster it is one
            of the sink's :meth:`locations`, so a job whose ``wal_dir`` is not under
            ``ClusterConfig.shared_paths`` is refused at start, naming it.

    Raises:
        ConfigError: for an invalid argument, when the sink is built.
    """

    def __init__(self, bootstrap_servers, topic: str, *, serializer: Callable[[Any], Any] | None = None,
                 key: Callable[[Any], Any] | None = None, config: Mapping | None = None, producers: int = 3,
                 transaction_timeout: float | str = DEFAULT_TRANSACTION_TIMEOUT_MS / 1000,
                 transactional_id_prefix: str | None = None, wal_budget: int | str | None = DEFAULT_WAL_BUDGET,
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
        self.transactional_id_prefix = transactional_id_prefix
        self.wal_budget = None if wal_budget is None else wal.parse_bytes(wal_budget, f"{what} wal_budget")
        if wal_dir is not None and (not isinstance(wal_dir, (str, os.PathLike)) or not str(wal_dir)):
            raise ConfigError(f"{what} wal_dir: expected a directory path, got {wal_dir!r}")
        self.wal_dir = str(wal_dir) if wal_dir is not None else os.path.join(tempfile.gettempdir(),
                                                                              "epochal-kafka-wal")
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
        open for up to one checkpoint interval plus its checkpoint (``checkpoint.timeout``)."""
        need = (checkpoint.interval or 0.0) + checkpoint.timeout
        if self.transaction_timeout < need:
            raise ConfigError(
                f"sink {sink!r}: transaction_timeout={self.transaction_timeout:g} s is shorter than a checkpoint "
                f"interval plus its timeout ({checkpoint.interval} + {checkpoint.timeout:g} s): Kafka would abort "
                "the epoch's transaction before it can commit; raise transaction_timeout (the broker's "
                "transaction.max.timeout.ms must allow it) or lower checkpoint.interval / checkpoint.timeout")

    def lingering(self, job: str, sink: str, promised) -> list[Lingering]:
        """Producers that may hold open transactions (:func:`~epochal.connectors.kafka.probes.registered_producers`)."""
        return probes.registered_producers(self, job, sink, promised)

    def end_lingering(self, job: str, sink: str, items: list, promised) -> None:
        """Fence every item (:func:`~epochal.connectors.kafka.probes.fence`)."""
        probes.fence(self, items)

    def prefix(self, ctx: SinkContext) -> str:
        return self.transactional_id_prefix or f"epochal-{ctx.job}-{ctx.sink_name}"


@dataclass
class KafkaTransaction:
    """Picklable handle of one epoch: its records (the write-ahead log) and who wrote it.

    ``wal`` holds ``(key, value, headers, timestamp_ms)`` as produced
    (:class:`~epochal.connectors.kafka.wal.WalSegment`); None in at-least-once mode, where
    nothing is replayed from a handle. ``records`` is where handles pickled before the
    segment kept them. ``subtask`` names the marker group the epoch commits to — the
    writing subtask's, kept through a rescale.
    """

    epoch: int
    subtask: int
    generation: int
    records: list = field(default_factory=list)
    slot: int | None = None  # the streaming producer, None: produced at commit (or not begun)
    count: int = 0
    lineage: str = ""  # the run that wrote it (epochal.epochs.lineage); "" before lineages
    wal: wal.WalSegment | None = None
    carried: tuple = ()  # handles of earlier epochs whose commit was in flight at this one's seal

    def rows(self):
        """Every record of the epoch, in the order produced (memory, then the spill file)."""
        segment = getattr(self, "wal", None)
        return iter(segment) if segment is not None else iter(self.records)

    @property
    def first_ts(self) -> int | None:
        segment = getattr(self, "wal", None)
        if segment is not None:
            return segment.first_ts
        return min((r[3] for r in self.records), default=None)

    @property
    def group(self) -> tuple[str, int]:
        """The marker group this epoch commits to: ``(lineage, subtask)`` of its writer."""
        return (getattr(self, "lineage", ""), self.subtask)  # handles pickled before lineages have none


class KafkaSinkWriter(TwoPhaseCommitSink):
    """The per-task writer of a :class:`KafkaSink` (the two-phase-commit hooks only)."""

    #: records are visible once delivered; at-least-once needs no early publishing
    direct_publish_interval = float("inf")

    def __init__(self, sink: KafkaSink, ctx: SinkContext):
        super().__init__(ctx)
        self._ck = kafka()
        self._sink = sink
        self._topic = sink.topic
        self._serialize = sink.serializer or default_serializer
        self._key = sink.key
        self._transactional = ctx.mode is SinkMode.TRANSACTIONAL
        self._prefix = sink.prefix(ctx)
        self._base = dict(sink.config)
        self._base.setdefault("partitioner", "murmur2_random")  # keys land where Java clients put them
        self._base.setdefault("linger.ms", 5)
        self._started = False
        self._slots: list = [None] * sink.producers  # streaming producers, created on first use
        self._live: dict[int, int] = {}  # slot -> epoch of its open or sealed transaction (this writer)
        self._replay = None  # the replay slot's producer
        self._plain = None  # at-least-once producer
        self._lineage = ctx.lineage_id
        self._parent = ctx.lineage.parent if ctx.lineage is not None else None
        self._own = (self._lineage, ctx.subtask)  # this writer's marker group
        # marker groups are (lineage, subtask) pairs (recovery.marker_group)
        self._groups: dict[tuple, Any] = {}  # group -> Consumer of it
        self._markers: dict[tuple, int] = {}  # settled group -> highest epoch known committed
        self._own_meta = recovery.MarkerMeta(ctx.generation, ctx.parallelism, sink.producers, self._lineage,
                                             ctx.subtask)
        self._last_marker = time.monotonic()
        self._failed: str | None = None  # first delivery error (at-least-once)
        self._fenced: set[str] = set()  # transactional ids this writer fenced
        self._sealed = 0  # the highest epoch pre_commit sealed
        self._missing: set[tuple] = set()  # settled groups Kafka held no marker for
        self._budget = wal.Budget(sink.wal_budget)  # the write-ahead log this writer holds in memory
        self._committer = committer.Committer(f"kafka-commit-{ctx.sink_name}-{ctx.subtask}")

    # ------------------------------------------------------------------ hooks

    def begin_transaction(self, epoch: int) -> KafkaTransaction:
        self._start()
        return KafkaTransaction(epoch, self.ctx.subtask, self.ctx.generation, lineage=self._lineage,
                                wal=wal.WalSegment() if self._transactional else None)

    def write_to(self, txn: KafkaTransaction, record: Any) -> None:
        self.write_many_to(txn, [record])

    def write_many_to(self, txn: KafkaTransaction, records: list) -> None:
        """Serialize the batch, produce it (one C call per record, nothing else per record
        on the fast path), then append the produced rows to the write-ahead log at once."""
        if not records:
            return
        self._raise_if_commit_failed()
        producer = self._producer_for(txn)
        serialize, key_fn, topic = self._serialize, self._key, self._topic
        now = int(time.time() * 1000)
        rows = []
        nbytes = 0
        for record in records:
            try:
                value = serialize(record)
                if value is not None:
                    if type(value) is not bytes:
                        raise TypeError(f"the serializer returned {type(value).__name__}, not bytes")
                    nbytes += len(value)
                if key_fn is not None:
                    key, headers = to_key(key_fn(record)), None
                elif type(record) is KafkaRecord:
                    key, headers = record.key, record.headers
                else:
                    key = headers = None
            except Exception as exc:
                raise SinkWriteError(self.ctx.sink_name, record, f"{type(exc).__name__}: {exc}") from exc
            if key is not None:
                nbytes += len(key)
            rows.append((key, value, headers, now))
        segment = txn.wal
        if segment is not None and not txn.count:  # the epoch's first record names it (recovery.epoch_tag)
            key, value, headers, ts = rows[0]
            headers = list(headers or ()) + [(recovery.TAG_HEADER, recovery.epoch_tag(txn.group, txn.epoch))]
            rows[0] = (key, value, headers, ts)
        if producer is not None:
            produce = producer.produce
            for i, (key, value, headers, ts) in enumerate(rows):
                try:
                    produce(topic, value, key, headers=headers, timestamp=ts)
                except (BufferError, self._ck.KafkaException):
                    self._produce(producer, topic, key, value, headers, ts, records[i])
        if segment is not None:
            segment.append_many(rows, nbytes, self._budget, functools.partial(self._spill_path, txn))
        txn.count += len(rows)

    def _spill_path(self, txn: KafkaTransaction) -> str:
        return os.path.join(self._sink.wal_dir, self._prefix,
                            f"{txn.lineage or 'legacy'}-{txn.subtask}-g{txn.generation}-e{txn.epoch}.wal")

    def pre_commit(self, txn: KafkaTransaction):
        """Seal: nothing to detach (the next epoch gets another producer or none); remember
        the highest sealed epoch (:meth:`release_clients` leaves those transactions); attach
        the commits in flight (``carried``: the checkpoint of this epoch must still promise
        them). The durability step (uploader thread) fsyncs the epoch's spill file, if it
        has one, and flushes the epoch's producer: the records are durable in the
        checkpoint anyway (the handle), flushing here only keeps the commit short.
        At-least-once: the flush is what makes the barrier safe."""
        self._sealed = max(self._sealed, txn.epoch)
        if self._transactional:
            self._raise_if_commit_failed()
            txn.carried = self._committer.in_flight()
        if not txn.count:
            return None
        segment = txn.wal
        if segment is not None:
            segment.seal()
        producer = self._plain if not self._transactional else (
            self._slots[txn.slot] if txn.slot is not None else None)
        if producer is None and (segment is None or segment.path is None):
            return None
        return functools.partial(self._flush, producer, txn)

    def commit(self, txn: KafkaTransaction) -> None:
        """At-least-once: raise if a record was not delivered. Exactly-once: hand the commit
        to the commit thread (:meth:`_commit_now` runs there, in submission order) and
        return; a restored handle's carried epochs go first."""
        if not self._transactional:
            if self._failed:
                raise SinkCommitError(f"{self._where()}: a record of epoch {txn.epoch} was not delivered to "
                                      f"topic {self._topic!r}: {self._failed}")
            return
        self._start()
        self._raise_if_commit_failed()
        if txn.generation != self.ctx.generation or txn.group != self._own:
            self._submit_carried(txn)  # own carried epochs were submitted before
        self._committer.submit(txn, functools.partial(self._commit_now, txn))

    def _submit_carried(self, txn: KafkaTransaction) -> None:
        for earlier in getattr(txn, "carried", ()):  # handles pickled before the commit thread have none
            self._submit_carried(earlier)
            self._committer.submit(earlier, functools.partial(self._commit_now, earlier))

    def _commit_now(self, txn: KafkaTransaction) -> None:
        """The commit of ``txn`` (commit thread; idempotent):

        1. An epoch this writer streamed itself: commit its transaction with the marker.
        2. Otherwise (restored, rescaled, carried, or produced-at-commit): ask Kafka for the
           marker of the epoch's subtask; skip the epoch if Kafka holds it (idempotence),
           else produce its records from the handle in a fresh transaction of the replay
           slot, with the marker, and commit.
        3. An empty epoch commits nothing, but refreshes the marker now and then, so the
           broker never expires the group (``offsets.retention.minutes``).

        Then the epoch's write-ahead log and carried handles are dropped: Kafka holds it.
        """
        # Step 1
        slot = txn.slot
        if (txn.generation == self.ctx.generation and txn.group == self._own and slot is not None
                and self._live.get(slot) == txn.epoch):
            producer = self._slots[slot]
            self._kafka_call(f"commit epoch {txn.epoch}", self._commit_with_marker, producer, txn.epoch)
            del self._live[slot]
        # Step 2
        elif txn.count:
            self._replay_epoch(txn)
        # Step 3
        elif time.monotonic() - self._last_marker > MARKER_REFRESH_S:
            self._kafka_call("refresh the marker", self._marker_only, self._markers.get(self._own, 0))
        self._release_wal(txn)
        txn.carried = ()

    def wait_for_commits(self, timeout: float | None = None) -> None:
        """Return once every commit handed over so far is in Kafka (exactly-once); raise
        SinkCommitError if one failed or ``timeout`` s (default ``COMMIT_DRAIN_S``) passed.
        Called at a clean end and after a restore; callers driving a writer by hand call
        it after ``notify_epoch_complete`` to see the epoch in Kafka."""
        if not self._transactional:
            return
        timeout = COMMIT_DRAIN_S if timeout is None else timeout
        done = self._committer.drain(timeout)
        self._raise_if_commit_failed()
        if not done:
            raise SinkCommitError(f"{self._where()}: commits of epochs {[h.epoch for h in self._committer.in_flight()]} "
                                  f"did not finish within {timeout:.0f} s")

    def _raise_if_commit_failed(self) -> None:
        """Task thread: a commit failed on the commit thread — fail the writer here."""
        try:
            self._committer.raise_if_failed()
        except SinkCommitError:
            raise
        except Exception as exc:
            raise SinkCommitError(f"{self._where()}: a commit failed: {type(exc).__name__}: {exc}") from exc

    def _release_wal(self, txn: KafkaTransaction) -> None:
        """Kafka holds the epoch (or it was discarded): drop its write-ahead log — the memory
        it counted against this writer's budget, its spill file."""
        segment = getattr(txn, "wal", None)
        if segment is not None:
            mine = txn.generation == self.ctx.generation and txn.group == self._own
            segment.release(self._budget if mine else None)

    def abort(self, txn: KafkaTransaction) -> None:
        """At a clean end: wait for the commits in flight (the job's output is complete only
        then), then abort the open epoch's transaction."""
        self.wait_for_commits()
        slot = txn.slot
        if self._transactional and slot is not None and self._live.get(slot) == txn.epoch:
            self._kafka_call(f"abort epoch {txn.epoch}", self._slots[slot].abort_transaction, KAFKA_CALL_TIMEOUT_S)
            del self._live[slot]
            self._slots[slot] = None  # an aborted id is never written again (recovery module docstring)
        self._release_wal(txn)

    def release_clients(self) -> None:
        """Abort the transaction of the epoch still open (sealed ones stay: a completed
        checkpoint may promise them, and the next generation fences or commits them), close
        the marker consumers and drop every producer. The commit thread runs no further
        commit after a short wait (a checkpoint still promises those left in flight)."""
        self._committer.drain(RELEASE_DRAIN_S)
        self._committer.stop(RELEASE_DRAIN_S)
        for slot, epoch in list(self._live.items()):
            producer = self._slots[slot]
            if epoch > self._sealed and producer is not None:
                try:
                    producer.abort_transaction(5.0)
                except Exception:  # a fenced or broken producer: the next generation fences it
                    pass
        for consumer in self._groups.values():
            try:
                consumer.close()
            except Exception:
                pass
        self._groups.clear()
        self._live.clear()
        self._slots = [None] * len(self._slots)
        self._replay = self._plain = None

    def cleanup_orphans(self, restored_epoch: int) -> None:
        """:meth:`_start` fenced every earlier producer, which aborted their open
        transactions; delete this subtask's spill files of this lineage's earlier
        generations for epochs after ``restored_epoch`` (no checkpoint holds them)."""
        self._start()
        if self._transactional:
            self.wait_for_commits()  # a restored writer starts once Kafka holds every restored epoch
            wal.remove_orphans(os.path.join(self._sink.wal_dir, self._prefix), self._lineage or "legacy",
                               self.ctx.subtask, self.ctx.generation, restored_epoch)

    # ------------------------------------------------------------------ start: fence, register

    def _start(self) -> None:
        """Once, on the first hook (inside ``restore``): fence every producer an earlier
        generation of this run — or the run it restored — may hold, then register this
        generation in its marker (exactly-once); or create the producer (at-least-once).

        1. For this run's lineage and the lineage it restored (its parent), settle the
           marker groups of this subtask and of the subtasks it absorbs after a rescale
           (:meth:`_settle`: read, fence who registered there, read again). Fencing comes
           before any answer is trusted, so no zombie can move a marker after it was read,
           and no open transaction of a killed producer holds readers at the last stable
           offset until ``transaction.timeout.ms``.
        2. Register: commit this generation's metadata into its own group.
        """
        if self._started:
            return
        self._started = True
        if not self._transactional:
            conf = dict(self._base, **{"enable.idempotence": True, "delivery.report.only.error": True,
                                       "on_delivery": self._on_delivery})
            self._plain = self._ck.Producer(conf)
            return
        # Step 1
        for lineage in dict.fromkeys(x for x in (self._lineage, self._parent) if x is not None):
            self._settle_subtask_and_absorbed(lineage)
        self._say_if_rolled_back()
        # Step 2
        self._replay = self._new_producer(recovery.REPLAY_SLOT)
        self._kafka_call("register the generation", self._marker_only, self._markers.get(self._own, 0))

    def _say_if_rolled_back(self) -> None:
        """Log it when this run restored an epoch older than what the restored lineage
        committed to the topic: the epochs after it are produced again (a rollback)."""
        lineage = self.ctx.lineage
        if lineage is None or self._parent is None or self._parent == self._lineage:
            return
        ahead = self._markers.get((self._parent, self.ctx.subtask), 0)
        if lineage.forked_at is not None and ahead > lineage.forked_at:
            log.warning("%s: restored epoch %d of lineage %s, which committed epochs up to %d to topic %r: this run "
                        "(lineage %s) produces the epochs after %d again (a rollback to an older savepoint or "
                        "checkpoint)", self._where(), lineage.forked_at, self._parent or "(legacy)", ahead,
                        self._topic, self._lineage, lineage.forked_at)

    def _settle_subtask_and_absorbed(self, lineage: str) -> None:
        """Settle ``lineage``'s groups of this subtask and of every subtask it absorbs: those
        of a larger parallelism ``j ≡ subtask (mod parallelism)``, as far as groups exist."""
        own, p = self.ctx.subtask, self.ctx.parallelism
        marker = self._settle((lineage, own))
        meta = marker.meta if marker else None
        candidates = recovery.absorbed_subtasks(own, p, meta.parallelism if meta else p)
        for j in candidates:
            self._settle((lineage, j))
        j = max(candidates, default=own) + p  # subtasks of an even larger earlier parallelism
        while self._settle((lineage, j)) is not None:
            j += p

    def _settle(self, group: tuple[str, int]) -> recovery.Marker | None:
        """Read ``group``'s marker, fence the writer registered there, then read it again and
        keep that answer: after the fence no transaction of that writer can still commit, so
        the marker is final for recovery. Idempotent per group."""
        marker = self._read_marker(group)
        fenced = recovery.fence_ids(self._prefix, {group: marker}, self._lineage, self.ctx.generation)
        for txid in fenced:
            if txid not in self._fenced:
                self._kafka_call(f"fence transactional id {txid!r}", self._fence, txid)
                self._fenced.add(txid)
        if fenced:
            log.info("%s: fenced %d transactional id(s) of %s", self._where(), len(fenced),
                     "an earlier generation" if group[0] == self._lineage else f"lineage {group[0] or '(legacy)'}")
            marker = self._read_marker(group)
        self._markers[group] = marker.epoch if marker else 0
        if marker is None:
            self._missing.add(group)
        return marker

    def _fence(self, txid: str) -> None:
        producer = self._ck.Producer(dict(self._base, **{"transactional.id": txid,
                                                         "transaction.timeout.ms": self._timeout_ms()}))
        producer.init_transactions(KAFKA_CALL_TIMEOUT_S)
        producer.flush(0)

    def _new_producer(self, slot):
        txid = recovery.transactional_id(self._prefix, self.ctx.subtask, self.ctx.generation, slot, self._lineage)
        producer = self._ck.Producer(dict(self._base, **{"transactional.id": txid,
                                                         "transaction.timeout.ms": self._timeout_ms()}))
        self._kafka_call(f"initialise producer {txid!r}", producer.init_transactions, KAFKA_CALL_TIMEOUT_S)
        return producer

    def _timeout_ms(self) -> int:
        return int(self._sink.transaction_timeout * 1000)

    # ------------------------------------------------------------------ markers

    def _group(self, group: tuple[str, int]):
        """A consumer of marker group ``group`` = ``(lineage, subtask)``. It reads committed
        offsets without waiting for open transactions (``read_uncommitted``): an answer read
        before the fence is only used to find whom to fence (:meth:`_settle`)."""
        consumer = self._groups.get(group)
        if consumer is None:
            conf = {k: v for k, v in self._base.items() if k.startswith(("security.", "sasl.", "ssl.", "client."))}
            conf.update({"bootstrap.servers": self._sink.servers, "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted",
                         "group.id": recovery.marker_group(self._prefix, group[1], group[0])})
            consumer = self._groups[group] = self._ck.Consumer(conf)
        return consumer

    def _read_marker(self, group: tuple[str, int]) -> recovery.Marker | None:
        """Kafka's marker of ``group``: the highest epoch committed there and who registered
        last, or None if the group holds none."""
        tp = self._ck.TopicPartition(self._topic, 0)
        lineage, subtask = group
        found = self._kafka_call(f"read the marker of subtask {subtask} (lineage {lineage or '(legacy)'})",
                                 self._group(group).committed, [tp], timeout=KAFKA_CALL_TIMEOUT_S)[0]
        if found.offset < 0:
            return None
        return recovery.Marker(found.offset, recovery.MarkerMeta.decode(found.metadata, subtask))

    def _marker_offsets(self, epoch: int) -> list:
        """The marker of ``epoch``: this writer's metadata (whoever fences next must fence it)."""
        return [self._ck.TopicPartition(self._topic, 0, epoch, metadata=self._own_meta.encode())]

    def _commit_with_marker(self, producer, epoch: int, group: tuple[str, int] | None = None) -> None:
        group = self._own if group is None else group
        producer.send_offsets_to_transaction(self._marker_offsets(epoch),
                                             self._group(group).consumer_group_metadata(), KAFKA_CALL_TIMEOUT_S)
        producer.commit_transaction(KAFKA_CALL_TIMEOUT_S)
        self._markers[group] = epoch
        self._last_marker = time.monotonic()

    def _marker_only(self, epoch: int) -> None:
        self._replay.begin_transaction()
        self._commit_with_marker(self._replay, epoch)

    def _replay_epoch(self, txn: KafkaTransaction) -> None:
        """Step 2 of :meth:`commit`: produce ``txn`` from its handle unless Kafka holds it —
        as the marker of the lineage and subtask that wrote it says, once settled."""
        g = txn.group
        if g not in self._markers:
            self._settle(g)
        todo = recovery.epochs_to_produce([(txn.epoch, g)], self._markers)
        if not todo:
            return
        if g in self._missing and self._epoch_in_topic(txn):
            log.warning("%s: the marker group of lineage %s subtask %d is gone (expired while the job was down? "
                        "offsets.retention.minutes), but epoch %d is in topic %r already: not produced again",
                        self._where(), g[0] or "(legacy)", g[1], txn.epoch, self._topic)
            return
        producer = self._replay

        def produce_and_commit():
            producer.begin_transaction()
            try:
                for key, value, headers, ts in txn.rows():
                    self._produce(producer, self._topic, key, value, headers, ts, None)
            except wal.WalMissingError as exc:
                raise SinkCommitError(f"{self._where()}: cannot produce epoch {txn.epoch} of subtask {g[1]} "
                                      f"again: {exc}") from exc
            self._commit_with_marker(producer, txn.epoch, g)

        self._kafka_call(f"produce epoch {txn.epoch} of subtask {g[1]} from the checkpoint", produce_and_commit)
        log.info("%s: produced epoch %d (%d records) from the checkpoint", self._where(), txn.epoch, txn.count)

    def _epoch_in_topic(self, txn: KafkaTransaction) -> bool:
        """Whether ``txn`` committed, asked of the topic itself (its tagged first record,
        :func:`~epochal.connectors.kafka.probes.epoch_in_topic`): only when the marker
        group that would say so is gone."""
        first_ts = txn.first_ts
        if first_ts is None:
            return False
        return probes.epoch_in_topic(self._sink, self._prefix, recovery.epoch_tag(txn.group, txn.epoch),
                                        first_ts, f"{self._where()}: epoch {txn.epoch}")

    # ------------------------------------------------------------------ producing

    def _producer_for(self, txn: KafkaTransaction):
        """The producer ``txn``'s records stream into, beginning its transaction on the first
        call; None when no streaming producer is free (the epoch is produced at commit)."""
        if not self._transactional:
            return self._plain
        if txn.slot is not None:
            return self._slots[txn.slot]
        if txn.count:  # a produced-at-commit epoch stays so
            return None
        for slot, producer in enumerate(self._slots):
            if slot in self._live:
                continue
            if producer is None:
                producer = self._slots[slot] = self._new_producer(slot)
            self._kafka_call(f"begin epoch {txn.epoch}", producer.begin_transaction)
            self._live[slot] = txn.epoch
            txn.slot = slot
            return producer
        return None

    def _produce(self, producer, topic, key, value, headers, ts, record) -> None:
        while True:
            try:
                producer.produce(topic, value, key, headers=headers, timestamp=ts)
                return
            except BufferError:
                producer.poll(0.05)  # the local queue is full: let librdkafka send
            except self._ck.KafkaException as exc:
                text = describe_error(exc)
                if record is not None and ("MSG_SIZE_TOO_LARGE" in text or "INVALID_ARG" in text):
                    raise SinkWriteError(self.ctx.sink_name, record, text) from exc
                raise SinkCommitError(f"{self._where()}: producing to topic {topic!r} failed: {text}") from exc

    def _flush(self, producer, txn: KafkaTransaction) -> None:
        """The durability step (uploader thread): the epoch's spill file is on disk, and
        every record of ``txn`` reached the broker."""
        if txn.wal is not None:
            txn.wal.sync()
        if producer is None:
            return
        left = producer.flush(KAFKA_CALL_TIMEOUT_S)
        if left:
            raise SinkCommitError(f"{self._where()}: {left} record(s) of epoch {txn.epoch} not delivered to topic "
                                  f"{self._topic!r} within {KAFKA_CALL_TIMEOUT_S:.0f} s")
        if self._failed:
            raise SinkCommitError(f"{self._where()}: a record of epoch {txn.epoch} was not delivered to topic "
                                  f"{self._topic!r}: {self._failed}")

    def _on_delivery(self, err, msg) -> None:
        if err is not None and self._failed is None:
            self._failed = f"{err.name()}: {err.str()}"

    def _kafka_call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._ck.KafkaException as exc:
            raise SinkCommitError(f"{self._where()}: cannot {what} on {self._sink.servers}: "
                                  f"{describe_error(exc)}") from exc


#: seconds a clean end waits for the commits in flight
COMMIT_DRAIN_S = 120.0
#: seconds releasing the clients waits for the commits in flight (then leaves them to the next generation)
RELEASE_DRAIN_S = 10.0
#: seconds between marker refreshes of a subtask that commits nothing (Kafka expires the
#: offsets of an empty group after ``offsets.retention.minutes``, 7 days by default)
MARKER_REFRESH_S = 3600.0
