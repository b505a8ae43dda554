"""A task's counters for the driver (:class:`MetricSteps`, mixed into
:class:`~epochal.runtime.task.task.Task`): the live metrics it reports every
``AttemptSpec.metrics_interval`` (``("metrics", id, live_metrics())``) and its final counts
when it finishes. Called on the task thread only; reads counters, never blocks.
"""
from __future__ import annotations

import os
import time

from epochal.metrics.quantiles import Summary

__all__ = ["MetricSteps"]


class MetricSteps:
    """The metrics part of a task (needs ``self.metrics``, ``self.chain``, ``self.router``,
    ``self.outputs``, ``self.gate``, ``self.spec``, ``self.node``, ``self._cpu_start``)."""

    def live_metrics(self) -> dict:
        """Counters of this task now, for the driver's live metrics (:mod:`epochal.metrics`):
        cumulative since the attempt started, so a lost report loses no count."""
        operators = self.chain.operator_counts()
        if self.spec.is_source:  # records read = records emitted by the source
            operators[self.spec.chain[0]] = [self.metrics["records_in"]] * 2
        return {
            "records_in": self.metrics["records_in"], "records_out": self.router.records_out,
            "backpressure_s": sum(o.blocked_seconds for o in self.outputs.values()),
            "queued_batches": sum(len(q) for q in self.gate.queues),
            "watermark": self.chain.output.watermark, "idle": self.chain.output.idle,
            "operators": operators, "snapshots": self.metrics["snapshots"],
            "late_dropped": self.metrics.get("late_dropped", 0), "host": self.node, "time": time.time(),
            "rss_bytes": _rss_bytes(), "pid": os.getpid(), "cpu_s": self.cpu_seconds(),
            "reader": self.reader_gauges(),
        }

    def reader_gauges(self) -> dict | None:
        """The source reader's own figures, when it has a ``metrics()`` (e.g. the CEC reader,
        :meth:`epochal.eventual.source.EventualReader.metrics`): ``{split: {name: number}}``
        with the splits as strings (the report is JSON-able); ``None`` for a task without a
        reader or a reader without figures. The progress builder folds them per operator
        (:mod:`epochal.metrics.progress`); they belong to the task's first operator."""
        gauges = getattr(getattr(self, "reader", None), "metrics", None)
        if not callable(gauges):
            return None
        return {str(split): {k: v for k, v in figures.items() if isinstance(v, (int, float))}
                for split, figures in gauges().items()}

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of this task's process since the task started: its
        task thread and its uploader, commit and query threads — a process runs one task at a
        time (local runtime: a process per task; Spark: a Python worker per running task)."""
        return time.process_time() - self._cpu_start

    def _final_metrics(self) -> dict:
        m = {k: v.to_dict() if isinstance(v, Summary) else v for k, v in self.metrics.items()}
        m["records_out"] = self.router.records_out
        m["cpu_s"] = self.cpu_seconds()
        m["backpressure_s"] = sum(o.blocked_seconds for o in self.outputs.values())
        m["max_buffered_batches"] = self.gate.buffered_batches_max
        m["feedback_spilled_frames"] = self.gate.spilled_frames  # loop feedback beyond its memory budget
        if hasattr(self, "router"):
            m["largest_frame_bytes"] = self.router.largest_frame
            m["unencodable_records"] = self.router.unencodable  # sent to dead letters
        if hasattr(self, "chain"):
            m["watermark"] = self.chain.output.watermark
        return m


def _rss_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``), for the live metrics; ``None``
    where there is no ``/proc``."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
