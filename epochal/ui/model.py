"""What the dashboard shows, built from a job's live state (pure bookkeeping, no HTTP).

The driver hands :class:`DashboardModel` a ``source()`` callable returning a plain dict of
its state now (see :meth:`DashboardModel.view`); the reporter thread calls
:meth:`DashboardModel.on_progress` with every progress event. The model keeps what the
driver forgets between attempts or never keeps:

* the checkpoint rows of *every* attempt (each attempt has its own
  :class:`~epochal.epochs.history.EpochHistory`), the newest :data:`MAX_ROWS`;
* bounded time series (:data:`MAX_POINTS` points): throughput in and out, watermark lag
  per source, memory of the driver and of the tasks, and per completed epoch its
  exactly-once latency.

and what the drill-down views read (:mod:`epochal.ui.drilldown`): every task's
acknowledgement of each kept epoch (:meth:`DashboardModel.checkpoint`, not in the polled
document), a row per subtask of every operator, and the failures of every attempt and
failover region (the driver's failover log starts afresh with each attempt).

Two derived figures, defined here once:

* **exactly-once latency** of epoch *n*: its completion (``_metadata`` written, commits
  announced) minus the trigger of epoch *n - 1*. A record read right after barrier
  *n - 1* waits longest for its commit, so this is the worst read → committed delay of
  the records epoch *n* publishes;
* **critical split** of an epoch: the phases of the task whose acknowledgement came last
  (it decided ``duration_s``): barrier travel (trigger → its first barrier), alignment,
  synchronous part, upload (waiting included), ack (the rest until the coordinator had it),
  and the coordinator's ``_metadata`` write. The phases add up to ``duration_s +
  metadata_s`` (clock skew between hosts aside).

Thread-safe: one lock around the model's own state; the driver's structures are read
through the copies their own accessors return.
"""
from __future__ import annotations

import collections
import os
import threading
import time

from epochal.graph import NodeKind
from epochal.ui.drilldown import checkpoint_tasks, exceptions, spread, subtasks
from epochal.ui.layout import graph_view

__all__ = ["MAX_POINTS", "MAX_ROWS", "DashboardModel", "critical_split", "process_rss"]

#: checkpoint rows kept (over all attempts) and sent to the page
MAX_ROWS = 500
#: points per time series (an hour at the default one-second metrics interval)
MAX_POINTS = 3600
_PAGE_POINTS = 600  # points sent per poll
_PAGE_ROWS = 200  # checkpoint rows sent per poll (the table shows them; latency uses every kept row)


