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
(§4.1.3.1; see :mod:`epochal.runtime.task.task`).

The recording itself is the task's channel-state recorder
(:mod:`epochal.alignment.channel_state`), shared with unaligned checkpoints — a loop
head's feedback log *is* channel state; this module keeps only what is particular to
loops.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from epochal.operators.base import RuntimeOperator

#: the log key of a loop head's feedback records in its ChannelStateRecorder (all feedback
#: channels share one in-transit log, persisted as the task state's ``"loop"`` entry)
LOOP_LOG = "loop"


class LoopHeadOperator(RuntimeOperator):
    """The head's record path: records of the loop's input and feedback pass unchanged."""

    def process_batch(self, records: list) -> list:
        return records


@dataclass
class LoopEvents:
    """What the task must do after a loop event: upload ``ready`` (epoch order), decline
    ``declined``."""

    ready: list = field(default_factory=list)
    declined: list[int] = field(default_factory=list)


class LoopHeadProtocol:
    """Alg. 7 for one head task with feedback channels ``feedback_channels``: which
    barriers came back early (blocking their channel), which epochs a feedback channel
    skipped. The log itself is kept by the task's
    :class:`~epochal.alignment.channel_state.ChannelStateRecorder` (``recorder``): the task
    starts each epoch's recording waiting on every feedback channel (key :data:`LOOP_LOG`)
    and feeds it the feedback records; this protocol tells the recorder when a feedback
    channel is done with an epoch or when an epoch is lost.
    """

    def __init__(self, feedback_channels: Iterable[int], recorder):
        self.feedback_channels = frozenset(feedback_channels)
        self.recorder = recorder
        self._early: dict[int, int] = {}  # channel -> epoch whose barrier returned before start()
        self._started = 0

    @property
    def blocked_channels(self) -> frozenset[int]:
        """Feedback channels the task must not read: their barrier came back early."""
        return frozenset(self._early)

    def start(self, epoch: int) -> LoopEvents:
        """Barrier ``epoch`` was just forwarded into the loop (its recording is started):
        channels whose barrier already came back are done; a newer barrier that came back
        first means ours was dropped inside the loop (declined)."""
        self._started = max(self._started, epoch)
        events = LoopEvents()
        if any(early > epoch for early in self._early.values()):
            self.recorder.drop(epoch)
            events.declined.append(epoch)
        for channel, early in list(self._early.items()):
            if early == epoch and not events.declined:  # came back already: nothing of it in flight
                events.ready += self.recorder.done(epoch, channel)
            if early <= epoch:
                del self._early[channel]
        return events

    def on_barrier(self, channel: int, epoch: int) -> LoopEvents:
        """Barrier ``epoch`` came back on feedback ``channel``."""
        events = LoopEvents()
        if epoch > self._started:  # before the head's own snapshot: block until start(epoch)
            self._early[channel] = epoch
        for m in self.recorder.epochs:
            if channel not in self.recorder.waiting_on(m):
                continue
            if m == epoch:
                events.ready += self.recorder.done(m, channel)
            elif m < epoch:  # its barrier was dropped inside the loop (aborted there)
                self.recorder.drop(m)
                events.declined.append(m)
        return events

    def abort(self, epoch: int) -> None:
        """The coordinator aborted ``epoch``: stop blocking for it (the task drops its
        recording)."""
        for channel, early in list(self._early.items()):
            if early <= epoch:
                del self._early[channel]
