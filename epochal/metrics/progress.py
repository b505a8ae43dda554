"""Progress events: what a running job is doing, built in the driver from the tasks'
reports (Spark's ``StreamingQueryProgress``, Flink's job metrics).

Every ``metrics.interval`` each task sends the coordinator its cumulative counters
(:meth:`epochal.runtime.task.task.Task.live_metrics`); :class:`ProgressBuilder` turns the
latest ones, the completed epochs and the driver's attempt history into one JSON-able dict:

* ``state`` (``starting``, ``running``, ``restarting``, ``finished``, ``failed``), ``attempt``,
  ``generation``, ``uptime_s``, ``restarts`` (each with its cause);
* throughput: ``records_in_per_s`` (read by the sources) and ``records_out_per_s`` (written
  by the sinks), per task and per operator too (and per operator within each task:
  ``operators`` of a task entry), as rates between the task's newest report and the one
  before it. A task whose report did not change since the previous event (the event fell
  between two of its reports) keeps its last rates for two of its report intervals: a
  steady job's rate never reads 0 because of when it was sampled, a silent task's does;
* ``late_dropped``: late records of windows whose ``.late()`` output nothing reads;
* ``rss_bytes`` and ``pid`` per task: its process's resident memory and id; ``cpu_s``, the CPU
  seconds its process used since the task started, and ``cpu_load``, the cores it kept busy
  over the last interval (1.0: one core);
* ``backpressure_ratio`` per task (the share of the last interval it waited for credit),
  ``queued_batches`` (its input queues), ``watermark`` (its output event time, seconds);
* ``reader`` per task and per operator, where a source reader reports figures of its own
  (a ``metrics()`` of the reader; e.g. the CEC window operator's, docs/eventual.md "Metrics"):
  its splits folded — ``extent_lag`` (µs) as ``extent_lag_s``, the highest; every other figure
  summed; the counters of :data:`READER_RATES` also as rates (``footprints_per_s``, ...).
  An operator's entry folds its tasks the same way (the reader is its task's first operator);
* checkpoints: ``last_completed_epoch``, its age, the attempt's completed and aborted
  counts, and duration / size p50 and p99 over all its completed epochs (streaming
  quantiles within 1 %, :mod:`epochal.metrics.quantiles`).

Pure bookkeeping (no threads): the reporter (:mod:`epochal.metrics.reporter`) calls
:meth:`ProgressBuilder.build` on its own thread.
"""
from __future__ import annotations

import datetime as _dt
import time

from epochal.graph import NodeKind
from epochal.time.units import MIN_TIME, to_seconds

__all__ = ["READER_RATES", "ProgressBuilder", "percentile"]

#: a reader's counters reported as rates too: counter → its rate's name (per second)
READER_RATES = {"footprints": "footprints_per_s", "ignored": "ignored_per_s", "checkpoint_seconds": "checkpoint_load"}
#: a reader's gauges folded by their highest value, not summed: name → (reported name, scale)
_READER_HIGHEST = {"extent_lag": ("extent_lag_s", 1e-6)}


def _fold_splits(splits: dict | None) -> dict:
    """One task's reader figures (``{split: {name: number}}``) as one dict (module docstring)."""
    out: dict = {}
    for figures in (splits or {}).values():
        for name, v in figures.items():
            if name in _READER_HIGHEST:
                key, scale = _READER_HIGHEST[name]
                out[key] = max(out.get(key, 0.0), v * scale)
            else:
                out[name] = out.get(name, 0) + v
    return out


def _fold_into(total: dict, entry: dict) -> None:
    """Add a task's folded reader figures to its operator's."""
    highest = {key for key, _ in _READER_HIGHEST.values()}
    for name, v in entry.items():
        total[name] = max(total.get(name, 0.0), v) if name in highest else total.get(name, 0) + v


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return ordered[int(rank) - 1]