def process_rss() -> int | None:
    """Resident memory of this process in bytes (``/proc/self/statm``), ``None`` elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def critical_split(entry: dict) -> dict:
    """The phases (seconds) of the task of ``entry`` (a completed epoch of the coordinator's
    history) whose acknowledgement came last: ``barrier``, ``alignment``, ``sync``,
    ``upload``, ``ack``, ``metadata`` (module docstring); ``task`` names it."""
    tasks = entry.get("tasks") or {}
    slowest = max(tasks.items(), key=lambda kv: kv[1].get("ack_s") or 0.0, default=(None, {}))
    task, s = slowest

    def get(k):
        return max(0.0, s.get(k) or 0.0)
    barrier = get("barrier_s")
    alignment = min(get("alignment_s"), barrier)
    upload = get("upload_wait_s") + get("upload_s")
    ack = max(0.0, get("ack_s") - barrier - get("sync_s") - upload)
    return {"task": task, "barrier": barrier - alignment, "alignment": alignment, "sync": get("sync_s"),
            "upload": upload, "ack": ack, "metadata": max(0.0, entry.get("metadata_s") or 0.0)}


class DashboardModel:
    """The page's data for one job (module docstring).

    Args:
        plan: the job's physical plan (its logical nodes are drawn, its tasks map task
            counters to operators).
        source: returns the driver's state now, a dict with ``state``, ``runtime``,
            ``guarantee``, ``checkpoint_root``, ``generation``, ``history`` (the current
            attempt's EpochHistory or ``None``), ``highest_triggered``, ``timeline`` (the
            attempts so far, as ``JobResult.attempt_timeline``), ``restarts`` and
            ``savepoints`` (written ones), and in a job of several regions ``region`` (this
            page's) and ``regions`` (every region's line: name, state, attempt, completed
            epochs, latest epoch, dashboard URL); missing keys count as unknown.
        latest_progress: returns the newest progress event (or ``None``).
    """

    def __init__(self, plan, source, latest_progress):
        self.job = plan.job
        self.graph = graph_view(plan.nodes)
        self._source = source
        self._latest = latest_progress
        self._chains = {t.id: tuple(t.chain) for t in plan.tasks}
        self._source_nodes = {t.id: t.chain[0] for t in plan.tasks if t.is_source}
        self._sinks = {n.name: n.parallelism for n in plan.nodes.values() if n.kind is NodeKind.SINK}
        self._lock = threading.Lock()
        self._rows: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self._aborted_seen: set[int] = set()
        self._series: collections.deque = collections.deque(maxlen=MAX_POINTS)
        self._generation = None
        self._failovers: list[tuple] = []  # (key, entry): every failover restart seen (the driver's log is per attempt)
        self._cpu_at: tuple[float, float] | None = None  # (progress time, this process's CPU seconds)

    # ------------------------------------------------------------------ inputs
    def on_progress(self, progress: dict) -> None:
        """One progress event (the reporter thread): a point of every series."""
        lags = {}
        rss_tasks = 0
        rss_known = False
        loads = [t["cpu_load"] for t in progress.get("tasks", {}).values() if t.get("cpu_load") is not None]
        for task, t in progress.get("tasks", {}).items():
            node = self._source_nodes.get(task)
            if node is not None and t.get("watermark") is not None:
                lag = progress["time"] - t["watermark"]
                lags[node] = max(lags.get(node, lag), lag)  # the source's slowest split
            if t.get("rss_bytes") is not None:
                rss_known = True
                rss_tasks += t["rss_bytes"]
        point = {"time": progress["time"], "records_in_per_s": progress.get("records_in_per_s", 0.0),
                 "records_out_per_s": progress.get("records_out_per_s", 0.0), "watermark_lag_s": lags,
                 "driver_rss": process_rss(), "tasks_rss": rss_tasks if rss_known else None,
                 "driver_cpu": self._driver_cpu(progress["time"]), "tasks_cpu": sum(loads) if loads else None,
                 "backpressure": max((t.get("backpressure_ratio", 0.0) for t in progress.get("tasks", {}).values()),
                                     default=0.0)}
        with self._lock:
            self._series.append(point)
        self._merge(self._source())

    def _driver_cpu(self, now: float) -> float | None:
        """Cores this process (the driver) kept busy since the previous progress event."""
        cpu = time.process_time()
        before, self._cpu_at = self._cpu_at, (now, cpu)
        if before is None or now <= before[0]:
            return None
        return max(0.0, cpu - before[1]) / (now - before[0])

    def _merge(self, state: dict) -> None:
        """Take the current attempt's newest epochs into the rows of every attempt."""
        history = state.get("history")
        if history is None:
            return
        generation = state.get("generation")
        for f in state.get("failovers", ()):
            key = (f.get("generation"), f.get("region"), tuple(f.get("tasks", ())), f.get("cause"))
            with self._lock:
                if all(k != key for k, _ in self._failovers):
                    self._failovers = (self._failovers + [(key, dict(f))])[-MAX_ROWS:]
        completed, aborted = history.completed[-MAX_ROWS:], history.aborted[-MAX_ROWS:]
        changed = False
        with self._lock:
            for e in completed:
                if e["epoch"] in self._rows and self._rows[e["epoch"]]["status"] == "completed":
                    continue
                changed = True
                trigger = e["wall_time"] - e["duration_s"] if e.get("wall_time") is not None else None
                self._rows[e["epoch"]] = {
                    "epoch": e["epoch"], "generation": generation, "status": "completed", "reason": e.get("reason"),
                    "trigger_time": trigger, "wall_time": e.get("wall_time"), "duration_s": e.get("duration_s"),
                    "bytes": e.get("bytes"), "state_bytes": e.get("state_bytes"),
                    "unaligned_bytes": e.get("channel_state_bytes", 0),
                    "unaligned_records": e.get("channel_state_records", 0),
                    "snapshot_kinds": e.get("snapshot_kinds", {}), "split": critical_split(e),
                    "max_alignment_s": e.get("max_alignment_s"), "max_sync_s": e.get("max_sync_s"),
                    "max_upload_s": e.get("max_upload_s"), "latency_s": None, "savepoint": None,
                    "tasks": {t: dict(a) for t, a in (e.get("tasks") or {}).items()}}
            for e in aborted:
                if e["epoch"] in self._aborted_seen:
                    continue
                changed = True
                self._aborted_seen.add(e["epoch"])
                self._rows[e["epoch"]] = {"epoch": e["epoch"], "generation": generation, "status": "aborted",
                                          "reason": e.get("reason"), "detail": str(e.get("detail", ""))[:500],
                                          "wall_time": time.time(), "savepoint": None}
            if changed:
                ordered = sorted(self._rows.items())[-MAX_ROWS:]
                self._rows = collections.OrderedDict(ordered)
                self._aborted_seen &= set(self._rows)
                previous = None
                for _, row in ordered:  # exactly-once latency: completion minus the previous trigger
                    if row["status"] != "completed":
                        continue
                    if previous is not None and row["wall_time"] is not None and previous["trigger_time"]:
                        row["latency_s"] = row["wall_time"] - previous["trigger_time"]
                    previous = row

    # ------------------------------------------------------------------ output
    def view(self) -> dict:
        """Everything the page shows, JSON-able (the ``/api/state`` document): job state,
        graph, ``operators`` (with ``subtasks`` and ``spread``), checkpoint rows (without their
        per-task acknowledgements), ``exceptions``, attempts, restore, savepoints, series,
        latency and sinks. Called per poll; reads the driver's state through ``source()``."""
        state = self._source()
        self._merge(state)
        progress = self._latest() or {}
        savepoints = [dict(s) for s in state.get("savepoints", ())]
        with self._lock:
            rows = list(self._rows.values())
            latency = [{"epoch": r["epoch"], "time": r["wall_time"], "latency_s": r["latency_s"]}
                       for r in rows if r.get("latency_s") is not None]
            counts = {"completed": sum(r["status"] == "completed" for r in rows),
                      "aborted": sum(r["status"] == "aborted" for r in rows)}
            acked = next((r["tasks"] for r in reversed(rows) if r["status"] == "completed" and r.get("tasks")), None)
            rows = [{k: v for k, v in r.items() if k != "tasks"} for r in rows[-_PAGE_ROWS:]]
            series = list(self._series)[-_PAGE_POINTS:]
            failovers = [f for _, f in self._failovers]
        by_epoch = {r["epoch"]: r for r in rows}
        for sp in savepoints:
            if sp.get("epoch") in by_epoch:
                by_epoch[sp["epoch"]]["savepoint"] = sp.get("url")
        timeline = [dict(e) for e in state.get("timeline", ())]
        now = time.time()
        return {
            "job": self.job, "time": now, "state": state.get("state", progress.get("state")),
            "region": state.get("region"), "regions": list(state.get("regions", ())),
            "runtime": state.get("runtime"), "guarantee": state.get("guarantee"),
            "checkpoint_root": state.get("checkpoint_root"), "generation": state.get("generation"),
            "actions": bool(state.get("actions", True)),
            "progress": _summary(progress),
            "graph": self.graph, "operators": self._operators(progress, acked),
            "checkpoints": rows, "counts": counts,
            "attempts": _attempts(timeline, state.get("failovers", ())), "restore": _latest_restore(timeline),
            "exceptions": exceptions(timeline, failovers),
            "savepoints": savepoints, "series": series,
            "latency": latency,
            "sinks": self._sinks_view(rows, state, now),
        }

    def checkpoint(self, epoch: int) -> dict | None:
        """The page of checkpoint ``epoch`` (:func:`epochal.ui.drilldown.checkpoint_tasks`): every
        task's acknowledgement; ``None`` if the model keeps no row of it (any more)."""
        with self._lock:
            row = self._rows.get(epoch)
            row = None if row is None else dict(row)
        return None if row is None else checkpoint_tasks(row, self._chains)

    def _operators(self, progress: dict, acked: dict | None = None) -> dict:
        """Per operator: records/s in and out, records, parallelism, back-pressure (the
        highest share of the last interval any of its tasks waited for credit), CPU (the cores
        its tasks kept busy over the last interval; operators chained into one task share it);
        ``subtasks``, a row per subtask (:func:`epochal.ui.drilldown.subtasks`; ``acked``: the
        newest completed epoch's acknowledgements, for the state sizes) and ``spread``, the
        lowest and highest per subtask of its rates and back-pressure; ``reader``, when the
        operator's source reader reports figures (the CEC window operator: open windows, the
        extent lag, footprints per second; :mod:`epochal.metrics.progress`)."""
        ops = {n["name"]: {"records_in_per_s": 0.0, "records_out_per_s": 0.0, "records_in": 0, "records_out": 0,
                           "backpressure": 0.0, "cpu_load": None, "parallelism": n["parallelism"]}
               for n in self.graph["nodes"]}
        for name, o in progress.get("operators", {}).items():
            if name in ops:
                ops[name].update({k: o[k] for k in ("records_in_per_s", "records_out_per_s", "records_in",
                                                    "records_out")})
                if o.get("reader") is not None:  # its source reader's own figures (eventual checkpoints')
                    ops[name]["reader"] = dict(o["reader"])
        for task, t in progress.get("tasks", {}).items():
            for name in self._chains.get(task, ()):
                if name in ops:
                    ops[name]["backpressure"] = max(ops[name]["backpressure"], t.get("backpressure_ratio") or 0.0)
                    if t.get("cpu_load") is not None:
                        ops[name]["cpu_load"] = (ops[name]["cpu_load"] or 0.0) + t["cpu_load"]
        for name, op in ops.items():
            op["subtasks"] = rows = subtasks(name, self._chains, progress, acked)
            op["spread"] = {k: spread(rows, k) for k in ("records_in_per_s", "records_out_per_s", "backpressure",
                                                         "cpu_load")}
        return ops

    def _sinks_view(self, rows: list[dict], state: dict, now: float) -> list[dict]:  # rows: the newest
        """Open transactions per sink, derived from the epochs (each sink subtask holds one
        transaction per epoch not yet completed, plus the one it writes): count and the age
        of the oldest (begun when the last completed epoch's barrier passed: its trigger)."""
        done = [r for r in rows if r["status"] == "completed"]
        last = done[-1] if done else None
        highest = state.get("highest_triggered")
        in_flight = max(0, (highest or 0) - (last["epoch"] if last else 0)) if highest is not None else 0
        if state.get("state") not in ("running", "restarting", "starting"):
            return [{"sink": s, "parallelism": p, "open_per_subtask": 0, "oldest_age_s": None}
                    for s, p in self._sinks.items()]
        begun = last["trigger_time"] if last and last.get("trigger_time") else None
        return [{"sink": s, "parallelism": p, "open_per_subtask": 1 + in_flight,
                 "oldest_age_s": None if begun is None else max(0.0, now - begun)} for s, p in self._sinks.items()]


