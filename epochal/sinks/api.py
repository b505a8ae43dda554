"""What a sink is to the graph and the runtime: the user-facing :class:`Sink` (its
configuration, checked and claimed on the driver), the per-task :class:`SinkWriter` the
runtime drives, the :class:`SinkContext` a writer runs in, and the errors a sink raises.
The epoch two-phase commit on top of them is :class:`epochal.sinks.base.TwoPhaseCommitSink`.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from epochal.alignment.factory import SinkMode
from epochal.epochs.lineage import LEGACY, Lineage
from epochal.errors import EpochalError

_REPR_LIMIT = 200

log = logging.getLogger("epochal")


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


@dataclass(frozen=True)
class SinkContext:
    """Where a writer runs: one physical sink task of one attempt of a job.

    ``generation`` grows with every restart (the coordinator's attempt counter); writers use
    it to keep a zombie of an older attempt from colliding with the current one. ``mode``
    is decided by :mod:`epochal.alignment.factory`; sinks never read the guarantee.
    ``lineage`` names the run (:mod:`epochal.epochs.lineage`): every recovery record a
    writer leaves in an external system names it, and a restored transaction is looked up
    under the lineage that wrote it, never under the current one.
    """

    sink_name: str
    subtask: int
    parallelism: int
    job: str
    generation: int
    mode: SinkMode
    #: the run this writer belongs to (:mod:`epochal.epochs.lineage`); None only where a
    #: writer is built by hand (tests): then recovery records carry the legacy lineage ""
    lineage: Lineage | None = None

    @property
    def lineage_id(self) -> str:
        """This run's lineage id, for naming recovery records ("" without a lineage)."""
        return self.lineage.id if self.lineage is not None else LEGACY


class Sink(ABC):
    """User-facing sink configuration, part of the graph (must pickle with cloudpickle).

    Building a sink opens nothing; the runtime calls :meth:`create_writer` once per
    physical task and attempt.
    """

    #: Whether one subtask's writer may be restored alone while the sink's other subtasks
    #: keep writing (a failover region restarting, :mod:`epochal.runtime.driver.failover`):
    #: its ``restore`` and ``cleanup_orphans`` touch only this subtask's own transactions
    #: and staged output (and, after a rescale, those of the subtasks it absorbs), never
    #: what another live subtask pre-committed. ``False`` (the default, safe for any sink):
    #: a failure restarts every task of the region.
    local_recovery: bool = False

    @abstractmethod
    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        """A fresh writer for the task described by ``ctx``."""

    def locations(self) -> tuple[str, ...]:
        """The storage URLs or paths this sink writes; none by default.

        Called on the driver: on a cluster every one of them must be visible from every host
        (``s3://``, or a path declared in ``ClusterConfig.shared_paths``).
        """
        return ()

    def exclusive_locations(self) -> tuple[str, ...]:
        """Locations (normalised URLs or absolute paths) no other sink may write, not even
        below or above them: two sinks there would overwrite each other's output. Checked
        when the dataflow is planned. None by default."""
        return ()

    def hold(self, job: str, sink: str):
        """On the driver, first of all: make sure no other run writes this sink's target now,
        and keep it so while the job runs (one writer per target). Return an object whose
        ``release()`` the driver calls when the job ends (any path), or None (the default:
        the target needs no guard beyond the job's lease in its checkpoint storage).

        Raises:
            ConfigError: another run holds the target, naming it.
        """
        return None

    def claim(self, job: str, sink: str, resume: bool) -> None:
        """On the driver, before the job starts: make sure this sink may write its
        output (e.g. no other job owns the directory) and record that job ``job``'s sink
        ``sink`` does. ``resume``: the job continues from its checkpoints. Default: nothing.

        Raises:
            ConfigError: naming the location and what to do.
        """


    def lingering(self, job: str, sink: str, promised) -> list:
        """While the job is not running: what runs of ``job``'s sink ``sink`` left open in the
        external system (:class:`~epochal.sinks.lingering.Lingering` items), each marked
        ``promised`` if ``promised`` (:class:`~epochal.sinks.lingering.Promised`, the latest
        completed checkpoint) still needs it. Default: nothing (the sink leaves nothing open)."""
        return []

    def end_lingering(self, job: str, sink: str, items: list, promised) -> None:
        """End ``items`` (from :meth:`lingering`, none promised): abort or roll them back.
        Must never touch what ``promised`` needs. Default: nothing."""

    def check_run(self, sink: str, checkpoint, mode: SinkMode) -> None:
        """On the driver, after :meth:`claim`, before the job starts: refuse a run this sink
        cannot keep its guarantee in — a :class:`~epochal.config.CheckpointConfig` (e.g. a
        transaction timeout shorter than an epoch) or a system that lacks what ``mode``
        needs (e.g. prepared transactions). ``sink``: the operator name. Default: nothing.

        Raises:
            ConfigError: naming the sink, the settings and what to do.
        """


class SinkWriter(ABC):
    """Per-task writer driven by the runtime on the task thread, in this order:

    1. ``restore(state_or_None)`` exactly once (``None`` on a fresh start);
    2. ``write(record)`` for every record of epoch n (between barriers n-1 and n);
    3. ``snapshot(n)`` at barrier n: the synchronous part of the task snapshot; the picklable
       result is stored in checkpoint n;
    3a. ``durability_job(n)`` right after ``snapshot(n)``: the asynchronous part of that
       snapshot, if any. The runtime runs the returned callable on the task's uploader
       thread and acknowledges epoch n only after it returned; if it raises, epoch n is
       declined. Checkpoint n (the state of ``snapshot(n)``) may complete only after it ran;
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

    def write_many(self, records: list) -> None:
        """Write records of the current epoch, in order: what ``write`` for each does (the
        default), possibly faster. The sink operator calls it once per batch. Raises
        :class:`SinkWriteError` naming the first record that cannot be written; the records
        before it were written."""
        write = self.write
        for record in records:
            write(record)

    def write_batch(self, batch) -> None:
        """Write every row of a ``pyarrow.RecordBatch`` (a stream of Arrow batches), as
        :meth:`write` of one dict per row unless the writer has a faster way."""
        for row in batch.to_pylist():
            self.write(row)

    @abstractmethod
    def snapshot(self, epoch: int) -> Any:
        """Barrier ``epoch`` reached: return picklable state for checkpoint ``epoch``."""

    def durability_job(self, epoch: int) -> Callable[[], None] | None:
        """The asynchronous part of ``snapshot(epoch)`` (task thread, right after it), or
        None (the default: ``snapshot`` did everything). See
        :class:`~epochal.operators.base.SnapshotResult` for the job's contract."""
        return None

    @abstractmethod
    def notify_epoch_complete(self, epoch: int) -> None:
        """Checkpoint ``epoch`` is durable; late and repeated calls must be harmless."""

    @abstractmethod
    def close(self) -> None:
        """Clean end of the task; release resources."""

    def release(self) -> None:
        """The task ends, after :meth:`close` or instead of it (a failure, a cancel): close
        every client and connection to external systems without publishing anything; what
        a completed checkpoint promised is re-committed by the next writer's ``restore``.
        Called on every path, possibly more than once; never raises. Default: nothing."""