class ProgressBuilder:
    """Builds successive progress events of one job (see the module docstring)."""

    def __init__(self, plan):
        self.job = plan.job
        self.sources = {t.id for t in plan.tasks if t.is_source}
        self.sinks = {n.name for n in plan.nodes.values() if n.kind is NodeKind.SINK}
        self.first_operator = {t.id: t.chain[0] for t in plan.tasks if t.chain}  # whose reader a task runs
        self.sequence = 0
        self.started = time.monotonic()
        self._previous: dict[str, dict] = {}  # task -> its counters at the previous event
        self._before: dict[str, dict | None] = {}  # task -> the report before its newest one
        self._seen_at: dict[str, float] = {}  # task -> when (driver clock) its newest report first came

    def build(self, driver_state: dict, live: dict, history) -> dict:
        """One progress event. ``driver_state``: ``state``, ``attempt``, ``generation``,
        ``restarts``; ``live``: task → its latest counters; ``history``: the attempt's
        :class:`~epochal.epochs.history.EpochHistory` (``None`` before it started). The
        checkpoint percentiles come from its streaming summaries: nothing is sorted here,
        and nothing grows with the number of epochs."""
        now = time.time()
        tasks, operators = {}, {}
        rate_in = rate_out = 0.0
        watermarks = []
        for task, m in sorted(live.items()):
            prev = self._previous.get(task)
            if prev is not None and m.get("time") == prev.get("time"):
                before = self._before.get(task)  # the same report again: its rates over its own interval,
                if before is not None and now - self._seen_at[task] <= 2 * max(0.0, m["time"] - before["time"]):
                    prev = before  # unless it is older than two of its intervals (the task went silent: 0)
            else:
                self._before[task], self._seen_at[task] = prev, now
            fresh = prev is None or m.get("time", 0) < prev.get("time", 0) or m["records_in"] < prev["records_in"]
            dt = max(1e-9, m["time"] - prev["time"]) if not fresh else None

            def rate(now_count, before_count):
                return 0.0 if dt is None or m["time"] == prev["time"] else max(0.0, now_count - before_count) / dt

            entry = {
                "host": m.get("host"), "records_in": m["records_in"], "records_out": m["records_out"],
                "records_in_per_s": rate(m["records_in"], prev["records_in"] if prev else 0),
                "records_out_per_s": rate(m["records_out"], prev["records_out"] if prev else 0),
                "backpressure_s": m["backpressure_s"],
                "backpressure_ratio": min(1.0, rate(m["backpressure_s"], prev["backpressure_s"] if prev else 0.0)),
                "queued_batches": m["queued_batches"],
                "watermark": None if m["watermark"] <= MIN_TIME else to_seconds(m["watermark"]),
                "idle": m.get("idle", False), "snapshots": m.get("snapshots", 0),
                "late_dropped": m.get("late_dropped", 0), "rss_bytes": m.get("rss_bytes"), "pid": m.get("pid"),
                "cpu_s": m.get("cpu_s"),
                "cpu_load": None if m.get("cpu_s") is None else rate(m["cpu_s"], (prev or {}).get("cpu_s") or 0.0),
                "operators": {},
            }
            tasks[task] = entry
            if task in self.sources:
                rate_in += entry["records_in_per_s"]
            if entry["watermark"] is not None:
                watermarks.append(entry["watermark"])
            before_ops = (prev or {}).get("operators", {}) if not fresh else {}
            for name, (n_in, n_out) in m.get("operators", {}).items():
                b_in, b_out = before_ops.get(name, (0, 0))
                op = operators.setdefault(name, {"records_in": 0, "records_out": 0, "records_in_per_s": 0.0,
                                                 "records_out_per_s": 0.0})
                op["records_in"] += n_in
                op["records_out"] += n_out
                op["records_in_per_s"] += rate(n_in, b_in)
                op["records_out_per_s"] += rate(n_out, b_out)
                entry["operators"][name] = {"records_in": n_in, "records_out": n_out,
                                            "records_in_per_s": rate(n_in, b_in), "records_out_per_s": rate(n_out, b_out)}
                if name in self.sinks:
                    rate_out += rate(n_in, b_in)
            if m.get("reader") is not None:
                entry["reader"] = reader = _fold_splits(m["reader"])
                before_reader = _fold_splits((prev or {}).get("reader")) if not fresh else {}
                for counter, rate_name in READER_RATES.items():
                    if counter in reader:
                        reader[rate_name] = rate(reader[counter], before_reader.get(counter, 0))
                name = self.first_operator.get(task)
                if name is not None:
                    op = operators.setdefault(name, {"records_in": 0, "records_out": 0, "records_in_per_s": 0.0,
                                                     "records_out_per_s": 0.0})
                    _fold_into(op.setdefault("reader", {}), reader)
            self._previous[task] = m
        last = history.latest if history is not None else None

        def pct(what, q):
            return history.quantile(what, q) if history is not None else None
        self.sequence += 1
        return {
            "job": self.job, "sequence": self.sequence, "time": now,
            "timestamp": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(timespec="milliseconds"),
            "uptime_s": time.monotonic() - self.started, **driver_state,
            "records_in_per_s": rate_in, "records_out_per_s": rate_out,
            "late_dropped": sum(t["late_dropped"] for t in tasks.values()),  # late records nothing read
            "watermark": min(watermarks) if watermarks and len(watermarks) == len(tasks) else None,
            "last_completed_epoch": last["epoch"] if last else None,
            "last_checkpoint_age_s": now - last["wall_time"] if last and last.get("wall_time") else None,
            "checkpoints": {
                "completed": history.completed_count if history is not None else 0,
                "aborted": history.aborted_count if history is not None else 0,
                "duration_s": {"last": last["duration_s"] if last else None, "p50": pct("duration_s", 50),
                               "p99": pct("duration_s", 99)},
                "bytes": {"last": last.get("bytes") if last else None, "p50": pct("bytes", 50),
                          "p99": pct("bytes", 99)},
            },
            "tasks": tasks,
            "operators": operators,
        }


def status_line(p: dict) -> str:
    """One human line of a progress event, for a terminal."""
    def k(x):
        return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"

    parts = [p["job"] + (f"/{p['region']}" if p.get("region") else ""), p["state"]]
    if p.get("attempt"):
        parts.append(f"attempt {p['attempt'] + 1}")
    parts.append(f"{k(p['records_in_per_s'])} rec/s in, {k(p['records_out_per_s'])} out")
    if p["last_completed_epoch"] is not None:
        age = p["last_checkpoint_age_s"]
        parts.append(f"epoch {p['last_completed_epoch']}"
                     + (f" {age:.1f}s ago" if age is not None else "")
                     + f" ({p['checkpoints']['duration_s']['last'] * 1000:.0f} ms)")
    if p.get("watermark") not in (None, float("inf"), float("-inf")):
        parts.append("event time " + _dt.datetime.fromtimestamp(p["watermark"], _dt.timezone.utc).strftime("%H:%M:%S"))
    return " | ".join(parts)
