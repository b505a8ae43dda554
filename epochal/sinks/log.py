"""LogSink: a Kafka-style transactional, partitioned log on fsspec, written by epoch transactions.

Table 4.1 of seed 004 (Kafka ≥ 0.11 row), mapped onto
:class:`~epochal.sinks.base.TwoPhaseCommitSink`:

=========  ===============================================================================
Start      new transaction: a handle named by epoch, generation and producer epoch
write      append the record's JSON line to the transaction's staged batch of its
           partition (``partition-<p>/_staging/<txid>/<txn>.jsonl``): invisible to readers
Pre-commit close/new transaction: seal (task thread, at the barrier): detach the staged
           batches from the writer, note each partition's marker tip; the next epoch's
           transaction begins. Durability step (uploader thread, before the ack): fsync
           and close the batches, check the producer is not fenced, record the
           transaction as ``prepared`` in ``_txns/<txid>/<txn>.json``
Commit     commit transaction: move each batch to ``partition-<p>/segments/`` and then, LAST,
           create the partition's next commit marker ``commit-<seq>.json`` naming it;
           idempotent: a re-commit finds the markers it already wrote and skips them
Abort      abort transaction: delete the staged batches (they were never visible)
=========  ===============================================================================

Layout of topic ``t`` under ``root`` (plain path, ``file://`` or ``memory://``; the storage
primitives are :class:`~epochal.sources.log.TransactionalLog`)::

    t/_topic.json                    {"partitions": N}, created once, never changed
    t/_producers/<txid>.json         the current producer epoch of a transactional id
    t/_txns/<txid>/<txn>.json        transaction state: prepared | committed
    t/partition-<p>/commit-<seq>.json  the partition's log: commit and fence markers
    t/partition-<p>/segments/<txid>/<txn>.jsonl  committed batches (one JSON value a line)

**Semantics compared to Kafka.**

* *transactional.id*: one per sink subtask, ``f"{job}-{sink}-{subtask}"`` by default (or
  ``f"{transactional_id}-{subtask}"``), stable across restarts like Flink's Kafka sink.
* *producer epoch fencing*: every new writer of a transactional id bumps its producer
  epoch in ``_producers/<txid>.json`` (Kafka's ``initTransactions``) during ``restore``, and
  appends a *fence* marker with the new epoch to every partition. A writer whose epoch is
  older than the stored one cannot pre-commit or commit (:class:`ProducerFencedError`), and
  readers ignore a commit marker that follows a newer fence of its transactional id, so
  even a zombie racing the fence publishes nothing after it. The one gap Kafka closes with
  its broker-side coordinator: a zombie commit racing the fence may land in the partitions
  the fence has not reached yet; the engine only ever commits epochs whose checkpoint
  completed, and the new writer's re-commit then completes that transaction (it never
  duplicates it, the markers are found).
* *read_committed*: markers are created exclusively (``os.link`` on local files, a lock in
  ``memory://``; other fsspec stores get the lock too, which is exclusive within one process
  only), complete and in order, so the marker sequence is a total commit order.
  Offsets are dense, ``0, 1, 2, …``, over the records of the valid commit markers in that
  order. Kafka assigns offsets at append time, leaves gaps for control records and makes
  read_committed consumers stop at the last stable offset (before the first open
  transaction); here records get offsets only when committed, so nothing waits on an open
  transaction. As in Kafka, a transaction spanning partitions becomes visible partition by
  partition (one marker each), never partly within a partition.
* *aborted transactions* never reach a partition's log: their staged batches are deleted
  (``abort``, or ``cleanup_orphans`` after a restore). Kafka keeps aborted records in the log
  and read_committed consumers skip them using abort markers; here no consumer can see them.
* *partitioning*: ``stable_hash(key_fn(record)) % partitions`` (the same in every process),
  else each subtask writes to partition ``subtask % partitions`` (Flink's fixed partitioner),
  which keeps a subtask's records in order within its partition.

Records are JSON values: tuples come back as lists, dict keys as strings.

>>> import uuid; from epochal.alignment.factory import SinkMode
>>> root = f"memory://doc-{uuid.uuid4().hex}"
>>> ctx = SinkContext("out", subtask=0, parallelism=1, job="j", generation=0,
...                   mode=SinkMode.TRANSACTIONAL)
>>> w = LogSink(root, "t", partitions=2).create_writer(ctx); w.restore(None); w.write({"a": 1})
>>> from epochal.sources.log import read_committed_log
>>> state = w.snapshot(1); read_committed_log(root, "t")
{0: [], 1: []}
>>> w.notify_epoch_complete(1); read_committed_log(root, "t")
{0: [{'a': 1}], 1: []}
"""
from __future__ import annotations

