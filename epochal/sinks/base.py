"""Sinks: the user-facing config object, the per-task writer and the two-phase-commit base.

The epoch commit is a two-phase commit (seed 004 §4.1.3): at barrier n every sink
*pre-commits* the side effects of epoch n (Prepare Phase, 1b); once the coordinator has made
checkpoint n durable it notifies the tasks, which *commit* every pending epoch ≤ n (Commit
Phase, 2b). A crash between the phases is harmless: on rollback every sink "issues a
preemptive commit" of the pre-committed transactions recorded in the restored state (seed
004 §4.1.3.1, "State in External Backends"), so :meth:`TwoPhaseCommitSink.commit` must be
idempotent. Table 4.1 maps the four operations onto backends; for files (HDFS row): start =
create a file in a tmp dir, pre-commit = close it, commit = atomic move to the committed
dir, abort = truncate/delete (the IBM FileSink truncates on reset, seed 000 §4.2.2).

The pre-commit is split in two, as in Flink (seed 004 §4.5.1): at the barrier the task
thread only *seals* the epoch's transaction — no more writes go to it, the next epoch's
transaction begins — which must be O(1) in the data written; the *durability step*
(flush / fsync / close / upload of what was sealed) runs on the task's uploader thread
while records keep flowing, and the task acknowledges the epoch only after it succeeded.
A checkpoint therefore never completes before its transactions are durable.

:class:`TwoPhaseCommitSink` owns that protocol (like Flink's ``TwoPhaseCommitSinkFunction``);
an author writes only begin / write_to / pre_commit / commit / abort / cleanup_orphans.
The guarantee never reaches a sink: the runtime passes :class:`SinkContext.mode`, chosen by
:mod:`epochal.alignment.factory`, and the base picks its publishing strategy from it once.
"""
from __future__ import annotations

import threading
from abc import abstractmethod
from typing import Any, Callable, final

from epochal.errors import ConfigError
from epochal.sinks.transactions import (
    PROTOCOLS,
    TransactionState,
    TransactionStateError,
    TwoPhaseCommitState,
    Txn,
)
from epochal.sinks.api import (  # noqa: F401  (the sink API, re-exported where it always was)
    _REPR_LIMIT,
    Sink,
    SinkCommitError,
    SinkContext,
    SinkWriteError,
    SinkWriter,
    log,
)


_FINAL_METHODS = ("restore", "write", "write_many", "write_batch", "snapshot", "durability_job",
                  "notify_epoch_complete", "close", "release")


