"""Epoch lifecycle value objects: ``PendingEpoch`` → ``CompletedEpoch`` | ``AbortedEpoch``.

The driver-side half of the epoch commit protocol (seed 004 §4.1.3): a ``PendingEpoch``
is the prepare phase of one epoch — it collects one "prepared" acknowledgment (1c) per
task; once every task acknowledged, it turns into an immutable ``CompletedEpoch`` and the
commit phase (2a) may begin. A partial error (a task declines) or the global timeout turns
it into an immutable ``AbortedEpoch`` instead.

Modelled on Flink's ``PendingCheckpoint`` / ``CompletedCheckpoint``: outcomes are enums,
never bools. The legal transitions are the table in :mod:`epochal.epochs.coordinator`;
``PendingEpoch.complete`` and ``PendingEpoch.abort`` enforce it and raise
:class:`IllegalEpochTransition` otherwise. Everything here is pure: no clocks, no I/O —
times are passed in.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from epochal.errors import EpochalError


class IllegalEpochTransition(EpochalError, RuntimeError):
    """An epoch was asked to make a transition its lifecycle table forbids
    (e.g. completing an aborted epoch, or completing before every task acknowledged)."""


class EpochState(enum.Enum):
    """Lifecycle of one epoch on the coordinator (see the table in ``coordinator``)."""

    PENDING = "pending"
    COMPLETED = "completed"
    ABORTED = "aborted"


class TriggerReason(enum.Enum):
    """Why an epoch was triggered (seed 000 §3.1: *periodic* vs *operator-driven* triggers;
    seed 004 §4.1.3: "periodically ... or as an adhoc request from the user")."""

    PERIODIC = "periodic"
    MANUAL = "manual"
    SOURCE_REQUEST = "source-request"
    FINAL = "final"


class AckOutcome(enum.Enum):
    """How a task's acknowledgment (or decline) was treated — Flink's
    ``TaskAcknowledgeResult``."""

    SUCCESS = "success"
    """Recorded: the task had not yet acknowledged this pending epoch."""
    DUPLICATE = "duplicate"
    """Ignored: the task already acknowledged this epoch (the first payload is kept)."""
    UNKNOWN_TASK = "unknown-task"
    """Ignored: the task is not one of the epoch's (job's) tasks."""
    DISCARDED = "discarded"
    """Ignored: the epoch is no longer (or was never) pending — completed, aborted, or a
    late message from an older attempt."""


class AbortReason(enum.Enum):
    """Why an epoch was aborted (Flink's ``CheckpointFailureReason``, reduced)."""

    TIMEOUT = "timeout"
    """Not fully acknowledged within ``CheckpointConfig.timeout``. Counts as a failure."""
    DECLINED = "declined"
    """A task declined the epoch (its snapshot failed). Counts as a failure."""
    SUBSUMED = "subsumed"
    """Made obsolete by a newer completed epoch. Never produced by ``EpochCoordinator``:
    it completes epochs strictly in order, so an older pending epoch blocks newer ones
    instead of being subsumed by them. Kept for storage retention and callers that drop
    superseded epochs. Does not count as a failure."""
    JOB_FAILED = "job-failed"
    """The job failed (a task crashed) while the epoch was pending; the job restarts from
    the latest completed epoch (seed 004 §4.1.3.1). Does not count as a checkpoint failure."""

    @property
    def counts_as_failure(self) -> bool:
        """True for reasons that consume the ``tolerable_failures`` budget."""
        return self in (AbortReason.TIMEOUT, AbortReason.DECLINED)


def _frozen_payload(payload: Mapping | None) -> Mapping:
    return MappingProxyType(dict(payload or {}))


@dataclass(frozen=True, slots=True)
class CompletedEpoch:
    """An epoch every task acknowledged: its snapshot is consistent and may be committed.

    Attributes:
        epoch: the epoch (checkpoint) id.
        trigger_time: ``now`` when it was triggered.
        completion_time: ``now`` of the call that completed it (in-order completion may
            make this later than the last acknowledgment — see ``coordinator``).
        acks: task id → the task's opaque ack payload (read-only; e.g. state handles).
        reason: why it was triggered; ``FINAL`` marks the job's last epoch.
    """

    epoch: int
    trigger_time: float
    completion_time: float
    acks: Mapping[str, Mapping]
    reason: TriggerReason

    @property
    def duration(self) -> float:
        """Seconds from trigger to completion."""
        return self.completion_time - self.trigger_time

    @property
    def is_final(self) -> bool:
        return self.reason is TriggerReason.FINAL


@dataclass(frozen=True, slots=True)
class AbortedEpoch:
    """An epoch that will never complete; its pre-committed side effects must be rolled
    back (seed 004 §4.1.3: "If an instance gets aborted ... the system rolls-back all
    pre-committed changes").

    Attributes:
        epoch, trigger_time, trigger_reason: as on the pending epoch.
        abort_time: ``now`` of the call that aborted it.
        reason: why it was aborted.
        detail: human-readable cause (which task declined and why, how long it waited).
    """

    epoch: int
    trigger_time: float
    abort_time: float
    reason: AbortReason
    detail: str
    trigger_reason: TriggerReason


# The executable form of the lifecycle table in ``coordinator``'s docstring.
_LEGAL: Mapping[tuple[EpochState, str], EpochState] = MappingProxyType({
    (EpochState.PENDING, "acknowledge"): EpochState.PENDING,
    (EpochState.PENDING, "complete"): EpochState.COMPLETED,
    (EpochState.PENDING, "abort"): EpochState.ABORTED,
    (EpochState.PENDING, "retract"): EpochState.PENDING,
})


class PendingEpoch:
    """One triggered epoch collecting acknowledgments (prepare phase, seed 004 §4.1.3).

    Identity fields (``epoch``, ``trigger_time``, ``reason``, ``tasks``) are fixed at
    construction; only the ack bookkeeping, ``state`` and ``timeout_from`` change, and only
    through :meth:`acknowledge`, :meth:`retract`, :meth:`complete`, :meth:`abort` and
    :meth:`restart_timeout`.

    >>> p = PendingEpoch(3, 10.0, TriggerReason.PERIODIC, ["a", "b"])
    >>> [o.name for o in (p.acknowledge("a", {"h": 1}), p.acknowledge("a"), p.acknowledge("z"))]
    ['SUCCESS', 'DUPLICATE', 'UNKNOWN_TASK']
    >>> p.is_fully_acknowledged, sorted(p.not_yet_acknowledged)
    (False, ['b'])
    """

    __slots__ = ("_epoch", "_trigger_time", "_reason", "_tasks", "_acks", "_state", "_timeout_from")

    def __init__(self, epoch: int, trigger_time: float, reason: TriggerReason,
                 tasks: Iterable[str]):
        tasks = frozenset(tasks)
        if not tasks:
            raise ValueError(f"epoch {epoch}: an epoch needs at least one task to acknowledge it")
        self._epoch = epoch
        self._trigger_time = trigger_time
        self._timeout_from = trigger_time
        self._reason = reason
        self._tasks = tasks
        self._acks: dict[str, Mapping] = {}
        self._state = EpochState.PENDING

    def __repr__(self) -> str:
        return (f"PendingEpoch(epoch={self._epoch}, reason={self._reason.name}, "
                f"state={self._state.name}, acked={len(self._acks)}/{len(self._tasks)})")

    # -- identity -----------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def trigger_time(self) -> float:
        return self._trigger_time

    @property
    def timeout_from(self) -> float:
        """When its ``checkpoint.timeout`` started counting: its trigger, or the latest
        rejoin of a failover region restarted while it was pending (:meth:`restart_timeout`)."""
        return self._timeout_from

    def restart_timeout(self, now: float) -> None:
        """A failover region rejoined and is triggered for this epoch again: its timeout
        counts from ``now`` (never earlier than before). Idempotent."""
        self._timeout_from = max(self._timeout_from, now)

    @property
    def reason(self) -> TriggerReason:
        return self._reason

    @property
    def tasks(self) -> frozenset[str]:
        """Every task that must acknowledge this epoch."""
        return self._tasks

    # -- queries ------------------------------------------------------------------------
    @property
    def state(self) -> EpochState:
        return self._state

    @property
    def acks(self) -> Mapping[str, Mapping]:
        """Read-only view of task id → ack payload collected so far."""
        return MappingProxyType(self._acks)

    @property
    def not_yet_acknowledged(self) -> frozenset[str]:
        """Tasks whose acknowledgment is still missing."""
        return self._tasks.difference(self._acks)

    @property
    def is_fully_acknowledged(self) -> bool:
        return len(self._acks) == len(self._tasks)

    @property
    def is_disposed(self) -> bool:
        """True once completed or aborted; later acknowledgments are ``DISCARDED``."""
        return self._state is not EpochState.PENDING

    # -- transitions --------------------------------------------------------------------
    def acknowledge(self, task: str, payload: Mapping | None = None) -> AckOutcome:
        """Record ``task``'s "prepared" acknowledgment with its opaque payload.

        Never raises for late, duplicate or foreign messages: those are normal in a
        distributed run and reported as the returned outcome. The payload is copied
        (shallowly) and frozen; the first payload of a task wins.
        """
        if self.is_disposed:
            return AckOutcome.DISCARDED
        if task not in self._tasks:
            return AckOutcome.UNKNOWN_TASK
        if task in self._acks:
            return AckOutcome.DUPLICATE
        self._acks[task] = _frozen_payload(payload)
        return AckOutcome.SUCCESS

    def retract(self, task: str) -> bool:
        """Forget ``task``'s acknowledgment (PENDING → PENDING): the task was restarted alone
        (a failover region, :mod:`epochal.runtime.driver.failover`), so the snapshot it
        acknowledged belongs to an incarnation that is gone; its new incarnation acknowledges
        the epoch again. Returns whether an acknowledgment was dropped. Raises
        :class:`IllegalEpochTransition` unless pending (a disposed epoch is never changed)."""
        self._transition("retract")
        return self._acks.pop(task, None) is not None

    def complete(self, now: float) -> CompletedEpoch:
        """PENDING → COMPLETED. Raises :class:`IllegalEpochTransition` unless pending and
        fully acknowledged."""
        self._transition("complete")
        if not self.is_fully_acknowledged:
            raise IllegalEpochTransition(
                f"epoch {self.epoch}: cannot complete, still waiting for acknowledgments "
                f"from {sorted(self.not_yet_acknowledged)}")
        self._state = EpochState.COMPLETED
        return CompletedEpoch(self._epoch, self._trigger_time, now,
                              MappingProxyType(dict(self._acks)), self._reason)

    def abort(self, reason: AbortReason, detail: str, now: float) -> AbortedEpoch:
        """PENDING → ABORTED. Raises :class:`IllegalEpochTransition` unless pending."""
        self._transition("abort")
        self._state = EpochState.ABORTED
        return AbortedEpoch(self._epoch, self._trigger_time, now, reason, detail, self._reason)

    def _transition(self, event: str) -> None:
        if (self._state, event) not in _LEGAL:
            raise IllegalEpochTransition(
                f"epoch {self.epoch}: illegal transition {event!r} from state "
                f"{self._state.name} (legal: PENDING → COMPLETED | ABORTED, once)")