import functools
import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochal.backends.keygroups import stable_hash
from epochal.errors import ConfigError
from epochal.sinks.base import Sink, SinkCommitError, SinkContext, SinkWriteError, TwoPhaseCommitSink
from epochal.durable import fsync, fsync_dir
from epochal.sources.log import TransactionalLog, check_name

__all__ = ["LogSink", "LogSinkWriter", "LogTransaction", "ProducerFencedError", "TransactionalLog"]


class ProducerFencedError(SinkCommitError):
    """A newer writer took over this transactional id: this writer is a zombie and must stop."""


class LogSink(Sink):
    """Write records to a topic of a :class:`TransactionalLog`, one transaction per epoch and
    subtask (see the module docstring for the Kafka mapping).

    Args:
        root: directory of the log (plain path, ``file://``, ``memory://``).
        topic: topic name (letters, digits, ``_ . -``).
        partitions: create the topic with this many partitions if it does not exist (an
            existing topic must have as many). None: use the existing topic, or create it with
            one partition per sink subtask.
        key_fn: ``record -> key``; the partition is ``stable_hash(key) % partitions``. None:
            subtask ``s`` writes to partition ``s % partitions``.
        transactional_id: prefix of the transactional ids (``f"{prefix}-{subtask}"``); default
            ``f"{job}-{sink_name}"``. Two jobs writing one topic need different prefixes.

    Raises:
        ConfigError: for an invalid argument, when the sink is built.
    """

    local_recovery = True  # each subtask recovers only its own output (failover regions)

    def __init__(self, root: str, topic: str, *, partitions: int | None = None,
                 key_fn: Callable[[Any], Any] | None = None, transactional_id: str | None = None):
        if not isinstance(root, str) or not root:
            raise ConfigError(f"LogSink root: expected a non-empty path or URL, got {root!r}")
        check_name(topic, "LogSink topic")
        if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)
                                       or partitions < 1):
            raise ConfigError(f"LogSink partitions: expected an integer >= 1 or None, got {partitions!r}")
        if key_fn is not None and not callable(key_fn):
            raise ConfigError(f"LogSink key_fn: expected a callable record -> key, got {key_fn!r}")
        if transactional_id is not None:
            check_name(transactional_id, "LogSink transactional_id")
        self.root, self.topic, self.partitions = root, topic, partitions
        self.key_fn, self.transactional_id = key_fn, transactional_id

    def create_writer(self, ctx: SinkContext) -> LogSinkWriter:
        return LogSinkWriter(self, ctx)

    def __repr__(self) -> str:
        return f"LogSink({self.root!r}, {self.topic!r})"

    def locations(self) -> tuple[str, ...]:
        return (self.root,)


@dataclass
class LogTransaction:
    """Picklable handle of one epoch transaction: staged record counts per partition and,
    from the pre-commit on, each partition's marker tip (a re-commit looks for its own
    markers only after it)."""

    transactional_id: str
    name: str  # e<epoch>-g<generation>-pe<producer epoch>: unique per transactional id
    epoch: int
    producer_epoch: int
    records: dict[int, int] = field(default_factory=dict)
    floors: dict[int, int] = field(default_factory=dict)


