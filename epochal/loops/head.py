"""The Loop Head: seed 004 Algorithm 7 as pure bookkeeping, plus its pass-through operator.

The head task aligns (exactly-once) or tracks (at-least-once) its *external* inputs like
any task — the guarantee factory picked that handler. The feedback (phantom) channels are
not part of alignment. When the head snapshots epoch n and forwards barrier n into the
loop (Alg. 7 lines 5-8), :meth:`LoopHeadProtocol.start` begins recording: every record
arriving on a feedback channel before barrier n came back *on that channel* is appended
to epoch n's in-transit log (lines 12-13: they precede the marker, so they belong to the
cycle's state at the cut, exactly the channel state of Chandy-Lamport). When barrier n
has returned on every feedback channel (line 9-11) the snapshot is complete: the log is
attached to the held upload and only then uploaded and acknowledged — so an epoch
completes only after every head's barrier went round its loop. The log is needed under
at-least-once too: without it, records in flight inside the loop at the cut are lost.

A feedback channel may deliver barrier n *before* the head snapshotted n (a body with
forward edges lets another head subtask's barrier come round first). Records behind that
barrier are already after the cut, so the channel is blocked (buffered, never credited
away) until the head snapshots n — the feedback half of alignment, which the Chandy-Lamport
rule needs for a correct cut; its log for n is empty.

Several epochs may be recording at once (a record then belongs to every open log whose
barrier has not returned on its channel). An epoch whose barrier never returns because a
newer barrier arrives first on some feedback channel was dropped inside the loop
(aborted): it is declined. On restore the head replays the log before anything else
(§4.1.3.1; see :mod:`epochal.runtime.task`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from epochal.loops.log import InTransitLog
from epochal.operators.base import RuntimeOperator


class LoopHeadOperator(RuntimeOperator):
    """The head's record path: records of the loop's input and feedback pass unchanged."""

    def process_batch(self, records: list) -> list:
        return records


@dataclass
class _Recording:
    epoch: int
    upload: object  # runtime.snapshots.PendingUpload, held until the barrier returned
    waiting: set[int]
    log: InTransitLog
    in_flight: int = 0  # records that crossed the phantom channel while recording


@dataclass
class LoopEvents:
    """What the task must do after a feedback barrier: upload ``ready`` (epoch order),
    decline ``declined``."""

    ready: list = field(default_factory=list)
    declined: list[int] = field(default_factory=list)


class LoopHeadProtocol:
    """Alg. 7 for one head task with feedback channels ``feedback_channels``.

    Args:
        feedback_channels: the task's input indices of the feedback channels.
        memory_records: in-memory bound of each epoch's log (spills beyond it).
        logging: ``False`` only in tests (``epochal.testing.DisableLoopLog``) to prove the
            log is what keeps in-flight records: records are counted (termination still
            sees them) but not kept in the snapshot.
    """

    def __init__(self, feedback_channels: Iterable[int], memory_records: int = 100_000, logging: bool = True):
        self.feedback_channels = frozenset(feedback_channels)
        self.memory_records = memory_records
        self.logging = logging
        self._open: list[_Recording] = []  # epoch order
        self._early: dict[int, int] = {}  # channel -> epoch whose barrier returned before start()
        self._started = 0

    @property
    def blocked_channels(self) -> frozenset[int]:
        """Feedback channels the task must not read: their barrier came back early."""
        return frozenset(self._early)

    @property
    def recording_epochs(self) -> list[int]:
        return [r.epoch for r in self._open]

    def start(self, epoch: int, upload) -> LoopEvents:
        """Barrier ``epoch`` was just forwarded into the loop: record until it returns."""
        self._started = max(self._started, epoch)
        rec = _Recording(epoch, upload, set(self.feedback_channels), InTransitLog(self.memory_records))
        skipped = False
        for channel, early in list(self._early.items()):
            if early == epoch:  # came back already: nothing of this channel is in flight for n
                rec.waiting.discard(channel)
            if early <= epoch:
                del self._early[channel]
            else:  # a newer barrier came back first: ours was dropped inside the loop
                skipped = True
        self._open.append(rec)
        if skipped:
            self._drop(rec)
            return LoopEvents(declined=[epoch])
        return self._collect()

    def on_records(self, channel: int, records: list) -> list[int]:
        """Log feedback ``records`` into every open epoch still waiting on ``channel``;
        returns those epochs."""
        logged = []
        for rec in self._open:
            if channel in rec.waiting:
                rec.in_flight += len(records)
                if self.logging:
                    rec.log.append(records)
                logged.append(rec.epoch)
        return logged

    def on_barrier(self, channel: int, epoch: int) -> LoopEvents:
        """Barrier ``epoch`` came back on feedback ``channel``."""
        declined = []
        if epoch > self._started:  # before the head's own snapshot: block until start(epoch)
            self._early[channel] = epoch
        for rec in list(self._open):
            if channel not in rec.waiting:
                continue
            if rec.epoch == epoch:
                rec.waiting.discard(channel)
            elif rec.epoch < epoch:  # its barrier was dropped inside the loop (aborted there)
                self._drop(rec)
                declined.append(rec.epoch)
        events = self._collect()
        events.declined[:0] = declined
        return events

    def abort(self, epoch: int) -> None:
        """The coordinator aborted ``epoch``: forget its recording and stop waiting for it."""
        for channel, early in list(self._early.items()):
            if early <= epoch:
                del self._early[channel]
        for rec in list(self._open):
            if rec.epoch == epoch:
                self._drop(rec)

    def close(self) -> None:
        for rec in list(self._open):
            self._drop(rec)

    def _drop(self, rec: _Recording) -> None:
        self._open.remove(rec)
        rec.log.close()
        job = getattr(rec.upload, "keyed_job", None)
        if job is not None:
            job.release()

    def _collect(self) -> LoopEvents:
        """Complete the oldest recordings whose barrier returned everywhere (in order)."""
        events = LoopEvents()
        while self._open and not self._open[0].waiting:
            rec = self._open.pop(0)
            rec.upload.loop_log = rec.log
            rec.upload.metrics["loop_logged"] = rec.in_flight
            rec.upload.metrics["loop_spilled_chunks"] = rec.log.spilled_chunks
            events.ready.append(rec.upload)
        return events