class TwoPhaseCommitSink(SinkWriter):
    """A writer whose base class owns the epoch two-phase commit (seed 004 §4.1.3).

    ``restore``, ``write``, ``write_many``, ``snapshot``, ``durability_job``,
    ``notify_epoch_complete`` and ``close`` are final (overriding them raises TypeError).
    Subclasses implement the hooks; a transaction handle ("txn") is whatever picklable object
    ``begin_transaction`` returns — it is stored in checkpoints and handed to ``commit`` on a
    new writer after a crash.

    In ``SinkMode.TRANSACTIONAL`` one transaction per epoch is sealed at its barrier, made
    durable by the epoch's :meth:`durability_job` before the task acknowledges the epoch, and
    committed when its checkpoint completes. In ``SinkMode.DIRECT`` the same hooks run but
    each transaction is made durable and committed right at its barrier, and also as soon as
    it is older than ``direct_publish_interval`` (a new transaction of the same epoch
    continues), so at-least-once output is visible sooner than the checkpoint interval (see
    ``PublishAtBarrier`` in :mod:`epochal.sinks.transactions`). ``begin_transaction`` may
    therefore be called several times for one epoch in DIRECT mode and must return distinct
    transactions. The strategy is chosen once, from ``ctx.mode``, in ``__init__``.

    Any exception from a hook moves its transaction to FAILED and makes the writer unusable:
    further calls raise :class:`TransactionStateError` until the runtime restores a new one.

    **Threads.** Everything runs on the task thread except the durability steps, which the
    epoch's :meth:`durability_job` runs on the uploader thread. A step only touches what
    ``pre_commit`` handed to it and its own transaction's bookkeeping (under a lock that the
    task thread takes only when a step has not run yet, i.e. never in the runtime). A failed
    step is recorded, not acted on, by the uploader: the task thread sees it at its next
    ``snapshot`` or ``close`` and fails the writer there.
    """

    #: DIRECT mode publishes an open transaction once it is this many seconds old
    direct_publish_interval: float = 0.05

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        overridden = [m for m in _FINAL_METHODS if m in cls.__dict__]
        if overridden:
            raise TypeError(f"{cls.__name__} must not override final method(s) {overridden} of "
                            "TwoPhaseCommitSink; implement the transaction hooks instead")

    def __init__(self, ctx: SinkContext):
        try:
            self._protocol = PROTOCOLS[ctx.mode]
            self._publishes_between_barriers = self._protocol.publishes_between_barriers
        except KeyError:
            raise ConfigError(f"sink {ctx.sink_name!r}: unknown sink mode {ctx.mode!r}") from None
        self.ctx = ctx
        self._open: Txn | None = None  # None before restore, after close and after a failure
        self._pending: list[Txn] = []
        self._epoch = 0  # latest restored or snapshotted epoch
        self._phase = "created"  # created → running → closed | failed
        self._failure = ""  # what failed, for error messages
        self._steps = threading.Lock()  # serialises durability steps (uploader vs. inline)
        self._lost: str | None = None  # set by a failed durability step (any thread)

    # ---------------------------------------------------------------- author hooks

    @abstractmethod
    def begin_transaction(self, epoch: int) -> Any:
        """Start the transaction for ``epoch``; return a picklable handle (Table 4.1 Start)."""

    @abstractmethod
    def write_to(self, txn: Any, record: Any) -> None:
        """Write ``record`` into ``txn``; invisible to readers in TRANSACTIONAL mode."""

    def write_many_to(self, txn: Any, records: list) -> None:
        """Write ``records`` into ``txn`` in order: ``write_to`` for each (the default); a
        sink overrides it when a batch is cheaper written at once. If a record fails, the
        records before it are written and the error names it."""
        write_to = self.write_to
        for record in records:
            write_to(txn, record)

    def write_batch_to(self, txn: Any, batch) -> None:
        """Write the rows of a ``pyarrow.RecordBatch`` into ``txn``: one dict per row through
        :meth:`write_to` unless overridden (a Parquet file takes the batch whole)."""
        for row in batch.to_pylist():
            self.write_to(txn, row)

    @abstractmethod
    def pre_commit(self, txn: Any) -> Callable[[], None] | None:
        """Seal ``txn`` at its barrier and return its durability step (or None).

        **Sealing** runs on the task thread while records wait, so it must be quick, O(1)
        in the data written: stop writing to ``txn`` — detach its open files or batches from
        the writer, so that ``begin_transaction`` / ``write_to`` of the next epoch never see
        them — and convert whatever only the task thread may convert (e.g. buffered records
        that can still be rejected with a :class:`SinkWriteError`).

        The **durability step** is a callable without arguments; afterwards ``txn`` must
        survive a crash of this process (Table 4.1 Pre-commit: flush, fsync, close, upload,
        record the transaction as prepared). Contract:

        * It runs at most once, on the task's uploader thread after ``snapshot`` returned and
          before the task acknowledges the epoch (in DIRECT mode, or when a caller commits
          without having run :meth:`durability_job`, inline on the task thread before the
          commit). Steps of one writer never run concurrently and run in epoch order.
        * It runs concurrently with ``write_to``, ``begin_transaction`` and ``pre_commit`` of
          later transactions, so it may touch only what this call handed to it and the
          handle ``txn`` itself — NEVER the live transaction, the writer's open files, or any
          other writer state the task thread changes. Thread-safe read-only state (paths,
          the file system object, the producer epoch) is fine.
        * It may complete the handle (e.g. record where the data went): the checkpoint state
          is serialised after the step returned.
        * If it raises, the transaction is lost, never retried (after a failed fsync the data
          may be gone even if a second fsync succeeds): the epoch is declined, the epochs after
          it cannot be acknowledged, and the task thread's next ``snapshot`` raises, so the
          job restarts from the latest completed checkpoint. It need not be idempotent.

        Return None when ``pre_commit`` made ``txn`` durable itself (a fully synchronous
        pre-commit, as in Flink's ``TwoPhaseCommitSinkFunction.preCommit``).
        """

    @abstractmethod
    def commit(self, txn: Any) -> None:
        """Publish ``txn``. MUST be idempotent: it is called again, possibly by a newer
        generation in another process, for transactions that are already (partly) committed."""

    @abstractmethod
    def abort(self, txn: Any) -> None:
        """Discard an open ``txn`` (Table 4.1 Abort: truncate/delete)."""

    def release_clients(self) -> None:
        """Close the writer's clients and connections (a producer, a database connection);
        open transactions may be aborted, pre-committed ones must be left as they are (the
        restored checkpoint may promise them). Called once by :meth:`release` on every path
        (after ``close`` or a failure); exceptions are logged and swallowed. Default: nothing."""

    @abstractmethod
    def cleanup_orphans(self, restored_epoch: int) -> None:
        """Delete staging leftovers of this subtask, of any generation, for epochs
        > ``restored_epoch``; called by ``restore`` after the re-commit of the restored state."""

    # ---------------------------------------------------------------- final protocol

    @final
    def restore(self, state: TwoPhaseCommitState | None) -> None:
        """Final. Resume after the completed epoch m recorded in ``state`` (m = 0 if None).

        1. Re-commit every pending transaction of ``state`` in epoch order (all ≤ m, and m
           is complete, so this is safe; seed 004 §4.1.3.1 "preemptive commit").
        2. ``cleanup_orphans(m)``: staging data of epochs > m is from rolled-back attempts.
        3. Begin the transaction of epoch m + 1.
        """
        if self._phase != "created":
            raise TransactionStateError(f"{self._where()}: restore() must be called once, first")
        if state is not None and not isinstance(state, TwoPhaseCommitState):
            raise TypeError(f"{self._where()}: restore() expects TwoPhaseCommitState or None, "
                            f"got {type(state).__name__}")
        self._phase = "running"
        state = state or TwoPhaseCommitState(epoch=0)
        # Step 1
        for epoch, handle in sorted(state.pending, key=lambda p: p[0]):
            self._advance(Txn(epoch, handle, TransactionState.PRE_COMMITTED),
                          TransactionState.COMMITTED, self.commit)
        # Step 2
        self._call(self.cleanup_orphans, state.epoch)
        # Step 3
        self._epoch = state.epoch
        self._open = Txn(state.epoch + 1, self._call(self.begin_transaction, state.epoch + 1))

    @final
    def write(self, record: Any) -> None:
        """Final. Write ``record`` into the open transaction (``write_to``)."""
        txn = self._open
        if txn is None:
            raise self._unusable("write")
        try:
            self.write_to(txn.handle, record)
        except BaseException as exc:
            self._fail(txn, "write_to", exc)
            raise
        if self._publishes_between_barriers:
            self._protocol.after_write(self, txn)

    @final
    def write_many(self, records: list) -> None:
        """Final. Write ``records`` into the open transaction (``write_many_to``); as
        ``write`` for each, with DIRECT mode's publish check once per call."""
        txn = self._open
        if txn is None:
            raise self._unusable("write")
        try:
            self.write_many_to(txn.handle, records)
        except BaseException as exc:
            self._fail(txn, "write_to", exc)
            raise
        if self._publishes_between_barriers:
            self._protocol.after_write(self, txn, len(records))

    @final
    def write_batch(self, batch) -> None:
        """Final. Write a ``pyarrow.RecordBatch`` into the open transaction (``write_batch_to``)."""
        txn = self._open
        if txn is None:
            raise self._unusable("write")
        try:
            self.write_batch_to(txn.handle, batch)
        except BaseException as exc:
            self._fail(txn, "write_batch_to", exc)
            raise
        if self._publishes_between_barriers:
            self._protocol.after_write(self, txn, batch.num_rows)

    @final
    def snapshot(self, epoch: int) -> TwoPhaseCommitState:
        """Final. Barrier ``epoch`` (seed 004 §4.1.3 Prepare Phase, 1b), synchronous part.

        0. Raise if a durability step failed on the uploader since the last call.
        1. Seal the open transaction (``pre_commit``); it now belongs to checkpoint
           ``epoch``. Its durability step runs later, in :meth:`durability_job` (DIRECT
           mode runs it here and commits).
        2. Begin the transaction of ``epoch + 1``.
        3. Return the pending transactions, including ``epoch``'s, as the checkpoint state.
        """
        txn = self._open
        if txn is None:
            raise self._unusable("snapshot")
        if epoch <= self._epoch:
            raise TransactionStateError(f"{self._where()}: snapshot({epoch}) after epoch "
                                        f"{self._epoch}; epochs must increase")
        # Step 0
        self._raise_if_lost()
        # Step 1
        txn.epoch = epoch
        self._open = None
        self._protocol.at_barrier(self, txn)
        # Step 2
        self._epoch = epoch
        self._open = Txn(epoch + 1, self._call(self.begin_transaction, epoch + 1))
        # Step 3
        return TwoPhaseCommitState(epoch, tuple((t.epoch, t.handle) for t in self._pending))

    @final
    def durability_job(self, epoch: int) -> Callable[[], None] | None:
        """Final. The asynchronous part of ``snapshot(epoch)``; call it right after
        ``snapshot(epoch)``, on the task thread. None when nothing is left to do.

        The job makes every pending transaction of checkpoint ``epoch`` durable: it runs the
        durability steps that have not run yet, in epoch order, and raises if one of them
        failed — now or in an earlier job — so no checkpoint is ever acknowledged on top of a
        lost transaction. It captures the pending transactions now; it never reads the
        writer's live state. Running it twice is harmless (a step runs at most once).
        """
        if epoch != self._epoch or self._open is None:
            raise TransactionStateError(f"{self._where()}: durability_job({epoch}) must follow snapshot({epoch})")
        txns = tuple(t for t in self._pending if t.state is not TransactionState.PRE_COMMITTED)
        if not txns:
            return None

        def make_durable() -> None:
            for txn in txns:
                self._make_durable(txn, epoch)

        return make_durable

    @final
    def notify_epoch_complete(self, epoch: int) -> None:
        """Final. Checkpoint ``epoch`` is durable (seed 004 §4.1.3 Commit Phase, 2b).

        1. Commit every pending transaction ≤ ``epoch`` in epoch order, dropping each once
           committed; late or repeated notifications find nothing to commit. In the runtime
           each is durable already (its job ran before the ack); for a caller that never ran
           :meth:`durability_job`, its durability step runs here first, inline.
        """
        if self._open is None:
            raise self._unusable("notify_epoch_complete")
        # Step 1
        self._protocol.on_complete(self, epoch)

    @final
    def close(self) -> None:
        """Final. Clean end: abort (TRANSACTIONAL) or publish (DIRECT) the open transaction.

        Pending pre-committed transactions are left alone: their checkpoints may be
        complete, and the next restore re-commits them. A no-op after a failure or a close.
        """
        if self._open is not None:
            self._raise_if_lost()
        txn, self._open = self._open, None
        if txn is None:
            self._phase = "closed" if self._phase == "created" else self._phase
            return
        self._protocol.at_close(self, txn)
        self._phase = "closed"

    @final
    def release(self) -> None:
        """Final. The task ends, cleanly or not: :meth:`release_clients` once; the writer is
        unusable afterwards. Never raises."""
        if self._phase == "released":
            return
        self._open = None
        self._phase = "released"
        try:
            self.release_clients()
        except Exception:
            log.warning("%s: releasing its clients failed", self._where(), exc_info=True)

    # ---------------------------------------------------------------- internals

    def _advance(self, txn: Txn, target: TransactionState, hook) -> None:
        txn.state.to(target)  # guard: reject illegal transitions before touching the backend
        try:
            hook(txn.handle)
        except BaseException as exc:
            self._fail(txn, hook.__name__, exc)
            raise
        txn.state = target

    def _seal(self, txn: Txn) -> None:
        """Task thread: OPEN → SEALED (a step to run) or PRE_COMMITTED (none)."""
        txn.state.to(TransactionState.SEALED)
        try:
            step = self.pre_commit(txn.handle)
        except BaseException as exc:
            self._fail(txn, "pre_commit", exc)
            raise
        if step is None:
            txn.state = TransactionState.PRE_COMMITTED
        else:
            txn.step, txn.state = step, TransactionState.SEALED

    def _make_durable(self, txn: Txn, for_epoch: int) -> None:
        """Any thread: run ``txn``'s durability step unless it ran; raise if it failed.

        Takes the lock only while ``txn`` is not yet durable, so the task thread never waits
        for the uploader in the runtime (there the job always ran before the commit).
        """
        if txn.state is not TransactionState.SEALED and txn.state is not TransactionState.FAILED:
            return
        with self._steps:
            if txn.state is TransactionState.SEALED:
                step, txn.step = txn.step, None
                try:
                    step()
                except BaseException as exc:
                    txn.state = TransactionState.FAILED
                    self._lost = (f"the durability step of epoch {txn.epoch} raised {type(exc).__name__}: "
                                  f"{str(exc)[:_REPR_LIMIT]}")
                    raise
                txn.state = TransactionState.PRE_COMMITTED
            elif txn.state is TransactionState.FAILED:
                raise SinkCommitError(f"{self._where()}: epoch {for_epoch} cannot be made durable: "
                                      f"{self._lost or f'the transaction of epoch {txn.epoch} failed'}")

    def _make_durable_here(self, txn: Txn, for_epoch: int) -> None:
        """Task thread: :meth:`_make_durable`; a failure fails the writer."""
        try:
            self._make_durable(txn, for_epoch)
        except BaseException as exc:
            self._fail(None, "durability step", exc)
            raise

    def _raise_if_lost(self) -> None:
        """Task thread: a durability step failed on the uploader — fail the writer here."""
        if self._lost is not None:
            exc = SinkCommitError(f"{self._where()}: {self._lost}; the transaction's records are lost, "
                                  "so the task must restart from the latest completed checkpoint")
            self._fail(None, "durability step", exc)
            raise exc

    def _call(self, hook, *args):
        try:
            return hook(*args)
        except BaseException as exc:
            self._fail(None, hook.__name__, exc)
            raise

    def _fail(self, txn: Txn | None, hook: str, exc: BaseException) -> None:
        if txn is not None:
            txn.state = txn.state.to(TransactionState.FAILED)
        self._open = None
        self._phase = "failed"
        self._failure = (f"{hook}({'' if txn is None else f'epoch {txn.epoch}'}) raised "
                         f"{type(exc).__name__}: {str(exc)[:_REPR_LIMIT]}")

    def _where(self) -> str:
        c = self.ctx
        return f"sink {c.sink_name!r} subtask {c.subtask} generation {c.generation}"

    def _unusable(self, op: str) -> TransactionStateError:
        if self._phase == "failed":
            why = (f"the writer failed: {self._failure}; the runtime must restore a new writer from the "
                   "latest completed epoch")
        elif self._phase == "created":
            why = "restore() must be called first"
        else:
            why = "the writer is closed"
        return TransactionStateError(f"{self._where()}: {op}() not allowed: {why}")