class LogSinkWriter(TwoPhaseCommitSink):
    """The per-task writer of a :class:`LogSink` (hooks of the two-phase commit only)."""

    def __init__(self, sink: LogSink, ctx: SinkContext):
        super().__init__(ctx)
        self._key_fn = sink.key_fn
        self._txid_prefix = sink.transactional_id or f"{ctx.job}-{ctx.sink_name}"
        self.txid = f"{self._txid_prefix}-{ctx.subtask}"
        log = TransactionalLog(sink.root, sink.topic)
        if sink.partitions is not None or not log.exists():
            log = TransactionalLog.create_topic(sink.root, sink.topic, sink.partitions or ctx.parallelism)
        self.log = log
        self._fixed = ctx.subtask % log.partitions
        self._epoch_of_producer: int | None = None  # set by the first hook, inside restore()
        self._files: dict[int, Any] = {}  # partition -> staged batch of the open transaction
        self._prepared_here: set[str] = set()  # txns this writer pre-committed (no re-commit scan)

    @property
    def producer_epoch(self) -> int:
        """This writer's producer epoch; the first call (in ``restore``) bumps the stored one."""
        return self._init_producer()

    def _init_producer(self) -> int:
        if self._epoch_of_producer is None:
            self._epoch_of_producer = self.log.init_producer(
                self.txid, generation=self.ctx.generation, job=self.ctx.job, sink=self.ctx.sink_name)
        return self._epoch_of_producer

    def begin_transaction(self, epoch: int) -> LogTransaction:
        self._txn_seq = getattr(self, "_txn_seq", -1) + 1  # DIRECT mode begins several per epoch
        name = f"e{epoch:010d}-g{self.ctx.generation:06d}-pe{self.producer_epoch:06d}-t{self._txn_seq:06d}"
        return LogTransaction(self.txid, name, epoch, self.producer_epoch)

    def write_to(self, txn: LogTransaction, record: Any) -> None:
        try:
            line = json.dumps(record).encode("utf-8") + b"\n"
        except (TypeError, ValueError, RecursionError) as exc:
            raise SinkWriteError(self.ctx.sink_name, record, f"not JSON-serializable: {exc}") from exc
        p = self._partition_of(record)
        f = self._files.get(p)
        if f is None:
            path = self._staged(txn, p)
            self.log.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            f = self._files[p] = self.log.fs.open(path, "wb")
        f.write(line)  # only whole, encoded records reach the batch
        txn.records[p] = txn.records.get(p, 0) + 1

    def pre_commit(self, txn: LogTransaction):
        """Seal (task thread; no I/O but a once-per-writer listing of a partition's markers):

        1. Detach the staged batches from the writer.
        2. Remember each partition's marker tip (a re-commit searches after it; the tip is
           cached and only grows, and this transaction's markers come after the step).

        The returned durability step (uploader thread) makes the transaction prepared:

        3. fsync and close the staged batches: they survive a crash of this process.
        4. Fail with :class:`ProducerFencedError` if a newer writer owns the transactional id.
        5. Record the transaction as ``prepared``.
        """
        # Step 1
        files, self._files = self._files, {}
        if not txn.records:
            return None  # an empty epoch publishes nothing (and opened no batch)
        # Step 2
        txn.floors = {p: self.log.tip(p) for p in txn.records}
        self._prepared_here.add(txn.name)  # commit runs only after the step succeeded
        return functools.partial(self._prepare, txn, list(files.values()))

    def _prepare(self, txn: LogTransaction, files: list) -> None:
        """The durability step of ``txn`` (uploader thread): touches ``files`` and ``txn``,
        and only reads the writer (transactional id, producer epoch, the log's paths)."""
        # Step 3
        for f in files:
            fsync(f)
            f.close()
        for directory in {posixpath.dirname(self._staged(txn, p)) for p in txn.records}:
            fsync_dir(self.log.fs, directory)
        # Step 4
        self._check_not_fenced("pre_commit", txn)
        # Step 5
        self._write_state(txn, "prepared")

    def commit(self, txn: LogTransaction) -> None:
        """1. Fail with :class:`ProducerFencedError` if a newer writer owns the transactional id.
        2. Skip a transaction already recorded as committed (idempotence, fast path).
        3. Per partition: unless its marker exists (re-commit), move the batch to
           ``segments/`` and create the commit marker LAST.
        4. Record the transaction as committed.
        """
        if not txn.records:
            return
        fresh = txn.name in self._prepared_here
        # Step 1
        self._check_not_fenced("commit", txn)
        # Step 2
        if not fresh and self._state(txn) == "committed":
            return
        # Step 3
        for p in sorted(txn.records):
            if fresh or not self._published(txn, p):
                self._publish(txn, p)
        # Step 4
        self._write_state(txn, "committed")
        self._prepared_here.discard(txn.name)

    def abort(self, txn: LogTransaction) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            f.close()
        for p in txn.records:
            if self.log.fs.exists(self._staged(txn, p)):
                self.log.fs.rm(self._staged(txn, p))

    def cleanup_orphans(self, restored_epoch: int) -> None:
        """Delete all staged batches and transaction records of this transactional id, and
        of every transactional id this subtask took over after a rescale (old subtask ``j >=
        parallelism`` with ``j % parallelism == subtask``), after fencing those too: a
        zombie of a subtask that no longer exists must not commit either.

        A superset of the contract (epochs > ``restored_epoch``): ``restore`` calls this after
        re-committing the restored state, so what is left belongs to rolled-back attempts.
        Segments are never deleted: one without a marker (a DIRECT-mode crash between the
        move and the marker) is unreferenced, so no reader ever sees it.
        """
        self._init_producer()  # restore() always gets here: the new writer fences the old ones
        txids = [self.txid]
        for old in self._absorbed_txids():
            self.log.init_producer(old, generation=self.ctx.generation, job=self.ctx.job,
                                   sink=self.ctx.sink_name, taken_over_by=self.txid)
            txids.append(old)
        fs = self.log.fs
        for txid in txids:
            for path in [self.log.partition_path(p, "_staging", txid) for p in range(self.log.partitions)] + [
                    self.log.path("_txns", txid)]:
                if fs.exists(path):
                    fs.rm(path, recursive=True)

    def _absorbed_txids(self) -> list[str]:
        """Transactional ids of this sink's old subtasks ``j >= parallelism`` mapped to this
        subtask (``j % parallelism``), found among the log's registered producers."""
        own, p = self.ctx.subtask, self.ctx.parallelism
        found = []
        producers = self.log.path("_producers")
        fs = self.log.fs
        fs.invalidate_cache(producers)
        if not fs.exists(producers):
            return found
        prefix = f"{self._txid_prefix}-"
        for path in fs.ls(producers, detail=False):
            name = posixpath.basename(path)
            if name.startswith(prefix) and name.endswith(".json") and name[len(prefix):-5].isdigit():
                j = int(name[len(prefix):-5])
                if j >= p and j % p == own:
                    found.append(name[:-5])
        return sorted(found)

    # ------------------------------------------------------------------ helpers

    def _partition_of(self, record: Any) -> int:
        if self._key_fn is None:
            return self._fixed
        try:
            key = self._key_fn(record)
        except Exception as exc:
            raise SinkWriteError(self.ctx.sink_name, record, f"key_fn raised {type(exc).__name__}: {exc}") from exc
        try:
            return stable_hash(key) % self.log.partitions
        except TypeError as exc:
            raise SinkWriteError(self.ctx.sink_name, record, f"cannot partition by key {key!r}: {exc}") from exc

    def _staged(self, txn: LogTransaction, p: int) -> str:
        return self.log.partition_path(p, "_staging", txn.transactional_id, f"{txn.name}.jsonl")

    def _segment(self, txn: LogTransaction) -> str:
        return posixpath.join("segments", txn.transactional_id, f"{txn.name}.jsonl")

    def _publish(self, txn: LogTransaction, p: int) -> None:
        staged, segment = self._staged(txn, p), self.log.partition_path(p, self._segment(txn))
        fs = self.log.fs
        if fs.exists(staged):
            fs.makedirs(posixpath.dirname(segment), exist_ok=True)
            fs.mv(staged, segment)
            fsync_dir(fs, posixpath.dirname(segment))  # before the marker that makes it visible
        elif not fs.exists(segment):
            raise SinkCommitError(
                f"{self._where()}: cannot commit transaction {txn.name!r} of {txn.transactional_id!r} to "
                f"partition {p} of topic {self.log.topic!r}: its batch is gone from staging and segments "
                "(deleted by hand, or another job uses this transactional id?)")
        self.log.append_marker(p, {"type": "commit", "transactional_id": txn.transactional_id, "txn": txn.name,
                                   "producer_epoch": self._marker_epoch(txn), "records": txn.records[p],
                                   "segment": self._segment(txn)})

    def _marker_epoch(self, txn: LogTransaction) -> int:
        """The producer epoch a commit marker of ``txn`` carries: this writer's own, or — for
        a transaction of an id taken over after a rescale, re-committed in ``restore``
        before that id is fenced — the id's current epoch, so readers accept it."""
        if txn.transactional_id == self.txid:
            return self.producer_epoch
        current = self.log.producer_epoch(txn.transactional_id)
        return txn.producer_epoch if current is None else current

    def _published(self, txn: LogTransaction, p: int) -> bool:
        """Is there a valid commit marker of ``txn`` in partition ``p`` after its floor?"""
        fence, seq = -1, txn.floors.get(p, -1) + 1
        while (m := self.log.marker(p, seq)) is not None:
            if m["transactional_id"] == txn.transactional_id:
                if m["type"] == "fence":
                    fence = max(fence, m["producer_epoch"])
                elif m["txn"] == txn.name and m["producer_epoch"] >= fence:
                    return True
            seq += 1
        return False

    def _check_not_fenced(self, op: str, txn: LogTransaction) -> None:
        current = self.log.producer_epoch(self.txid)
        if current is not None and current > self.producer_epoch:
            raise ProducerFencedError(
                f"{self._where()}: {op} of transaction {txn.name!r} refused: transactional id {self.txid!r} "
                f"was fenced (this writer's producer epoch {self.producer_epoch} < current {current}); a newer "
                "writer took over, so this one is a zombie of an older attempt and must stop")

    def _state_path(self, txn: LogTransaction) -> str:
        return self.log.path("_txns", txn.transactional_id, f"{txn.name}.json")

    def _write_state(self, txn: LogTransaction, state: str) -> None:
        record = {"state": state, "epoch": txn.epoch, "producer_epoch": self.producer_epoch,
                  "partitions": {str(p): n for p, n in sorted(txn.records.items())}}
        self.log.write_atomic(self._state_path(txn), json.dumps(record).encode())

    def _state(self, txn: LogTransaction) -> str | None:
        try:
            return json.loads(self.log.read_bytes(self._state_path(txn)))["state"]
        except FileNotFoundError:
            return None
