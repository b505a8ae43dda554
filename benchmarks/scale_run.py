"""One run of ``benchmarks/scale.py``: the real driver, ``n`` simulated tasks, one epoch interval.

The job is ``n`` parallel pipelines (``source(p=n) → FileSink``, chained: ``n`` tasks, each
its own failover region) started through :func:`epochal.runtime.driver.job.start_job` with
a :class:`scale_sim.SimLauncher`: everything on the driver's side is the product's code —
plan, attempts, launch units, coordinator server, ``_metadata`` (signed, as on a cluster),
retention, dashboard — and the tasks speak the wire protocol over pinned TLS.

Figures of a run (seconds unless named otherwise):

* per epoch every task saw whole (trigger, ack and completion at all ``n``): ``beyond_slowest``
  = last task told "complete" − first task triggered − the longest task's own work (trigger
  received → ack sent): the coordinator's overhead over a perfect one; split into
  ``trigger_fanout`` (first → last task triggered) and ``ack_to_complete`` (last ack sent →
  last task told "complete"; ``ack_to_first_complete`` to the first task);
* the driver process's CPU share (user + system CPU / wall time) and RSS over the steady
  window (epoch ``first + 1`` to the last counted one), with the dashboard polled meanwhile;
* ``_metadata`` bytes and ``metadata_s`` (its write) per epoch (the coordinator's history);
* ``restore_plan_s``: what the driver runs before an attempt that restores —
  ``storage.latest_restorable()`` (every state file's size and SHA-256 checked) and
  ``compatibility.enforce`` — timed after the job ended, on its checkpoints;
* ``failover``: a task failing on schedule restarts its region alone: ``down_s`` (failure →
  its region said hello again) and ``running_s`` (→ running) from the driver's failover log;
* ``dashboard_ms``: ``GET /api/state`` response times, polled every 2 s as the page does.

``os.getloadavg()`` is recorded at the start and end of every run: on a shared machine the
figures are taken under whatever load it carries.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_sim import SimLauncher  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.backends.layout import METADATA_FILE, chk_name  # noqa: E402
from epochal.config import MetricsConfig, RestartStrategy  # noqa: E402
from epochal.runtime.driver import compatibility  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402
from epochal.sources.collection import CollectionSource  # noqa: E402
from epochal.ui.model import process_rss  # noqa: E402

SIGNING_KEY = b"scale-benchmark-signing-key-0123"  # signed as on a cluster, without writing ~/.epochal


def flow_of(n: int, out_dir: str) -> ep.Dataflow:
    flow = ep.Dataflow(f"scale-{n}", max_parallelism=max(128, n))
    flow.source("src", CollectionSource([], num_splits=n), parallelism=n).sink("out", FileSink(out_dir, format="jsonl"))
    return flow


def pct(values, q: float):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def summary(values) -> dict:
    return {"p50": pct(values, 50), "p99": pct(values, 99), "max": max(values) if values else None,
            "count": len(values)}


def merge_epochs(stats: list[dict]) -> dict[int, dict]:
    """Per epoch, the minima/maxima over every simulator process."""
    merged: dict[int, dict] = {}
    for proc in stats:
        for epoch, fig in proc["epochs"].items():
            m = merged.setdefault(epoch, {})
            for what, value in fig.items():
                if what.endswith("_n"):
                    m[what] = m.get(what, 0) + value
                else:
                    lo, hi = m.get(what, value)
                    m[what] = (min(lo, value[0]), max(hi, value[1]))
    return merged


def epoch_overheads(merged: dict[int, dict], n: int) -> dict[int, dict]:
    """The overhead figures of every epoch all ``n`` tasks saw whole (module docstring)."""
    out = {}
    for epoch, m in sorted(merged.items()):
        if not all(m.get(f"{w}_n") == n for w in ("trigger", "ack", "complete", "work")):
            continue
        out[epoch] = {"beyond_slowest": m["complete"][1] - m["trigger"][0] - m["work"][1],
                      "trigger_fanout": m["trigger"][1] - m["trigger"][0],
                      "ack_to_complete": m["complete"][1] - m["ack"][1],
                      "ack_to_first_complete": m["complete"][0] - m["ack"][1],
                      "work_max": m["work"][1]}
    return out


class LoopBusy:
    """Wall time the coordinator's loop thread spends handling messages and ticks
    (``CoordinatorServer._handle`` / ``_tick``, patched for the run): its busy share."""

    def __init__(self):
        from epochal.runtime.driver.coordinator_server import CoordinatorServer

        self.cls, self.originals = CoordinatorServer, (CoordinatorServer._handle, CoordinatorServer._tick)
        self.wall = 0.0
        handle, tick = self.originals

        def timed(fn):
            def run(server, *args):
                t0 = time.perf_counter()
                try:
                    return fn(server, *args)
                finally:
                    self.wall += time.perf_counter() - t0
            return run
        CoordinatorServer._handle, CoordinatorServer._tick = timed(handle), timed(tick)

    def restore(self) -> None:
        self.cls._handle, self.cls._tick = self.originals


class Sampler(threading.Thread):
    """Polls the driver (every ``period``): its RSS, the completed epochs, the dashboard."""

    def __init__(self, driver, window: tuple[int, int], busy: LoopBusy, period: float = 0.05,
                 dashboard_every: float = 2.0):
        super().__init__(name="scale-sampler", daemon=True)
        self.driver, self.window, self.period, self.dashboard_every = driver, window, period, dashboard_every
        self.busy = busy
        self.rss: list[int] = []
        self.marks: dict[int, tuple[float, float, float]] = {}  # epoch -> (monotonic, cpu s, loop busy s) when seen completed
        self.dashboard_ms: list[float] = []
        self.dashboard_bytes = 0
        self.dashboard_errors: list[str] = []
        self.stop = threading.Event()

    def _api(self):
        url = self.driver.dashboard.url if self.driver.dashboard is not None else None
        if url is None:
            return
        parts = urlsplit(url)
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(f"{parts.scheme}://{parts.netloc}/api/state?{parts.query}", timeout=30) as r:
                body = r.read()
            self.dashboard_ms.append((time.monotonic() - t0) * 1000)
            self.dashboard_bytes = len(body)
        except Exception as exc:
            self.dashboard_errors.append(f"{type(exc).__name__}: {exc}")

    def run(self) -> None:
        last_ui = time.monotonic()
        lo, hi = self.window
        while not self.stop.is_set():
            server = self.driver.server
            history = getattr(server, "history", None)
            if history is not None:
                done = {e["epoch"] for e in history.completed}
                now, cpu = time.monotonic(), sum(os.times()[:2])
                for epoch in (lo, hi):
                    if epoch in done and epoch not in self.marks:
                        self.marks[epoch] = (now, cpu, self.busy.wall)
                rss = process_rss()
                if rss:
                    self.rss.append(rss)
                if lo in self.marks and hi not in self.marks and now - last_ui >= self.dashboard_every:
                    last_ui = now
                    self._api()
            self.stop.wait(self.period)


class LoopProfile:
    """cProfile of the coordinator's loop thread (``CoordinatorServer._loop``) while active."""

    def __init__(self):
        import cProfile

        from epochal.runtime.driver.coordinator_server import CoordinatorServer

        self.cls, self.original = CoordinatorServer, CoordinatorServer._loop
        self.profile = cProfile.Profile()
        profile, original = self.profile, self.original
        CoordinatorServer._loop = lambda server: profile.runcall(original, server)

    def report(self, top: int = 25) -> str:
        import io
        import pstats

        self.cls._loop = self.original
        out = io.StringIO()
        pstats.Stats(self.profile, stream=out).sort_stats("tottime").print_stats(top)
        return out.getvalue()


