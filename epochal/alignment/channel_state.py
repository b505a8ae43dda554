"""Channel state: the in-flight records of epochs whose snapshot is already taken.

A snapshot taken before barrier n reached the task on every input (an unaligned snapshot,
:mod:`epochal.alignment.unaligned`; a loop head's, whose barrier still circulates the loop,
seed 004 Alg. 7) is complete only with the records that precede barrier n but were not
processed when it was taken — the messages in transit of a Chandy-Lamport snapshot. The
:class:`ChannelStateRecorder` collects them per epoch and per channel:

* ``start(epoch, upload, waiting)`` — the snapshot of ``epoch`` was taken; its upload is
  held until no channel in ``waiting`` owes records any more;
* ``on_records(channel, records, marks)`` — the task processed ``records`` (``marks`` of
  them watermarks) from ``channel``: they go into the log of every open epoch still
  waiting on that channel;
* ``capture(epoch, channel, records)`` — ``channel`` owes ``epoch`` nothing beyond
  ``records`` (the data still queued before its barrier; empty when the barrier was
  reached in order): appended, and the channel is done for that epoch.

When an epoch's channels are all done, its upload is released with the logs attached (in
epoch order, as the loop head's were), and the uploader persists each log as a loop log is
persisted (:meth:`~epochal.loops.log.InTransitLog.persist`: memory-bounded, spilled to
local disk, uploaded as the checkpoint's state files). A restore replays them before any
new input (:func:`~epochal.loops.log.replay`, seed 004 §4.1.3.1).

Logs are kept per *log key* — the channel's id for unaligned inputs (a rescaled restore
re-routes each channel's records by that channel's partitioning), one shared key for a loop
head's feedback channels (its in-transit log, restored as before). Pure bookkeeping: no
threads, no I/O except the logs' own spill files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable

from epochal.loops.log import DEFAULT_MEMORY_BYTES, InTransitLog
from epochal.time.watermarks import WatermarkMark

__all__ = ["ChannelStateRecorder"]


@dataclass
class _Recording:
    epoch: int
    upload: object  # runtime.task.snapshots.PendingUpload, held until its channel state is complete
    waiting: set[int]
    logs: dict = field(default_factory=dict)  # log key -> InTransitLog
    counts: dict = field(default_factory=dict)  # log key -> records (also those not kept)
    marks: int = 0  # of which watermarks (queued among the records of unaligned inputs)


class ChannelStateRecorder:
    """Collects the channel state of the epochs snapshotted before their barriers arrived
    everywhere (see the module docstring). Called on the task thread only.

    Args:
        log_key: channel index → the key of the log its records go to.
        memory_records: in-memory bound of each log in records (spills beyond it).
        memory_bytes: in-memory bound of each log in bytes of pickled records (spills beyond
            it; ``ChannelConfig.log_memory_bytes``).
        attach: called as ``attach(upload, logs, counts, marks)`` when an epoch is
            complete, to hand its logs (``{log key: InTransitLog}``), the entries per log
            key (records and watermarks) and how many of them are watermarks to the upload.
        discard: log keys whose records are counted but not kept — only in tests that
            prove the log is what keeps in-flight records (``epochal.testing.DisableLoopLog``).
    """

    def __init__(self, log_key: Callable[[int], Hashable], attach: Callable[[object, dict, dict, int], None],
                 memory_records: int = 100_000, discard: frozenset = frozenset(),
                 memory_bytes: int = DEFAULT_MEMORY_BYTES):
        self.log_key = log_key
        self.attach = attach
        self.memory_records = memory_records
        self.memory_bytes = memory_bytes
        self.discard = discard
        self._open: list[_Recording] = []  # epoch order

    @property
    def recording(self) -> bool:
        """Some epoch is collecting channel state (the task must feed it records)."""
        return bool(self._open)

    @property
    def epochs(self) -> list[int]:
        """Epochs whose channel state is still being collected, oldest first."""
        return [r.epoch for r in self._open]

    def waiting_on(self, epoch: int) -> frozenset[int]:
        for rec in self._open:
            if rec.epoch == epoch:
                return frozenset(rec.waiting)
        return frozenset()

    def start(self, epoch: int, upload, waiting: Iterable[int]) -> list:
        """The snapshot of ``epoch`` was taken; collect from ``waiting`` before releasing
        ``upload``. Returns the uploads now complete (this one if ``waiting`` is empty
        and no older epoch is still open)."""
        self._open.append(_Recording(epoch, upload, set(waiting)))
        self._open.sort(key=lambda r: r.epoch)
        return self._complete()

    def on_records(self, channel: int, records: list, marks: int = 0) -> list[int]:
        """``records`` were processed from ``channel``: log them into every open epoch still
        waiting on it; returns those epochs. ``marks``: how many of ``records`` are
        watermarks (:class:`WatermarkMark`) — the caller knows, so a batch is never scanned
        on the record path."""
        logged = []
        for rec in self._open:
            if channel in rec.waiting:
                self._append(rec, channel, records, marks)
                logged.append(rec.epoch)
        return logged

    def capture(self, epoch: int, channel: int, records: list) -> list:
        """``channel`` owes ``epoch`` exactly ``records`` more; it is done for ``epoch``.
        Returns the uploads now complete. ``records`` (taken from the queue once per
        channel and epoch) may hold watermarks among them; they are counted here."""
        marks = sum(type(r) is WatermarkMark for r in records)
        for rec in self._open:
            if rec.epoch == epoch and channel in rec.waiting:
                if records:
                    self._append(rec, channel, records, marks)
                rec.waiting.discard(channel)
        return self._complete()

    def done(self, epoch: int, channel: int) -> list:
        """``channel`` owes ``epoch`` nothing more (a loop head's barrier came back)."""
        return self.capture(epoch, channel, [])

    def drop(self, epoch: int) -> None:
        """Give up ``epoch`` (aborted, or a channel skipped its barrier): discard its logs
        and release its held snapshot."""
        for rec in list(self._open):
            if rec.epoch == epoch:
                self._release(rec)

    def close(self) -> None:
        for rec in list(self._open):
            self._release(rec)

    def _append(self, rec: _Recording, channel: int, records: list, marks: int) -> None:
        key = self.log_key(channel)
        rec.counts[key] = rec.counts.get(key, 0) + len(records)
        rec.marks += marks
        if key in self.discard:
            return
        log = rec.logs.get(key)
        if log is None:
            log = rec.logs[key] = InTransitLog(self.memory_records, self.memory_bytes)
        log.append(records)

    def _release(self, rec: _Recording) -> None:
        self._open.remove(rec)
        for log in rec.logs.values():
            log.close()
        job = getattr(rec.upload, "keyed_job", None)
        if job is not None:
            job.release()

    def _complete(self) -> list:
        """Release the oldest recordings whose channels are all done, in epoch order."""
        ready = []
        while self._open and not self._open[0].waiting:
            rec = self._open.pop(0)
            self.attach(rec.upload, rec.logs, rec.counts, rec.marks)
            ready.append(rec.upload)
        return ready
