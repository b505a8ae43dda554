"""The runtime operator contract: what a task calls, when, and what it must never see.

A physical task runs a *chain* of runtime operators (forward-connected operators with
equal parallelism, DESIGN.md "graph"). Records travel through the chain a batch at a
time: ``process_batch`` takes a list and returns the list of outputs, which keeps the
per-record Python overhead to the user's function call itself.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from epochal.errors import OperatorError


@dataclass(frozen=True)
class OperatorContext:
    """What an operator learns about where it runs.

    Attributes:
        operator: the operator's stable name (keys its state).
        task: the physical task id, e.g. ``"count[1]"``.
        subtask: index of this parallel instance, ``0 <= subtask < parallelism``.
        parallelism: number of parallel instances of the operator.
        generation: the job attempt (0 for the first run, +1 per restart).
        job: the dataflow's name.
        max_parallelism: number of key groups.
        keyed_backend: the task's keyed state backend (``None`` for non-keyed operators).
        key_groups: the key groups this subtask owns.
        extras: launcher-provided objects (e.g. the sink mode), keyed by name.
    """

    operator: str
    task: str
    subtask: int
    parallelism: int
    generation: int
    job: str
    max_parallelism: int
    keyed_backend: Any = None
    key_groups: range = range(0)
    extras: dict | None = None


class DeadLetter(NamedTuple):
    """A record a user function failed on, in an operator's ``dead_letters()`` output (like
    a Kafka dead-letter queue): the operator's name, the error, and the record itself."""

    operator: str
    error: str
    record: Any


@dataclass(frozen=True)
class SnapshotResult:
    """What :meth:`RuntimeOperator.snapshot` returns when its snapshot has an asynchronous
    part (seed 004 §4.5.1: only the synchronous part runs at the barrier).

    Attributes:
        state: the picklable operator state stored in the checkpoint, exactly as a plain
            return value of ``snapshot`` would be (``None``: nothing to store).
        before_ack: the asynchronous part, a callable without arguments. Contract:

            * **When.** Called exactly once, after ``snapshot`` returned and before the task
              acknowledges the epoch to the coordinator; the task's jobs run one at a time,
              in epoch order, and ``state`` is serialised only after ``before_ack`` returned
              (so it may complete the handles in ``state``).
            * **Where.** On the task's uploader thread
              (:class:`~epochal.runtime.task.snapshots.Uploader`), *concurrently* with the task
              thread, which keeps calling ``process_batch`` and later ``snapshot`` on the
              same operator. So it must only touch what ``snapshot`` handed over to it, never
              anything the task thread still uses (the operator's live transaction, buffers,
              counters). It must not call back into the operator.
            * **Failure.** If it raises, the task declines the epoch, exactly like a failed
              state upload; the task keeps running. The operator must make sure that no
              later epoch can be acknowledged on top of lost work (a sink's later jobs fail
              too, and its next ``snapshot`` raises, so the task restarts).
            * **Crash.** The process may die while it runs: the epoch was not acknowledged,
              so recovery restores an earlier completed epoch.
    """

    state: Any
    before_ack: Callable[[], None]


