"""Replayable sources: the author-facing interface of every input of a dataflow.

A source task's only state is its *read position* (seed 004, Alg. 5 and §4.1.3.1
"Regular Sources"): at each epoch barrier the task asks its reader for the offsets of the
next unread records and stores them with the epoch; on recovery a fresh reader is created
from those offsets and continues with exactly the next record. Inputs that cannot be
replayed from an offset (a UDP socket, seed 000 §3.1) cannot be sources here.

Two objects, two places:

* :class:`Source` lives on the driver. It is part of the (immutable) graph, computes its
  splits at plan time and is shipped to the tasks with cloudpickle.
* :class:`SourceReader` lives in one source task and is only ever touched by that task's
  thread: ``poll`` ... ``snapshot`` ... ``poll`` ... ``close``.

Example::

    >>> from epochal.sources import CollectionSource
    >>> src = CollectionSource(["a", "b", "c"])
    >>> reader = src.create_reader(src.splits(), None)
    >>> reader.poll(2).records
    ['a', 'b']
    >>> state = reader.snapshot()
    >>> src.create_reader(src.splits(), state).poll(10)
    Poll(records=['c'], finished=True, request_epoch=False, idle=False, split=0, split_finished=True)
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from epochal.errors import PipelineDefinitionError

__all__ = ["Poll", "Source", "SourceReader"]


@dataclass(frozen=True, slots=True)
class Poll:
    """The answer of one :meth:`SourceReader.poll`.

    Attributes:
        records: the records read, in input order (possibly empty).
        finished: no more records, ever (bounded input exhausted). The task emits
            ``records`` and then never polls this reader again.
        request_epoch: the source asks for an epoch boundary right after ``records``
            (operator-driven trigger, seed 000 §3.1; e.g. after each file). The engine
            forwards the request to the coordinator; the boundary is a hint, not a promise
            that no other barrier falls in between.
        idle: no data right now (e.g. rate limited or waiting for new files); the task
            may wait briefly before polling again. Never set together with records.
        split: the split every one of ``records`` comes from, when the reader knows (``None``:
            unknown or several). A ``with_watermarks`` chained to the source then tracks
            event time per split (Flink's per-split watermarks): the subtask's watermark is
            the minimum over its splits, so reading one split ahead of another makes nobody
            late.
        split_finished: ``split`` has no more records (it stops holding event time back).
    """

    records: list
    finished: bool = False
    request_epoch: bool = False
    idle: bool = False
    split: object = None
    split_finished: bool = False


class SourceReader(ABC):
    """Reads the splits assigned to one source subtask; created inside the task.

    Every method is called on the task's own thread, never concurrently. The reader owns
    no epoch logic: the task calls :meth:`snapshot` when a barrier arrives.
    """

    @abstractmethod
    def poll(self, max_records: int) -> Poll:
        """Read up to ``max_records`` (>= 1) records without blocking for long.

        Must never return more than ``max_records`` records, and must never return a
        record twice or skip one, across polls and across snapshot/restore.
        """

    @abstractmethod
    def snapshot(self) -> dict:
        """The offsets of the next unread record of every split of this reader.

        Called on the task thread exactly at an epoch barrier, between two polls: every
        record returned by earlier polls belongs to the epoch, nothing later does. A
        reader created from the returned state continues with exactly the next record.

        The state is made of plain dicts / lists / ints / strs, survives a JSON round
        trip (dict keys are strings), and is keyed by split, so the states of different
        subtasks have disjoint keys and may be merged (dict union) when the engine
        redistributes splits. It must be a fresh object: later polls must not mutate it.
        """

    def notify_epoch_complete(self, epoch: int, offsets: dict) -> None:
        """Checkpoint ``epoch`` is durable; ``offsets`` is what :meth:`snapshot` returned at
        its barrier, so the job never reads before them again. For side effects outside the
        protocol only (e.g. committing Kafka consumer-group offsets for lag monitoring), never
        a source of truth. Called on the task thread, possibly late or never (aborted
        epochs; a later epoch's call covers them). Default: nothing."""

    def close(self) -> None:
        """Release files and connections. Idempotent; the reader is not used afterwards."""


class Source(ABC):
    """A replayable input, described on the driver and read by source tasks.

    Must be picklable with cloudpickle (it is shipped to every source task) and cheap to
    ship: keep handles (open files, clients) out of it, create them in the reader.
    """

    @property
    def name(self) -> str:
        """A short human-readable name used in error messages."""
        return type(self).__name__

    @property
    def schema(self):
        """A ``pyarrow.Schema`` when the source produces Arrow batches (every record a poll
        returns is one ``pyarrow.RecordBatch``: a columnar stream); ``None`` for records."""
        return None

    def locations(self) -> tuple[str, ...]:
        """The storage URLs or paths this source reads (directories, logs); none by default.

        Called on the driver: on a cluster every one of them must be visible from every host
        (``s3://``, or a path declared in ``ClusterConfig.shared_paths``).
        """
        return ()

    @abstractmethod
    def splits(self) -> list:
        """The deterministic list of picklable split descriptors (ints, file paths, ...).

        Called on the driver at plan time, before the source is shipped. The engine
        assigns split ``i`` to subtask ``i % parallelism``. Calling it again on the
        same object must return the same list, so restarts see the same assignment.
        """

    @abstractmethod
    def create_reader(
        self,
        splits: list,
        state: dict | None,
        *,
        subtask: int = 0,
        parallelism: int = 1,
    ) -> SourceReader:
        """A reader over ``splits`` (the splits assigned to this subtask), created in the task.

        Args:
            splits: the descriptors assigned to this subtask, in :meth:`splits` order.
            state: ``None`` on a fresh start; otherwise a state returned by
                :meth:`SourceReader.snapshot` (or the union of several subtasks' states).
                A reader takes only the entries of the splits it owns.
            subtask, parallelism: passed by the engine; sources that discover new input
                at run time (a monitored directory) use them to assign it stably.
        """


def check_max_records(max_records: int, source: str) -> None:
    """Reject a non-positive poll size (an engine bug, never a user error)."""
    if not isinstance(max_records, int) or max_records < 1:
        raise ValueError(f"{source}: poll(max_records) needs an integer >= 1, got {max_records!r}")


def check_positive_int(value, key: str, source: str, *, minimum: int = 1) -> int:
    """Validate a constructor argument at graph-build time."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise PipelineDefinitionError(f"{source}: {key} must be an integer >= {minimum}, got {value!r}")
    return value
