"""The two ways a task's loop takes its next input (one step per turn of
:meth:`~epochal.runtime.task.task.Task._loop`), on the task thread.

* :meth:`ReadSteps._step_source` — a source task polls its reader: records go through the
  chain, a finished split ends its watermark, ``request_epoch`` asks the coordinator for
  an epoch, the end of input emits the final watermark (before the final barrier).
* :meth:`ReadSteps._step_inputs` — any other task takes the next message of a channel the
  barrier handler does not block: data, a watermark, a barrier (to the handler, seed 004
  Alg. 6 / §4.5.4), the end of a channel. With unaligned snapshots the barriers that
  arrived are handed over first, ahead of the data queued before them. A loop head's
  feedback channels go to :meth:`ReadSteps._on_feedback` (Alg. 7).

Both return whether they made progress (the loop waits on the task's condition variable
otherwise). They belong to :class:`~epochal.runtime.task.task.Task` (a mixin: the state
they read and change is the task's own, set up in its ``__init__`` and ``_setup``).
"""
from __future__ import annotations

import time

from epochal.columnar.keys import rows
from epochal.epochs.barrier import Barrier
from epochal.errors import DataError
from epochal.runtime.transport.channels import BARRIER, DATA, END, ChannelFailure
from epochal.time.watermarks import WATERMARK, WatermarkMark

#: elements of a batch processed between two checks of the aligned timeout while an epoch
#: aligns (CheckpointConfig.aligned_timeout)
SWITCH_SLICE = 32
#: with priority barriers (unaligned snapshots, aligned_timeout) a task whose batches take
#: longer than this processes them in slices of about this long, so a barrier that arrives
#: meanwhile — flagged unaligned upstream, or starting an aligned timeout — is seen within
#: a slice instead of after the whole batch (issue 24: a 1 ms/record map took 0.5 s batches);
#: the rest of the batch is put back and, if the epoch goes unaligned, becomes channel state
SLICE_SECONDS = 0.02
#: how long a finished loop head waits for the end of its feedback channels (see
#: :meth:`ReadSteps._await_feedback_end`)
FEEDBACK_END_WAIT = 10.0


