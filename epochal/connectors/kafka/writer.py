"""The per-task writer of a :class:`~epochal.connectors.kafka.sink.KafkaSink`: its
two-phase-commit hooks (see the table in :mod:`~epochal.connectors.kafka.sink`), the
transaction slots epochs stream into, producing, and the hand-over of commits to the
commit thread (:mod:`~epochal.connectors.kafka.committer`). Fencing, markers and replays
are in :mod:`~epochal.connectors.kafka.generations`.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from epochal.alignment.factory import SinkMode
from epochal.connectors.kafka import committer, recovery, trace, wal
from epochal.connectors.kafka.client import describe_error, kafka
from epochal.connectors.kafka.generations import KAFKA_CALL_TIMEOUT_S, Generations
from epochal.connectors.kafka.handle import KafkaTransaction
from epochal.connectors.kafka.records import KafkaRecord, default_serializer, to_key
from epochal.sinks.base import SinkCommitError, SinkContext, SinkWriteError, TwoPhaseCommitSink

log = logging.getLogger("epochal")

#: seconds a clean end waits for the commits in flight
COMMIT_DRAIN_S = 120.0
#: seconds releasing the clients waits for the commits in flight (then leaves them to the next generation)
RELEASE_DRAIN_S = 10.0
#: ``linger.ms`` of the exactly-once sink's producers unless ``config`` sets it. Records are
#: invisible until their epoch commits, so nothing gains from sending them before the seal:
#: the durability step's ``flush()`` (and ``commit_transaction``, which flushes) sends what
#: lingers at once, so an epoch goes as one request per partition (or per full batch). With
#: librdkafka's 5 ms the producers sent a request per partition every 5 ms, filled the
#: idempotent producer's window of 5 requests in flight whenever the broker answered slower
#: than 25 ms, and its broker thread then spun (a wake-up due while the window is full): each
#: task took up to 0.7 of a core and, on 2 cores, the p50 of 10 ms epochs at 10k records/s
#: swung from 0.2 to 4.8 s between runs; with 1 s it was 42–116 ms in 7 runs
#: (``benchmarks/results/kafka-eo-10k-variance.json``). Below ``message.timeout.ms``, as
#: librdkafka requires.
TRANSACTIONAL_LINGER_MS = 1000
#: ``linger.ms`` of the at-least-once sink's producer: its records are visible once delivered
PLAIN_LINGER_MS = 5
#: seconds between marker refreshes of a subtask that commits nothing (Kafka expires the
#: offsets of an empty group after ``offsets.retention.minutes``, 7 days by default)
MARKER_REFRESH_S = 3600.0


class KafkaSinkWriter(Generations, TwoPhaseCommitSink):
    """The per-task writer of a :class:`KafkaSink` (the two-phase-commit hooks only)."""

    #: records are visible once delivered; at-least-once needs no early publishing
    direct_publish_interval = float("inf")

    def __init__(self, sink: Any, ctx: SinkContext):  # a KafkaSink (its module imports this one)
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
        self._base.setdefault("linger.ms", TRANSACTIONAL_LINGER_MS if self._transactional else PLAIN_LINGER_MS)
        self._started = False
        self._slots: list = [None] * sink.producers  # streaming producers, opened by _start (again on use after an abort)
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
        self._oldest: dict[int, int] = {}  # epoch -> oldest Kafka timestamp written (tracing only)
        self._committer = committer.Committer(f"kafka-commit-{ctx.sink_name}-{ctx.subtask}",
                                              join=self._commit_together, call_limit=sink.commit_timeout)

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
        # a KafkaRecord with a bytes value, written as it is: no call per record
        copies = serialize is default_serializer and key_fn is None
        for record in records:
            if copies and type(record) is KafkaRecord:
                key, value, headers = record[4], record[5], record[6]
                if type(value) is bytes:
                    nbytes += len(value) if key is None else len(value) + len(key)
                    rows.append((key, value, headers, now))
                    continue
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
        if trace.ON:
            self._trace_write(txn, records)
        txn.count += len(rows)

    def _trace_write(self, txn: KafkaTransaction, records: list) -> None:
        stamps = [r.timestamp for r in records if type(r) is KafkaRecord]
        oldest = min(stamps, default=None)
        if oldest is not None and (txn.epoch not in self._oldest or oldest < self._oldest[txn.epoch]):
            self._oldest[txn.epoch] = oldest
        if not txn.count:
            trace.event("write", epoch=txn.epoch, subtask=self.ctx.subtask, n=len(records), min_ts=oldest)

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
        if trace.ON:
            trace.event("seal", epoch=txn.epoch, subtask=self.ctx.subtask, count=txn.count,
                        min_ts=self._oldest.pop(txn.epoch, None))
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
        if trace.ON:
            trace.event("complete", epoch=txn.epoch, subtask=self.ctx.subtask)
        mine = txn.generation == self.ctx.generation and txn.group == self._own
        if not mine:
            self._submit_carried(txn)  # own carried epochs were submitted before
        # an epoch of this writer produced at its commit may join the ones queued with it
        self._committer.submit(txn, functools.partial(self._commit_now, txn), joinable=mine and txn.slot is None)

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
        if trace.ON:
            trace.event("commit_sent", epoch=txn.epoch, subtask=self.ctx.subtask, count=txn.count,
                        streamed=txn.slot is not None)
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
        if trace.ON:
            trace.event("commit_ack", epoch=txn.epoch, subtask=self.ctx.subtask)

    def _commit_together(self, txns: list[KafkaTransaction]) -> None:
        """The commit of consecutive epochs of this writer that are produced at their
        commit (commit thread, when it fell behind: :mod:`~epochal.connectors.kafka.committer`):
        their records from their handles, in epoch order, in one transaction of the replay
        slot with the marker of the last — atomic like one epoch's, so the marker still
        says exactly which epochs Kafka holds. Idempotent: epochs at or below the marker
        are not produced again."""
        if trace.ON:
            for txn in txns:
                trace.event("commit_sent", epoch=txn.epoch, subtask=self.ctx.subtask, count=txn.count,
                            streamed=False, joined=len(txns))
        todo = [t for t in txns if t.count and t.epoch > self._markers.get(self._own, 0)]
        if todo:
            producer, last = self._replay, txns[-1].epoch

            def produce_and_commit():
                producer.begin_transaction()
                try:
                    for txn in todo:
                        for key, value, headers, ts in txn.rows():
                            self._produce(producer, self._topic, key, value, headers, ts, None)
                except wal.WalMissingError as exc:
                    raise SinkCommitError(f"{self._where()}: cannot produce epochs {todo[0].epoch}-{last}: {exc}") from exc
                self._commit_with_marker(producer, last)

            self._kafka_call(f"commit epochs {txns[0].epoch}-{last}", produce_and_commit)
        for txn in txns:
            self._release_wal(txn)
            txn.carried = ()
            if trace.ON:
                trace.event("commit_ack", epoch=txn.epoch, subtask=self.ctx.subtask)

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
        except committer.CommitWedged as exc:
            epochs = [h.epoch for h in self._committer.in_flight()]
            log.warning("%s: the commit of epochs %s is wedged: %s; failing the writer (the job restarts; its next "
                        "generation fences this producer and commits the epochs from the checkpoint)",
                        self._where(), epochs, exc)
            raise SinkCommitError(f"{self._where()}: the commit of epochs {epochs} is wedged: {exc} (commit_timeout="
                                  f"{self._sink.commit_timeout:g} s)") from exc
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
        if trace.ON:
            trace.event("flushed", epoch=txn.epoch, subtask=self.ctx.subtask)

    def _on_delivery(self, err, msg) -> None:
        if err is not None and self._failed is None:
            self._failed = f"{err.name()}: {err.str()}"
