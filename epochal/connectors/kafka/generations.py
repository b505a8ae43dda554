"""How a Kafka sink writer deals with the generations before it (seed 004, Table 4.1,
Kafka row): fence them, register its own, read and commit the markers that say which
epochs Kafka holds, and produce again from a handle an epoch it does not hold.

:class:`Generations` is the part of :class:`~epochal.connectors.kafka.writer.KafkaSinkWriter`
that talks to Kafka about markers and transactional ids; the writer's hooks call it (once,
on the first hook: :meth:`Generations._start`; on the commit thread: the marker commits and
replays). The pure decisions (which ids to fence, which epochs to produce) are in
:mod:`~epochal.connectors.kafka.recovery`.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from epochal.connectors.kafka import probes, recovery, trace, wal
from epochal.connectors.kafka.client import describe_error
from epochal.connectors.kafka.handle import KafkaTransaction
from epochal.sinks.base import SinkCommitError

log = logging.getLogger("epochal")

#: seconds a Kafka call of the sink may take (transactions, markers, flushes)
KAFKA_CALL_TIMEOUT_S = 60.0

#: seconds a stable marker read (one an open transaction holds back) may wait before
#: :meth:`Generations._settle` reads the group again to find whom else to fence
STABLE_READ_S = 5.0

#: a marker read's answers that mean "ask again": the group's coordinator is being created
#: (a cluster's first consumer group), loaded or moved (a broker restarted)
_COORDINATOR_BUSY = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"})


class _HeldBack(Exception):
    """A stable marker read timed out: an open transaction holds offsets of the group."""


class Generations:
    """Fencing, registration, markers and replays of a Kafka sink writer (a mixin of
    :class:`~epochal.connectors.kafka.writer.KafkaSinkWriter`, whose ``__init__`` sets
    the attributes below)."""

    ctx: Any
    _ck: Any
    _sink: Any
    _topic: str
    _prefix: str
    _base: dict
    _started: bool
    _transactional: bool
    _plain: Any
    _replay: Any
    _slots: list
    _lineage: str
    _parent: str | None
    _own: tuple[str, int]
    _groups: dict[tuple, Any]
    _markers: dict[tuple, int]
    _own_meta: recovery.MarkerMeta
    _last_marker: float
    _fenced: set[str]
    _missing: set[tuple]
    _committer: Any

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
        2. Open the producers: the replay slot's and every streaming slot's, at once
           (:meth:`_new_producers`) — never later on the task thread, where an epoch's
           first record would wait for its slot's ``init_transactions`` (issue 34).
        3. Register: commit this generation's metadata into its own group.
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
        self._replay, *self._slots = self._new_producers([recovery.REPLAY_SLOT, *range(len(self._slots))])
        # Step 3
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
        """``group``'s marker, final for recovery: no transaction that could still move it
        is left. Idempotent per group.

        1. Read the marker *unstable* (``read_uncommitted``: never held back by an open
           transaction, but blind to a commit whose markers the coordinator is still
           writing) and fence every writer it names: their open transactions abort, their
           pending commits complete, none can commit later.
        2. Read it *stable* (``read_committed``: Kafka answers once no transaction holds
           offsets of the group) and keep that answer if it names no writer left to fence.
        3. A stable read that waits :data:`STABLE_READ_S` is held back by an open transaction
           nobody named: a generation killed while it registered, or one that registered
           after step 1's read. Fence the replay slots of the generations after the named
           one (:func:`~epochal.connectors.kafka.recovery.unregistered_ids`), then go back to
           step 1. Recovery never waits on an open transaction for longer than that, however
           long ``transaction.timeout.ms`` is.
        """
        deadline = time.monotonic() + KAFKA_CALL_TIMEOUT_S
        while True:
            # Step 1
            unstable = self._read_marker(group)
            self._fence_named(group, unstable)
            # Step 2
            try:
                marker = self._read_marker(group, stable=True, timeout=STABLE_READ_S)
            except _HeldBack:
                # Step 3
                if self._fence_named(group, unstable, unregistered=True):
                    log.warning("%s: the marker of subtask %d was held back by an open transaction of a generation "
                                "that never registered (killed while it started?): fenced it", self._where(), group[1])
                    continue
                if time.monotonic() > deadline:
                    raise SinkCommitError(
                        f"{self._where()}: the marker of subtask {group[1]} (lineage {group[0] or '(legacy)'}) on "
                        f"{self._sink.servers} stays held back by an open transaction after fencing every "
                        f"writer it names, for {KAFKA_CALL_TIMEOUT_S:.0f} s: another job with the same "
                        f"transactional_id_prefix {self._prefix!r}?") from None
                log.info("%s: the marker of subtask %d is held back by an open transaction; reading it again to "
                         "find its writer", self._where(), group[1])
                continue
            if not self._fence_named(group, marker):
                break
        self._markers[group] = marker.epoch if marker else 0
        if marker is None:
            self._missing.add(group)
        return marker

    def _fence_named(self, group: tuple[str, int], marker: recovery.Marker | None, unregistered: bool = False) -> bool:
        """Fence the transactional ids ``marker`` names (and, if ``unregistered``, those of the
        generations after it that never registered), where not fenced yet; whether there
        were any (:func:`~epochal.connectors.kafka.recovery.fence_ids`,
        :func:`~epochal.connectors.kafka.recovery.unregistered_ids`)."""
        named = recovery.fence_ids(self._prefix, {group: marker}, self._lineage, self.ctx.generation)
        if unregistered:
            named += recovery.unregistered_ids(self._prefix, group, marker, self._lineage, self.ctx.generation)
        todo = [txid for txid in dict.fromkeys(named) if txid not in self._fenced]
        for txid in todo:
            self._kafka_call(f"fence transactional id {txid!r}", self._fence, txid)
            self._fenced.add(txid)
        if todo:
            log.info("%s: fenced %d transactional id(s) of %s", self._where(), len(todo),
                     "an earlier generation" if group[0] == self._lineage else f"lineage {group[0] or '(legacy)'}")
        return bool(todo)

    def _fence(self, txid: str) -> None:
        producer = self._ck.Producer(dict(self._base, **{"transactional.id": txid,
                                                         "transaction.timeout.ms": self._timeout_ms()}))
        producer.init_transactions(KAFKA_CALL_TIMEOUT_S)
        producer.flush(0)

    def _new_producers(self, slots: list) -> list:
        """:meth:`_new_producer` of every slot in ``slots``, in parallel: each waits for the
        broker and for librdkafka's own timers in ``init_transactions`` (50–550 ms each on
        the test broker), with the GIL released. Raises the first failure."""
        with ThreadPoolExecutor(len(slots), thread_name_prefix=f"kafka-init-{self.ctx.subtask}") as pool:
            return list(pool.map(self._new_producer, slots))

    def _new_producer(self, slot):
        txid = recovery.transactional_id(self._prefix, self.ctx.subtask, self.ctx.generation, slot, self._lineage)
        started = time.monotonic()
        producer = self._ck.Producer(dict(self._base, **{"transactional.id": txid,
                                                         "transaction.timeout.ms": self._timeout_ms()}))
        self._kafka_call(f"initialise producer {txid!r}", producer.init_transactions, KAFKA_CALL_TIMEOUT_S)
        if trace.ON:
            trace.event("producer", subtask=self.ctx.subtask, slot=slot, init_s=time.monotonic() - started)
        return producer

    def _timeout_ms(self) -> int:
        return int(self._sink.transaction_timeout * 1000)

    # ------------------------------------------------------------------ markers

    def _group(self, group: tuple[str, int], stable: bool = False):
        """A consumer of marker group ``group`` = ``(lineage, subtask)``. Unstable
        (``read_uncommitted``) it reads committed offsets without waiting for open
        transactions; stable (``read_committed``: librdkafka asks Kafka for stable offsets
        only) it waits until no transaction holds offsets of the group (:meth:`_settle`)."""
        key = (*group, "stable") if stable else group
        consumer = self._groups.get(key)
        if consumer is None:
            conf = {k: v for k, v in self._base.items() if k.startswith(("security.", "sasl.", "ssl.", "client."))}
            conf.update({"bootstrap.servers": self._sink.servers, "enable.auto.commit": False,
                         "isolation.level": "read_committed" if stable else "read_uncommitted",
                         "group.id": recovery.marker_group(self._prefix, group[1], group[0])})
            consumer = self._groups[key] = self._ck.Consumer(conf)
        return consumer

    def _read_marker(self, group: tuple[str, int], stable: bool = False,
                     timeout: float = KAFKA_CALL_TIMEOUT_S) -> recovery.Marker | None:
        """Kafka's marker of ``group``: the highest epoch committed there and who registered
        last, or None if the group holds none. Asks again while the group's coordinator is
        busy (:data:`_COORDINATOR_BUSY`), up to ``timeout``. A ``stable`` read that times
        out raises :class:`_HeldBack`; any other failure SinkCommitError."""
        tp = self._ck.TopicPartition(self._topic, 0)
        lineage, subtask = group
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = self._group(group, stable).committed([tp], timeout=max(0.1, deadline - time.monotonic()))[0]
                err = found.error
            except self._ck.KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if err is None or not hasattr(err, "name"):
                    raise
            if err is None:
                break
            if err.name() in _COORDINATOR_BUSY and time.monotonic() < deadline:
                time.sleep(0.05)  # back off before asking again; the coordinator is being set up
                continue
            if stable and err.name() == "_TIMED_OUT":
                raise _HeldBack(group)
            raise SinkCommitError(f"{self._where()}: cannot read the marker of subtask {subtask} (lineage "
                                  f"{lineage or '(legacy)'}) on {self._sink.servers}: {err.name()}: {err.str()}")
        if found.offset < 0:
            return None
        return recovery.Marker(found.offset, recovery.MarkerMeta.decode(found.metadata, subtask))

    def _marker_offsets(self, epoch: int) -> list:
        """The marker of ``epoch``: this writer's metadata (whoever fences next must fence it)."""
        return [self._ck.TopicPartition(self._topic, 0, epoch, metadata=self._own_meta.encode())]

    def _commit_with_marker(self, producer, epoch: int, group: tuple[str, int] | None = None) -> None:
        """Send the marker of ``epoch`` into ``producer``'s transaction and commit it, each
        call within ``commit_timeout`` — watched (:meth:`Committer.calling`), since
        librdkafka does not always keep that timeout."""
        group = self._own if group is None else group
        limit = self._sink.commit_timeout
        with self._committer.calling(f"send_offsets_to_transaction (the marker of epoch {epoch})"):
            producer.send_offsets_to_transaction(self._marker_offsets(epoch),
                                                 self._group(group).consumer_group_metadata(), limit)
        with self._committer.calling(f"commit_transaction (epoch {epoch})"):
            producer.commit_transaction(limit)
        self._markers[group] = epoch
        self._last_marker = time.monotonic()

    def _marker_only(self, epoch: int) -> None:
        self._replay.begin_transaction()
        self._commit_with_marker(self._replay, epoch)

    def _replay_epoch(self, txn: KafkaTransaction) -> None:
        """Step 2 of :meth:`commit`: produce ``txn`` from its handle unless Kafka holds it —
        as the marker of the lineage and subtask that wrote it says, once settled.

        When that marker group was gone at the start (:attr:`_missing`), the topic itself
        is asked (:meth:`_epoch_in_topic`) — but only for an epoch an earlier writer began:
        one of this writer's own generation (produced at its commit, having found no free
        producer) cannot be in Kafka yet, since this writer fenced every earlier one before
        it began any epoch. Asking there scanned the topic from the epoch's first record on
        for every such epoch of a fresh job (whose group is "missing" until it registers):
        ~100 ms each, growing with the topic, and it made a commit backlog feed itself
        (issue 34's stall)."""
        g = txn.group
        if g not in self._markers:
            self._settle(g)
        todo = recovery.epochs_to_produce([(txn.epoch, g)], self._markers)
        if not todo:
            return
        mine = txn.generation == self.ctx.generation and g == self._own
        if g in self._missing and not mine and self._epoch_in_topic(txn):
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

    def _kafka_call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._ck.KafkaException as exc:
            raise SinkCommitError(f"{self._where()}: cannot {what} on {self._sink.servers}: "
                                  f"{describe_error(exc)}") from exc