def run_once(n: int, interval: float, *, epochs: int, delay: float, jitter: float, processes: int,
             state: str = "file", state_bytes: int = 1024, fail: dict | None = None, root: str | None = None,
             connect_parallel: int = 8, timeout: float = 900.0, seed: int = 7, profile: bool = False) -> dict:
    """One run (module docstring); ``fail``: ``{task index: epoch offset}`` of scheduled failures;
    ``root``: where checkpoints and output go (``None``: a temporary directory, removed after)."""
    logging.getLogger("epochal").setLevel(logging.WARNING)
    if root is None:
        with tempfile.TemporaryDirectory(prefix="epochal-scale-") as tmp:
            return run_once(n, interval, epochs=epochs, delay=delay, jitter=jitter, processes=processes, state=state,
                            state_bytes=state_bytes, fail=fail, root=tmp, connect_parallel=connect_parallel,
                            timeout=timeout, seed=seed, profile=profile)
    out_dir = tempfile.mkdtemp(prefix="epochal-scale-out-", dir=root)
    load_start = os.getloadavg()
    t_plan = time.monotonic()
    flow = flow_of(n, out_dir)
    plan_s = time.monotonic() - t_plan
    settings = {"delay": delay, "jitter": jitter, "epochs": epochs, "state": state, "state_bytes": state_bytes,
                "fail": dict(fail or {}), "seed": seed, "connect_parallel": connect_parallel, "first_epoch": 1}
    launcher = SimLauncher(processes, settings)
    loop_profile = LoopProfile() if profile else None
    loop_busy = LoopBusy()
    checkpoint = ep.CheckpointConfig(interval=interval, storage=f"file://{root}/ckpt", signing_key=SIGNING_KEY,
                                     timeout=max(120.0, 20 * interval), retained=2)
    t0 = time.monotonic()
    cpu0 = sum(os.times()[:2])
    handle = flow.start(runtime="local", launcher=launcher, checkpoint=checkpoint,
                        restart=RestartStrategy(max_attempts=len(fail or {}) + 2, delay=0.0),
                        metrics=MetricsConfig(ui=True), guarantee="exactly-once")
    driver = handle._driver
    window = (2, epochs)
    sampler = Sampler(driver, window, loop_busy)
    sampler.start()
    try:
        result = handle.wait(timeout)
    finally:
        sampler.stop.set()
        sampler.join(5)
        stats = launcher.collect()
        launcher.stop()
    wall_s = time.monotonic() - t0
    loop_busy.restore()
    server = driver.server
    fanouts = [sec for targets, sec in getattr(getattr(server, "fanout", None), "fanouts", ()) if targets >= n / 2]
    deleter = getattr(driver, "deleter", None)
    if loop_profile is not None:
        print(loop_profile.report(), file=sys.stderr)
    merged = merge_epochs(stats)
    overheads = epoch_overheads(merged, n)
    history = result.completed_epochs
    storage = driver.storage
    meta_bytes = {}
    for epoch in storage.completed_checkpoints():
        path = Path(root) / "ckpt" / flow.name / chk_name(epoch) / METADATA_FILE
        if path.exists():
            meta_bytes[epoch] = path.stat().st_size
    t_restore = time.monotonic()
    latest = storage.latest_restorable()
    compatibility.enforce(driver.plan, latest[1], False, logging.getLogger("epochal"))
    restore_plan_s = time.monotonic() - t_restore
    steady = None
    if window[0] in sampler.marks and window[1] in sampler.marks:
        (ta, ca, ba), (tb, cb, bb) = sampler.marks[window[0]], sampler.marks[window[1]]
        steady = {"wall_s": tb - ta, "driver_cpu_s": cb - ca, "driver_cpu_share": (cb - ca) / (tb - ta)
                  if tb > ta else None, "loop_busy_share": (bb - ba) / (tb - ta) if tb > ta else None}
    failovers = [{k: f.get(k) for k in ("region", "down_s", "running_s", "restored_epoch", "pending_epochs")}
                 for f in result.failovers]
    sim_cpu = sum(p["cpu_s"] for p in stats)
    return {
        "n": n, "interval_s": interval, "epochs": epochs, "delay_s": delay, "jitter": jitter, "state": state,
        "state_bytes": state_bytes, "processes": processes, "ack_workers": 32, "ok": not result.failures or bool(result.failovers),
        "attempts": result.attempts, "whole_attempts": len(result.attempt_timeline), "completed_epochs": len(history),
        "load_start": load_start, "load_end": os.getloadavg(), "wall_s": wall_s, "plan_compile_s": plan_s,
        "connected_s": (driver.timeline[0].get("connected_s") if driver.timeline else None),
        "running_s": (driver.timeline[0].get("running_s") if driver.timeline else None),
        "beyond_slowest_s": summary([o["beyond_slowest"] for o in overheads.values()]),
        "trigger_fanout_s": summary([o["trigger_fanout"] for o in overheads.values()]),
        "ack_to_complete_s": summary([o["ack_to_complete"] for o in overheads.values()]),
        "ack_to_first_complete_s": summary([o["ack_to_first_complete"] for o in overheads.values()]),
        "task_work_max_s": summary([o["work_max"] for o in overheads.values()]),
        "whole_epochs": len(overheads),
        # the driver's own share: a broadcast to the tasks queued -> its last frame written (None before
        # the fan-out existed), and retention's deletes on the deleter thread (not the loop's)
        "driver_fanout_s": summary(fanouts) if fanouts else None,
        "deleter": ({"batches": deleter.batches, "epochs": deleter.epochs_deleted, "seconds": deleter.seconds,
                     "failures": deleter.failures} if deleter is not None else None),
        "epoch_duration_s": summary([e["duration_s"] for e in history]),
        "metadata_write_s": summary([e.get("metadata_s") or 0.0 for e in history]),
        "metadata_bytes": statistics.mean(meta_bytes.values()) if meta_bytes else None,
        "metadata_bytes_per_task": statistics.mean(meta_bytes.values()) / n if meta_bytes else None,
        "restore_plan_s": restore_plan_s,
        "steady": steady,
        "driver_rss_bytes": {"max": max(sampler.rss) if sampler.rss else None,
                             "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024},
        "driver_cpu_total_s": sum(os.times()[:2]) - cpu0, "sim_cpu_s": sim_cpu,
        "dashboard_ms": summary(sampler.dashboard_ms), "dashboard_bytes": sampler.dashboard_bytes,
        "dashboard_errors": sampler.dashboard_errors[:3],
        "failovers": failovers,
        "failures": [str(f).splitlines()[0][:300] for f in result.failures],
        "sim_counts": [p["counts"] for p in stats],
        "state_files_verified": sum(1 for _ in latest[1]["tasks"]),
    }


if __name__ == "__main__":
    print(json.dumps(run_once(10, 0.2, epochs=5, delay=0.02, jitter=0.5, processes=1), indent=1, default=str))