class ReadSteps:
    """The input side of :class:`~epochal.runtime.task.task.Task`'s loop."""

    def _step_source(self) -> bool:
        if self.exhausted:
            return False
        poll = self.reader.poll(self._poll_size)
        if (poll.records or poll.split_finished) and self.operators:
            self.operators[0].set_input_split(poll.split, poll.split_finished)
        if poll.records:
            self.metrics["records_in"] += rows(poll.records)
            self._process(poll.records)
            self.chain.after_batch()
        elif poll.split_finished and self.operators:
            self._process([])  # an empty last poll of a split still ends it
            self.chain.after_batch()
        if poll.request_epoch:
            self._send(("request_epoch", self.spec.id))
        if poll.finished:
            self._end_input()  # the final watermark precedes the final barrier
            self._send(("exhausted", self.spec.id))
        return bool(poll.records) or not poll.idle

    def _end_input(self) -> None:
        """A source task reads no more — its input ended, or a drain stopped it
        (``Task._drain_source``): event time ends, its watermark sent before any barrier
        that follows."""
        self.exhausted = True
        self.chain.end_of_input()
        self.router.flush()

    def _step_inputs(self) -> bool:
        if self.priority:  # barriers that arrived, ahead of the data queued before them
            for channel, msg in self.gate.take_arrivals():
                if channel < self.n_aligned:
                    self._barrier_ts[msg[1]] = msg[2]
                    result = self.handler.on_barrier_arrived(channel, Barrier(msg[1], msg[2]), len(msg) > 3 and msg[3])
                    self._apply(result, channel, reached=False)
            self._apply(self.handler.on_tick(), None, reached=False)
        item = self.gate.poll(self._blocked())
        if item is None:
            return False
        channel, msg = item
        if channel >= self.n_aligned:
            self._on_feedback(channel, msg)
            return True
        kind = msg[0]
        if kind == DATA:
            # An aligned epoch may time out (CheckpointConfig.aligned_timeout) while this batch
            # runs, or a barrier arrive: take a slice and put the rest back, so the timeout and
            # arrivals are checked every slice (one slow batch would delay the switch by its
            # whole duration) and the rest, still queued before the barrier, becomes channel
            # state if the epoch goes unaligned.
            limit = SWITCH_SLICE if getattr(self.handler, "switch_pending", False) else self._slice
            if limit is not None and len(msg[1]) > limit:
                self.gate.unread(channel, (DATA, msg[1][limit:]))
                msg = (DATA, msg[1][:limit])
            n = rows(msg[1])
            self.metrics["records_in"] += n
            if self.recorder.recording:
                self.recorder.on_records(channel, msg[1])
            t0 = time.monotonic() if self.priority else 0.0
            self._process(msg[1], channel)
            self.chain.after_batch()
            if self.priority and n:
                self._size_slices(n, time.monotonic() - t0)
        elif kind == WATERMARK:
            if self.recorder.recording:  # in order with the records of an unaligned epoch's channel state
                self.recorder.on_records(channel, [WatermarkMark(msg[1], msg[2])], marks=1)
            self.on_input_watermark(channel, msg[1], msg[2])
        elif kind == BARRIER:
            self._barrier_ts[msg[1]] = msg[2]
            self._apply(self.handler.on_barrier(channel, Barrier(msg[1], msg[2])), channel, reached=True)
        elif kind == END:
            self.gate.ended[channel] = True
        else:  # "!" — the producer vanished without an end of stream, or its data cannot be decoded
            _raise_broken(self.spec.id, msg)
        return True

    _slice: int | None = None  # records per slice of a slow task's batches (None: whole batches)

    def _size_slices(self, n: int, seconds: float) -> None:
        """After a batch of ``n`` records took ``seconds``: slice the next batches into
        about :data:`SLICE_SECONDS` worth of records if batches are slower than that."""
        if seconds > SLICE_SECONDS:
            self._slice = max(SWITCH_SLICE, int(n * SLICE_SECONDS / seconds))
        elif self._slice is not None and n >= self._slice and seconds < SLICE_SECONDS / 4:
            self._slice = None  # fast again: whole batches

    def _on_feedback(self, channel: int, msg: tuple) -> None:
        """A loop head's phantom channel (seed 004 Alg. 7 lines 9-13)."""
        kind = msg[0]
        if kind == DATA:
            self.metrics["records_in"] += len(msg[1])
            logged = self.recorder.on_records(channel, msg[1])
            if logged:
                self.faults.on_loop_log(logged[-1])
            self._process(msg[1])
            self.chain.after_batch()
        elif kind == WATERMARK:
            pass  # a loop's event time comes from its external inputs only (epochal.time.watermarks)
        elif kind == BARRIER:
            self._apply_loop_events(self.loop.on_barrier(channel, msg[1]))
        elif kind == END:
            self.gate.ended[channel] = True
        else:
            _raise_broken(self.spec.id, msg)

    def _await_feedback_end(self) -> None:
        """A loop head that finished: wait for the end of stream on each feedback channel
        before the task closes them.

        The coordinator finishes tasks upstream first, and the head is upstream of its own
        loop, so the loop's tail (the feedback producers) finishes after the head and may
        still send records behind the last completed epoch's barrier — after a stop with
        a savepoint, records of the loop still circulating; their epoch never completes,
        so the savepoint holds none of them. Closing the channels at once made such a
        producer fail on its way out with a broken pipe. Instead every channel is drained
        (what arrives is discarded) until its END, or until it broke, the attempt was
        cancelled or :data:`FEEDBACK_END_WAIT` passed (the producer's own ``_finish``
        tolerates a closed channel for its END). Called on the task thread, after
        ``("finished", ...)`` was sent: the job's outcome does not wait for it.
        """
        feedback = self.loop.feedback_channels
        others = frozenset(range(len(self.gate.channel_ids))) - feedback
        deadline = time.monotonic() + FEEDBACK_END_WAIT
        while not all(self.gate.ended[i] for i in feedback):
            if any(m[0] in ("cancel", "lost") for m in self.control):
                return
            item = self.gate.poll(others)
            if item is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                with self.cv:
                    self.cv.wait(min(0.05, remaining))
                continue
            channel, msg = item
            if msg[0] not in (DATA, BARRIER, WATERMARK):  # END, or "!": it broke
                self.gate.ended[channel] = True


def _raise_broken(task: str, msg: tuple):
    """A channel's ``("!", text[, cause])``: its own DataError (the data cannot be decoded:
    the task's failure, not an echo of another's), else a ChannelFailure."""
    cause = msg[2] if len(msg) > 2 else None
    if isinstance(cause, DataError):
        raise DataError(f"task {task}: {cause}")
    raise ChannelFailure(f"task {task}: {msg[1]}") from cause