class RuntimeOperator(ABC):
    """One operator instance inside a task; called only from the task's main thread.

    Call order: ``restore(state)`` once (``state`` is ``None`` on a fresh start), then any
    number of ``process_batch``; at each epoch barrier ``snapshot(epoch)`` after every
    record of that epoch was processed and before any record of the next; at any time
    later ``notify_epoch_complete(epoch)`` (possibly late, repeated, or skipped for
    aborted epochs); ``close()`` once at a clean end; ``release()`` once when the task
    ends, cleanly or not. After a failure the instance is discarded — it is never restored
    twice.
    """

    def __init__(self, ctx: OperatorContext):
        self.ctx = ctx

    def restore(self, state: Any) -> None:
        """Load the operator state snapshotted at the restored epoch (``None``: fresh)."""

    @abstractmethod
    def process_batch(self, records: list) -> list:
        """Process records in order and return the outputs in order."""

    def snapshot(self, epoch: int) -> Any:
        """Synchronous part of the snapshot of ``epoch``; returns picklable state or None,
        or a :class:`SnapshotResult` when work remains for the uploader thread before the
        epoch may be acknowledged (e.g. a sink's fsync).

        Runs on the task thread while records wait, so it must be quick. Keyed state is
        snapshotted by the task's backend, not here.
        """
        return None

    def notify_epoch_complete(self, epoch: int) -> None:
        """Epoch ``epoch`` is durable (its checkpoint metadata is written)."""

    def prepare_snapshot_pre_barrier(self, epoch: int) -> list:
        """The barrier of ``epoch`` is about to pass (before any operator of the task
        snapshots): records returned here go through the rest of the chain and downstream
        ahead of the barrier, so they belong to ``epoch`` (Flink's
        ``prepareSnapshotPreBarrier``; e.g. a mini-batch aggregation's updates). Task thread."""
        return []

    def select_input(self, index: int) -> None:
        """Operators with several logical inputs (``connect``, :mod:`epochal.coprocess`): the
        next ``process_batch`` holds records of input ``index`` only (the position of the edge
        in the node's ``inputs``). Called by the task on the task thread before every batch
        read from an input channel or replayed from one's checkpointed state, only for a
        chain's first operator that overrides it. Default: ignored."""

    def bind_input_channels(self, inputs: list[int]) -> None:
        """With :meth:`select_input`: once before any record, the input index of each of the
        task's input channels (by channel position). Default: ignored."""

    def input_watermark(self, channel: int, watermark: int, idle: bool) -> None:
        """With :meth:`select_input`: a watermark message of input channel ``channel``, before
        the task's combined event time (:meth:`on_watermark`) moves. Lets an operator keep
        each input's own event time (the joins decide lateness per input). Default: ignored."""

    # -- time (epochal.time) ---------------------------------------------------------------
    #: the operator replaces upstream watermarks by its own (``with_watermarks``): the task
    #: asks it with :meth:`emit_watermark` after each batch instead of passing watermarks on
    generates_watermarks = False

    def on_watermark(self, watermark: int) -> list:
        """Event time reached ``watermark`` (µs): every record before it in this task's
        input was processed, none after. Called on the task thread with non-decreasing
        values (repeats possible: must be idempotent); returns output records (e.g. fired windows),
        which the task passes to the rest of the chain *before* the watermark."""
        return []

    def bind_source_splits(self, splits: list) -> None:
        """The first operator chained after a source learns the source splits its task
        reads (``with_watermarks`` keeps per-split event time). Default: ignored."""

    def set_input_split(self, split, finished: bool) -> None:
        """The next ``process_batch`` of the first operator after a source holds records of
        ``split`` only (``Poll.split``; ``None``: the source does not say); ``finished``: the
        split's last ones. Default: ignored."""

    def emit_watermark(self):
        """Generators only: the :class:`~epochal.time.watermarks.WatermarkChange` to send
        after the latest batch, or ``None``."""
        return None

    def next_processing_time(self) -> int | None:
        """The wall-clock time (µs) at which :meth:`on_processing_time` is due, if any;
        asked by the task loop before it waits, so it must be cheap."""
        return None

    def on_processing_time(self, now: int) -> list:
        """Processing-time timers due at ``now`` (µs) fire; returns output records."""
        return []

    #: records for side outputs (``{port: [records]}``) produced since the task last took
    #: them; ``None`` for operators without side outputs (e.g. a window's late records)
    side_output: dict | None = None

    def close(self) -> None:
        """Clean end of input: flush and release resources."""

    def release(self) -> None:
        """The task ends — after ``close`` on a clean end, instead of it after a failure or a
        cancel: give back what outlives the process otherwise (connections, clients, open
        external transactions). Must not raise; must not publish anything."""

    def enable_dead_letters(self) -> None:
        """Operator option ``dead_letters=True``: :meth:`reject` keeps the job running."""
        self.side_output = dict(self.side_output or {}, dead_letters=[])

    def reject(self, record: Any, exc: Exception) -> None:
        """``record`` made the user's function raise ``exc``: put a :class:`DeadLetter` in
        the ``"dead_letters"`` side output if the operator has one, else raise the
        :class:`~epochal.errors.OperatorError` that fails the job naming operator and record.
        Effects the function had before it raised (state it wrote) stay."""
        side = self.side_output
        if side is not None and "dead_letters" in side:
            side["dead_letters"].append(DeadLetter(self.ctx.operator, f"{type(exc).__name__}: {exc}", record))
            return
        raise self.fail(record, exc) from exc

    def fail(self, record: Any, exc: BaseException) -> OperatorError:
        """Build the error that names this operator and the offending record."""
        text = repr(record)
        if len(text) > 200:
            text = text[:197] + "..."
        return OperatorError(self.ctx.operator, self.ctx.task, text, f"{type(exc).__name__}: {exc}")