def _summary(p: dict) -> dict:
    keys = ("state", "attempt", "uptime_s", "records_in_per_s", "records_out_per_s", "watermark",
            "last_completed_epoch", "last_checkpoint_age_s", "late_dropped", "sequence", "time")
    out = {k: p.get(k) for k in keys}
    out["checkpoints"] = p.get("checkpoints")
    return out


def _attempts(timeline: list[dict], failovers=()) -> list[dict]:
    """One row per attempt: generation, when it started, what it restored, why it ended;
    then one per failover region that restarted alone (``JobResult.failovers``): its new
    generation, the epoch it restored, and which tasks restarted why."""
    rows = [{"generation": e.get("generation"), "started_s": e.get("started_s"),
             "running_s": e.get("running_s"), "failed_s": e.get("failed_s"),
             "restored_epoch": e.get("restored_epoch"), "restored_bytes": e.get("restored_bytes"),
             "cause": (e.get("cause") or "").splitlines()[0][:500] if e.get("cause") else None}
            for e in timeline]
    return rows + [{"generation": f.get("generation"), "started_s": None, "running_s": None, "failed_s": None,
                    "restored_epoch": f.get("restored_epoch"), "restored_bytes": None,
                    "cause": f"failover region {', '.join(f.get('tasks', ()))} restarted alone: {f.get('cause', '')}"}
                   for f in failovers]


def _latest_restore(timeline: list[dict]) -> dict | None:
    """The newest attempt that restored a checkpoint, and why: the previous attempt's failure
    (or ``resume`` / ``restore_from`` for the first attempt)."""
    for i in range(len(timeline) - 1, -1, -1):
        e = timeline[i]
        if e.get("restored_epoch") is None:
            continue
        before = timeline[i - 1] if i > 0 else None
        cause = (before.get("cause") or "") if before else ""
        return {"generation": e.get("generation"), "epoch": e.get("restored_epoch"),
                "bytes": e.get("restored_bytes"), "started_s": e.get("started_s"),
                "cause": cause.splitlines()[0][:500] if cause else "the job started from an earlier checkpoint "
                                                                   "(resume or restore_from)"}
    return None
