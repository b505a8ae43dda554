"""What a task does when the barrier handler says an epoch's barrier is reached: the
synchronous part of the snapshot, then the barrier forwarded (seed 004 Alg. 5–6, §4.5.1).

:meth:`BarrierSteps._apply` carries out the handler's instructions
(:mod:`epochal.alignment.handlers`, :mod:`epochal.alignment.unaligned`): decline the epochs
it gave up, snapshot, or capture the channel state of an epoch snapshotted unaligned.
:meth:`BarrierSteps._snapshot_and_forward` takes operator, source and keyed state (the
backend's synchronous part), forwards the barrier, and hands a
:class:`~epochal.runtime.task.snapshots.PendingUpload` to the uploader — at once, or once
its channel state is complete (unaligned snapshots; a loop head's barrier coming back
around the loop, Alg. 7).

Task thread only. A mixin of :class:`~epochal.runtime.task.task.Task`: the state it reads
and changes is the task's own.
"""
from __future__ import annotations

import time

from epochal.loops.head import LOOP_LOG
from epochal.operators.base import SnapshotResult
from epochal.runtime.task.snapshots import PendingUpload
from epochal.runtime.transport.channels import BARRIER


class BarrierSteps:
    """The epoch side of :class:`~epochal.runtime.task.task.Task`'s loop."""

    def _apply_loop_events(self, events) -> None:
        for epoch in events.declined:
            self._send(("decline", epoch, self.spec.id,
                        f"loop head {self.spec.id}: barrier {epoch} did not come back around the loop"))
        for upload in events.ready:
            self.uploader.submit(upload)

    def _apply(self, result, channel: int | None, reached: bool) -> None:
        """Carry out a barrier handler's instructions (see epochal.alignment.handlers and
        .unaligned): decline given-up epochs, snapshot, capture channel state.
        ``reached``: the event is a barrier taken from ``channel``'s queue in FIFO order
        (nothing is queued before it any more)."""
        for epoch in result.aborted_epochs:
            self.recorder.drop(epoch)
            self._send(("decline", epoch, self.spec.id, f"task {self.spec.id}: barrier handler gave up epoch {epoch}"))
        plan = result.channel_state
        if result.snapshot_epoch is not None:
            self.metrics["alignment_s"].add(self.handler.last_alignment_duration)
            epoch = result.snapshot_epoch
            timestamp = self._barrier_ts.get(epoch, time.time())
            for older in [e for e in self._barrier_ts if e <= epoch]:  # never needed again
                del self._barrier_ts[older]
            self._snapshot_and_forward(epoch, timestamp, plan, reached_channel=channel if reached else None)
        elif plan is not None:  # barriers of an epoch snapshotted unaligned arrived
            ready = []
            for c in plan.capture:
                owed = [] if reached and c == channel else self.gate.queued_before(c, plan.epoch)
                ready += self.recorder.capture(plan.epoch, c, owed)
            for upload in ready:
                self.uploader.submit(upload)
        elif reached and self.handler.pending_epoch is not None:
            self.faults.on_alignment(self.handler.pending_epoch)

    def _attach_channel_state(self, upload, logs: dict, counts: dict, marks: int) -> None:
        """The recorder completed ``upload``'s channel state: hand it the logs to persist.
        ``channel_state_records`` counts every entry in flight on the unaligned inputs,
        ``channel_state_watermarks`` the watermarks among them."""
        upload.loop_log = logs.pop(LOOP_LOG, None)
        upload.channel_state = logs
        upload.metrics["channel_state_records"] = sum(n for k, n in counts.items() if k != LOOP_LOG)
        upload.metrics["channel_state_watermarks"] = marks
        if self.loop is not None:
            upload.metrics["loop_logged"] = counts.get(LOOP_LOG, 0)
            upload.metrics["loop_spilled_chunks"] = upload.loop_log.spilled_chunks if upload.loop_log else 0

    def _snapshot_and_forward(self, epoch: int, timestamp: float, plan=None, reached_channel: int | None = None) -> None:
        """Synchronous part of the snapshot of ``epoch``, then forward the barrier.

        Everything processed so far belongs to epochs ≤ ``epoch`` and nothing after;
        buffered output is flushed before the barrier so it precedes it on every channel.
        With a channel-state ``plan`` (an unaligned snapshot) the barrier goes out flagged
        unaligned and without waiting for credit, and the upload waits for the channel
        state; a loop head's upload waits for its barrier to come back (Alg. 7).
        """
        barrier_s = time.time() - timestamp  # trigger → here: the barrier's travel, incl. alignment
        t0 = time.monotonic()
        unaligned = plan is not None
        force = unaligned or (self.priority and not self.spec.inputs)  # a source's barrier overtakes too
        self.chain.pre_barrier(epoch)  # e.g. a mini-batch aggregation's updates, ahead of the barrier
        self.router.flush(force)
        operators, before_ack = {}, []
        for op in self.operators:
            state = op.snapshot(epoch)  # sinks seal their transaction here (seed 004 §4.1.3, prepare)
            if isinstance(state, SnapshotResult):  # e.g. a sink's fsync: on the uploader, before the ack
                before_ack.append((op.ctx.operator, state.before_ack))
                state = state.state
            if state is not None:
                operators[op.ctx.operator] = state
        source = self.reader.snapshot() if self.reader is not None else None
        if source is not None:
            self._source_offsets[epoch] = source  # until the epoch completes or is aborted
        keyed_job = self.backend.snapshot(epoch) if self.backend is not None else None
        if not unaligned:  # an unaligned cut's keyed state lacks its in-flight records: not served
            self.pin_query_view(epoch)  # queryable state of this cut (epochal.query)
        self.router.broadcast((BARRIER, epoch, timestamp, True) if unaligned else (BARRIER, epoch, timestamp), force)
        sync = time.monotonic() - t0
        self.metrics["sync_s"].add(sync)
        self.metrics["snapshots"] += 1
        self.metrics["unaligned_snapshots"] += unaligned
        kind = "source" if not self.spec.inputs else (getattr(self.handler, "last_snapshot_kind", None) or "aligned")
        upload = PendingUpload(epoch, operators, source, keyed_job,
                               {"sync_s": sync, "barrier_s": barrier_s, "snapshot_kind": kind,
                                "alignment_s": self.handler.last_alignment_duration if self.spec.inputs else 0.0},
                               before_ack=before_ack)
        waiting = set(self.loop.feedback_channels) if self.loop is not None else set()
        if unaligned:
            waiting |= plan.capture | plan.record
        if not waiting:
            self.uploader.submit(upload)
            return
        ready = self.recorder.start(epoch, upload, waiting)
        if unaligned:
            for c in plan.capture:  # the data queued before the barrier (none if it was just reached)
                owed = [] if c == reached_channel else self.gate.queued_before(c, epoch)
                ready += self.recorder.capture(epoch, c, owed)
        if self.loop is not None:  # held until barrier `epoch` came back around the loop (Alg. 7)
            events = self.loop.start(epoch)
            events.ready[:0] = ready
            self._apply_loop_events(events)
        else:
            for u in ready:
                self.uploader.submit(u)
