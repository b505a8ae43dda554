"""The sink operator: feeds a :class:`~epochal.sinks.base.SinkWriter` and wires its
two-phase commit into the task's epoch lifecycle (seed 004 §4.1.3)."""
from __future__ import annotations

import pyarrow as pa

from epochal.operators.base import OperatorContext, RuntimeOperator, SnapshotResult
from epochal.sinks.base import SinkContext


class SinkOperator(RuntimeOperator):
    """Writes every record; pre-commits at the barrier (as part of the task's snapshot:
    the writer seals its transaction on the task thread, and its durability job becomes
    the snapshot's ``before_ack``) and commits when the coordinator reports the epoch
    complete."""

    def __init__(self, ctx: OperatorContext, sink, timed: bool = False):
        super().__init__(ctx)
        self.timed = timed  # records are (timestamp, value): the sink writes the values
        self.writer = sink.create_writer(
            SinkContext(
                sink_name=ctx.operator,
                subtask=ctx.subtask,
                parallelism=ctx.parallelism,
                job=ctx.job,
                generation=ctx.generation,
                mode=ctx.extras["sink_mode"],
                lineage=ctx.extras.get("lineage"),
            )
        )

    def restore(self, state) -> None:
        self.writer.restore(state)

    def process_batch(self, records: list) -> list:
        if records and type(records[0]) is pa.RecordBatch:  # a stream of Arrow batches
            for batch in records:
                self.writer.write_batch(batch)
            return []
        if self.timed:
            records = [r[1] for r in records]
        self.writer.write_many(records)  # SinkWriteError already names the sink and the record
        return []

    def snapshot(self, epoch: int):
        state = self.writer.snapshot(epoch)
        job = self.writer.durability_job(epoch)
        return state if job is None else SnapshotResult(state, job)

    def notify_epoch_complete(self, epoch: int) -> None:
        self.writer.notify_epoch_complete(epoch)

    def close(self) -> None:
        self.writer.close()

    def release(self) -> None:
        self.writer.release()
