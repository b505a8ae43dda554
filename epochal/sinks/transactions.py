"""The lifecycle of one epoch transaction and the two ways :class:`~epochal.sinks.base.TwoPhaseCommitSink`
publishes transactions (chosen once per writer from :class:`~epochal.alignment.factory.SinkMode`).

Strategies are stateless and drive the writer ``w`` through its internal steps
(``_seal``, ``_make_durable_here``, ``_advance``); the writer owns all state. What they
use of it is written down as :class:`Writer`, so this module never imports the sink base
(which imports it).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from epochal.alignment.factory import SinkMode
from epochal.errors import EpochalError


class TransactionStateError(EpochalError, RuntimeError):
    """A protocol call that the transaction or writer lifecycle does not allow."""


class TransactionState(enum.Enum):
    """Lifecycle of one epoch transaction; :meth:`to` is the guard.

    ==============  ===============  ===================================================
    from            to               by
    ==============  ===============  ===================================================
    OPEN            SEALED           ``pre_commit`` at the barrier returned a durability
                                     step (task thread; no more writes)
    OPEN            PRE_COMMITTED    ``pre_commit`` returned None (it made the
                                     transaction durable itself)
    SEALED          PRE_COMMITTED    the durability step (uploader thread, before the
                                     ack; or inline before a commit / in DIRECT mode)
    OPEN            ABORTED          ``abort`` at ``close``
    PRE_COMMITTED   COMMITTED        ``commit`` (notify or restore)
    OPEN, SEALED,   FAILED           any hook or durability step raised; only a restore
    PRE_COMMITTED                    on a new writer resolves it
    ==============  ===============  ===================================================

    COMMITTED, ABORTED and FAILED are final. A sealed or pre-committed transaction is never
    aborted by the writer: it may belong to a completed checkpoint whose notification was lost.
    """

    OPEN = "open"
    SEALED = "sealed"
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
    _S.OPEN: frozenset({_S.SEALED, _S.PRE_COMMITTED, _S.ABORTED, _S.FAILED}),
    _S.SEALED: frozenset({_S.PRE_COMMITTED, _S.FAILED}),
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

    @classmethod
    def rescale(cls, states: dict[int, "TwoPhaseCommitState | None"], subtask: int,
                parallelism: int) -> "TwoPhaseCommitState":
        """The state new subtask ``subtask`` of ``parallelism`` restores when the checkpoint
        was taken with another parallelism (``states``: old subtask → its state).

        Old subtask ``j``'s pending transactions go to new subtask ``j % parallelism`` (as
        Flink's Kafka sink hands transactional ids over), which re-commits them in
        ``restore`` — commits are idempotent and a handle carries everything its commit
        needs, so any writer may commit it. Every new subtask resumes after the same
        restored epoch, the newest among ``states``.
        """
        present = {j: s for j, s in states.items() if s is not None}
        epoch = max((s.epoch for s in present.values()), default=0)
        pending = sorted((p for j, s in present.items() if j % parallelism == subtask for p in s.pending),
                         key=lambda p: p[0])
        return cls(epoch=epoch, pending=tuple(pending))


@dataclass
class Txn:
    epoch: int  # begin epoch until the barrier, then the checkpoint it belongs to
    handle: Any
    state: TransactionState = TransactionState.OPEN
    started: float = field(default_factory=time.monotonic)
    writes: int = 0
    step: Callable[[], None] | None = None  # the durability step while SEALED


class Writer(Protocol):
    """The part of :class:`~epochal.sinks.base.TwoPhaseCommitSink` the strategies below drive
    (task thread only): its transactions and the steps that advance one."""

    _open: Txn | None  # the open transaction
    _pending: list[Txn]  # sealed / pre-committed transactions, oldest first
    direct_publish_interval: float

    def begin_transaction(self, epoch: int) -> Any: ...
    def commit(self, handle: Any) -> None: ...
    def abort(self, handle: Any) -> None: ...
    def _call(self, hook: Callable, *args) -> Any: ...
    def _seal(self, txn: Txn) -> None: ...
    def _make_durable_here(self, txn: Txn, for_epoch: int) -> None: ...
    def _advance(self, txn: Txn, target: TransactionState, hook: Callable) -> None: ...


class CommitOnCompletion:
    """SinkMode.TRANSACTIONAL (exactly-once): publish an epoch only once its checkpoint is
    complete; output of rolled-back epochs is never visible. The barrier only seals; the
    durability step runs in the epoch's :meth:`~TwoPhaseCommitSink.durability_job`."""

    def at_barrier(self, w: Writer, txn: Txn) -> None:
        w._seal(txn)
        w._pending.append(txn)

    publishes_between_barriers = False

    def on_complete(self, w: Writer, epoch: int) -> None:
        while w._pending and w._pending[0].epoch <= epoch:
            w._make_durable_here(w._pending[0], epoch)  # no-op unless the job never ran (direct callers)
            w._advance(w._pending[0], TransactionState.COMMITTED, w.commit)
            w._pending.pop(0)

    def at_close(self, w: Writer, txn: Txn) -> None:
        w._advance(txn, TransactionState.ABORTED, w.abort)  # not part of any completed epoch


class PublishAtBarrier:
    """SinkMode.DIRECT (at-least-once): pre-commit and commit at every barrier, so output is
    visible without waiting for the checkpoint. Cannot guarantee: after a restore from epoch
    m, records of epochs > m that were already published are written again (duplicates).
    Assumes the runtime replays every record after m (no loss).

    The durability step runs inline on the task thread, right before the commit: the
    output is published at the barrier, so there is nothing to wait for, and each
    transaction is small (one is published at least every ``direct_publish_interval``)."""

    publishes_between_barriers = True

    def at_barrier(self, w: Writer, txn: Txn) -> None:
        w._seal(txn)
        w._make_durable_here(txn, txn.epoch)
        w._advance(txn, TransactionState.COMMITTED, w.commit)

    def after_write(self, w: Writer, txn: Txn, n: int = 1) -> None:
        """``n`` records were written: lower latency than the epoch: publish the open
        transaction once it is older than ``w.direct_publish_interval`` and continue the
        epoch in a new one. The clock is read once per 64 writes only (the per-record path
        stays cheap)."""
        before = txn.writes
        txn.writes = before + n
        if before >> 6 != txn.writes >> 6 and time.monotonic() - txn.started >= w.direct_publish_interval:
            self.at_barrier(w, txn)
            w._open = Txn(txn.epoch, w._call(w.begin_transaction, txn.epoch))

    def on_complete(self, w: Writer, epoch: int) -> None:
        pass  # already published at the barrier

    at_close = at_barrier  # records after the last barrier are published too


PROTOCOLS = {SinkMode.TRANSACTIONAL: CommitOnCompletion(), SinkMode.DIRECT: PublishAtBarrier()}
