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

:class:`TwoPhaseCommitSink` owns that protocol (like Flink's ``TwoPhaseCommitSinkFunction``);
an author writes only begin / write_to / pre_commit / commit / abort / cleanup_orphans.
The guarantee never reaches a sink: the runtime passes :class:`SinkContext.mode`, chosen by
:mod:`epochal.alignment.factory`, and the base picks its publishing strategy from it once.
"""
from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, final

from epochal.alignment.factory import SinkMode
from epochal.errors import ConfigError, EpochalError

_REPR_LIMIT = 200


class SinkWriteError(EpochalError):
    """A sink cannot write a record (not serializable, wrong type for the schema, ...).

    Raised before any byte of the record is written, so nothing partial is published.
    """

    def __init__(self, sink_name: str, record: Any, reason: str):
        text = repr(record)
        self.sink_name = sink_name
        self.record_repr = text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + "...<truncated>"
        self.reason = reason if len(reason) <= 2 * _REPR_LIMIT else reason[:2 * _REPR_LIMIT] + "..."
        super().__init__(
            f"sink {sink_name!r} cannot write record {self.record_repr}: {self.reason} "
            f"(convert the record upstream, e.g. with a map, or fix the sink's schema/format)")

    def __reduce__(self):  # the record itself may not pickle; its repr always does
        return (SinkWriteError, (self.sink_name, _Shown(self.record_repr), self.reason))


class _Shown(str):
    """A string whose repr is itself (carries a record repr through pickling)."""

    def __repr__(self) -> str:
        return str(self)


class SinkCommitError(EpochalError):
    """A pre-committed transaction can no longer be committed (its staged data is gone)."""


class TransactionStateError(EpochalError, RuntimeError):
    """A protocol call that the transaction or writer lifecycle does not allow."""


@dataclass(frozen=True)
class SinkContext:
    """Where a writer runs: one physical sink task of one attempt of a job.

    ``generation`` grows with every restart (the coordinator's attempt counter); writers use
    it to keep a zombie of an older attempt from colliding with the current one. ``mode``
    is decided by :mod:`epochal.alignment.factory`; sinks never read the guarantee.
    """

    sink_name: str
    subtask: int
    parallelism: int
    job: str
    generation: int
    mode: SinkMode


class Sink(ABC):
    """User-facing sink configuration, part of the graph (must pickle with cloudpickle).

    Building a sink opens nothing; the runtime calls :meth:`create_writer` once per
    physical task and attempt.
    """

    @abstractmethod
    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        """A fresh writer for the task described by ``ctx``."""


class SinkWriter(ABC):
    """Per-task writer driven by the runtime on the task thread, in this order:

    1. ``restore(state_or_None)`` exactly once (``None`` on a fresh start);
    2. ``write(record)`` for every record of epoch n (between barriers n-1 and n);
    3. ``snapshot(n)`` at barrier n: the synchronous part of the task snapshot; the picklable
       result is stored in checkpoint n;
    4. ``notify_epoch_complete(n)`` any time after checkpoint n became durable — possibly
       late (after more barriers), repeated, or never (aborted epochs);
    5. ``close()`` at a clean end, after the final epoch was completed and notified.

    A crash may happen anywhere; recovery calls ``restore`` with the state snapshotted at
    the latest completed epoch on a NEW writer (maybe another process, newer generation).
    """

    @abstractmethod
    def restore(self, state: Any) -> None:
        """Resume from the state returned by ``snapshot(m)`` of a completed epoch m, or None."""

    @abstractmethod
    def write(self, record: Any) -> None:
        """Write one record of the current epoch. Raises :class:`SinkWriteError`."""

    @abstractmethod
    def snapshot(self, epoch: int) -> Any:
        """Barrier ``epoch`` reached: return picklable state for checkpoint ``epoch``."""

    @abstractmethod
    def notify_epoch_complete(self, epoch: int) -> None:
        """Checkpoint ``epoch`` is durable; late and repeated calls must be harmless."""

    @abstractmethod
    def close(self) -> None:
        """Clean end of the task; release resources."""


class TransactionState(enum.Enum):
    """Lifecycle of one epoch transaction; :meth:`to` is the guard.

    ==============  =====================================  ==============================
    from            to                                     by
    ==============  =====================================  ==============================
    OPEN            PRE_COMMITTED                          ``pre_commit`` at the barrier
    OPEN            ABORTED                                ``abort`` at ``close``
    PRE_COMMITTED   COMMITTED                              ``commit`` (notify or restore)
    OPEN,           FAILED                                 any hook raised; only a restore
    PRE_COMMITTED                                          on a new writer resolves it
    ==============  =====================================  ==============================

    COMMITTED, ABORTED and FAILED are final. A pre-committed transaction is never aborted
    by the writer: it may belong to a completed checkpoint whose notification was lost.
    """

    OPEN = "open"
    PRE_COMMITTED = "pre_committed"
    COMMITTED = "committed"
    ABORTED = "aborted"
    FAILED = "failed"

    def to(self, target: TransactionState) -> TransactionState:
        """Return ``target`` if ``self → target`` is legal, else raise TransactionStateError."""
        if target not in _LEGAL[self]:
            raise TransactionStateError(f"illegal transaction transition {self.name} -> {target.name}")
        return target


_S = TransactionState
_LEGAL: dict[TransactionState, frozenset[TransactionState]] = {
    _S.OPEN: frozenset({_S.PRE_COMMITTED, _S.ABORTED, _S.FAILED}),
    _S.PRE_COMMITTED: frozenset({_S.COMMITTED, _S.FAILED}),
    _S.COMMITTED: frozenset(),
    _S.ABORTED: frozenset(),
    _S.FAILED: frozenset(),
}


@dataclass(frozen=True)
class TwoPhaseCommitState:
    """What :class:`TwoPhaseCommitSink` stores in checkpoint ``epoch``: the pre-committed,
    not yet known committed transactions as ``(epoch, handle)``, oldest first."""

    epoch: int
    pending: tuple[tuple[int, Any], ...] = ()


@dataclass
class _Txn:
    epoch: int  # begin epoch until the barrier, then the checkpoint it belongs to
    handle: Any
    state: TransactionState = TransactionState.OPEN
    started: float = field(default_factory=time.monotonic)
    writes: int = 0


class _CommitOnCompletion:
    """SinkMode.TRANSACTIONAL (exactly-once): publish an epoch only once its checkpoint is
    complete; output of rolled-back epochs is never visible."""

    def at_barrier(self, w: TwoPhaseCommitSink, txn: _Txn) -> None:
        w._advance(txn, TransactionState.PRE_COMMITTED, w.pre_commit)
        w._pending.append(txn)

    publishes_between_barriers = False

    def on_complete(self, w: TwoPhaseCommitSink, epoch: int) -> None:
        while w._pending and w._pending[0].epoch <= epoch:
            w._advance(w._pending[0], TransactionState.COMMITTED, w.commit)
            w._pending.pop(0)

    def at_close(self, w: TwoPhaseCommitSink, txn: _Txn) -> None:
        w._advance(txn, TransactionState.ABORTED, w.abort)  # not part of any completed epoch


class _PublishAtBarrier:
    """SinkMode.DIRECT (at-least-once): pre-commit and commit at every barrier, so output is
    visible without waiting for the checkpoint. Cannot guarantee: after a restore from epoch
    m, records of epochs > m that were already published are written again (duplicates).
    Assumes the runtime replays every record after m (no loss)."""

    publishes_between_barriers = True

    def at_barrier(self, w: TwoPhaseCommitSink, txn: _Txn) -> None:
        w._advance(txn, TransactionState.PRE_COMMITTED, w.pre_commit)
        w._advance(txn, TransactionState.COMMITTED, w.commit)

    def after_write(self, w: TwoPhaseCommitSink, txn: _Txn) -> None:
        """Lower latency than the epoch: publish the open transaction once it is older than
        ``w.direct_publish_interval`` and continue the epoch in a new one. The clock is read
        every 64 writes only (the per-record path stays cheap)."""
        txn.writes += 1
        if txn.writes & 63 == 0 and time.monotonic() - txn.started >= w.direct_publish_interval:
            self.at_barrier(w, txn)
            w._open = _Txn(txn.epoch, w._call(w.begin_transaction, txn.epoch))

    def on_complete(self, w: TwoPhaseCommitSink, epoch: int) -> None:
        pass  # already published at the barrier

    at_close = at_barrier  # records after the last barrier are published too


_PROTOCOLS = {SinkMode.TRANSACTIONAL: _CommitOnCompletion(), SinkMode.DIRECT: _PublishAtBarrier()}
_FINAL_METHODS = ("restore", "write", "snapshot", "notify_epoch_complete", "close")


class TwoPhaseCommitSink(SinkWriter):
    """A writer whose base class owns the epoch two-phase commit (seed 004 §4.1.3).

    ``restore``, ``write``, ``snapshot``, ``notify_epoch_complete`` and ``close`` are final
    (overriding them raises TypeError). Subclasses implement the hooks; a transaction handle
    ("txn") is whatever picklable object ``begin_transaction`` returns — it is stored in
    checkpoints and handed to ``commit`` on a new writer after a crash.

    In ``SinkMode.TRANSACTIONAL`` one transaction per epoch is pre-committed at its barrier
    and committed when its checkpoint completes. In ``SinkMode.DIRECT`` the same hooks run
    but each transaction is committed right at its barrier, and also as soon as it is older
    than ``direct_publish_interval`` (a new transaction of the same epoch continues), so
    at-least-once output is visible sooner than the checkpoint interval (see
    ``_PublishAtBarrier``). ``begin_transaction`` may therefore be called several times
    for one epoch in DIRECT mode and must return distinct transactions. The strategy is
    chosen once, from ``ctx.mode``, in ``__init__``.

    Any exception from a hook moves its transaction to FAILED and makes the writer unusable:
    further calls raise :class:`TransactionStateError` until the runtime restores a new one.
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
            self._protocol = _PROTOCOLS[ctx.mode]
            self._publishes_between_barriers = self._protocol.publishes_between_barriers
        except KeyError:
            raise ConfigError(f"sink {ctx.sink_name!r}: unknown sink mode {ctx.mode!r}") from None
        self.ctx = ctx
        self._open: _Txn | None = None  # None before restore, after close and after a failure
        self._pending: list[_Txn] = []
        self._epoch = 0  # latest restored or snapshotted epoch
        self._phase = "created"  # created → running → closed | failed
        self._failure = ""  # what failed, for error messages

    # ---------------------------------------------------------------- author hooks

    @abstractmethod
    def begin_transaction(self, epoch: int) -> Any:
        """Start the transaction for ``epoch``; return a picklable handle (Table 4.1 Start)."""

    @abstractmethod
    def write_to(self, txn: Any, record: Any) -> None:
        """Write ``record`` into ``txn``; invisible to readers in TRANSACTIONAL mode."""

    @abstractmethod
    def pre_commit(self, txn: Any) -> None:
        """Flush and close ``txn``; afterwards it must survive a crash of this process."""

    @abstractmethod
    def commit(self, txn: Any) -> None:
        """Publish ``txn``. MUST be idempotent: it is called again, possibly by a newer
        generation in another process, for transactions that are already (partly) committed."""

    @abstractmethod
    def abort(self, txn: Any) -> None:
        """Discard an open ``txn`` (Table 4.1 Abort: truncate/delete)."""

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
            self._advance(_Txn(epoch, handle, TransactionState.PRE_COMMITTED),
                          TransactionState.COMMITTED, self.commit)
        # Step 2
        self._call(self.cleanup_orphans, state.epoch)
        # Step 3
        self._epoch = state.epoch
        self._open = _Txn(state.epoch + 1, self._call(self.begin_transaction, state.epoch + 1))

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
    def snapshot(self, epoch: int) -> TwoPhaseCommitState:
        """Final. Barrier ``epoch`` (seed 004 §4.1.3 Prepare Phase, 1b).

        1. Pre-commit the open transaction; it now belongs to checkpoint ``epoch``
           (DIRECT mode also commits it here).
        2. Begin the transaction of ``epoch + 1``.
        3. Return the pending transactions, including ``epoch``'s, as the checkpoint state.
        """
        txn = self._open
        if txn is None:
            raise self._unusable("snapshot")
        if epoch <= self._epoch:
            raise TransactionStateError(f"{self._where()}: snapshot({epoch}) after epoch "
                                        f"{self._epoch}; epochs must increase")
        # Step 1
        txn.epoch = epoch
        self._open = None
        self._protocol.at_barrier(self, txn)
        # Step 2
        self._epoch = epoch
        self._open = _Txn(epoch + 1, self._call(self.begin_transaction, epoch + 1))
        # Step 3
        return TwoPhaseCommitState(epoch, tuple((t.epoch, t.handle) for t in self._pending))

    @final
    def notify_epoch_complete(self, epoch: int) -> None:
        """Final. Checkpoint ``epoch`` is durable (seed 004 §4.1.3 Commit Phase, 2b).

        1. Commit every pending transaction ≤ ``epoch`` in epoch order, dropping each once
           committed; late or repeated notifications find nothing to commit.
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
        txn, self._open = self._open, None
        if txn is None:
            self._phase = "closed" if self._phase == "created" else self._phase
            return
        self._protocol.at_close(self, txn)
        self._phase = "closed"

    # ---------------------------------------------------------------- internals

    def _advance(self, txn: _Txn, target: TransactionState, hook) -> None:
        txn.state.to(target)  # guard: reject illegal transitions before touching the backend
        try:
            hook(txn.handle)
        except BaseException as exc:
            self._fail(txn, hook.__name__, exc)
            raise
        txn.state = target

    def _call(self, hook, *args):
        try:
            return hook(*args)
        except BaseException as exc:
            self._fail(None, hook.__name__, exc)
            raise

    def _fail(self, txn: _Txn | None, hook: str, exc: BaseException) -> None:
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
