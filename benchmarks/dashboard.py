"""What the web dashboard costs a job: throughput with and without a page polling it, side by side.

The job is the keyed word count of ``benchmarks/throughput.py`` (two shuffles, unthrottled
GeneratorSource, jsonl FileSink), exactly-once with 1 s checkpoints, on the local runtime
by default. Two modes run the very same dataflow:

==========  ====================================================================
no-ui       ``MetricsConfig()`` — no dashboard (the metrics reporter still runs)
ui-polled   ``MetricsConfig(ui=True)`` and a page polling ``/api/state`` the whole run:
            ``--poller http`` (default) fetches it like the page's script does (every
            ``--poll-interval`` s), ``--poller browser`` opens the real page in the system
            Chromium (Playwright), which also draws it — on the same cores as the job
==========  ====================================================================

Repetitions are interleaved (rep 1: a b, rep 2: b a, ...) so drift hits both modes alike;
the summary gives each mode's median records/s with every raw value and the ratio
``ui-polled / no-ui`` of the medians. Polls that failed are counted (they must be 0).

Usage::

    python benchmarks/dashboard.py                                # 400k lines, 5 repetitions
    python benchmarks/dashboard.py --poller browser --poll-interval 1
    python benchmarks/dashboard.py --smoke                        # seconds; a temp file
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloudpickle  # noqa: E402
import harness  # noqa: E402
import throughput  # noqa: E402  (its wordcount; registers the workload module for pickling)

cloudpickle.register_pickle_by_value(throughput)  # its BucketCount and lambdas run in the tasks

import epochal as ep  # noqa: E402

MODES = ("no-ui", "ui-polled")
CHROMIUM = "/usr/bin/chromium"


class HttpPoller:
    """Fetches ``/api/state`` every ``interval`` seconds on a thread, as the page's script does."""

    def __init__(self, url: str, interval: float, running):
        base, token = url.split("/?token=")
        self.running = running  # a poll after the job ended (its server closed) is no failure
        self.request = urllib.request.Request(base + "/api/state", headers={"X-Epochal-Token": token})
        self.interval, self.polls, self.failures, self.bytes = interval, 0, 0, 0
        self.errors: list[str] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.request, timeout=10) as r:
                    doc = r.read()
                json.loads(doc)
                self.polls += 1
                self.bytes += len(doc)
            except Exception as exc:
                if self.running():
                    self.failures += 1
                    self.errors.append(f"{time.monotonic() - self.t0:.1f}s: {type(exc).__name__}: {exc}"[:300])
            self._stop.wait(self.interval)

    def close(self) -> dict:
        self._stop.set()
        self._thread.join(15)
        return {"polls": self.polls, "failed_polls": self.failures, "poll_errors": self.errors,
                "mean_response_bytes": self.bytes / self.polls if self.polls else None}


class BrowserPoller:
    """The real page in the system Chromium (it polls at ``?poll=`` ms and draws every answer).
    The browser starts once per benchmark (:meth:`launch`), before any job; each run opens a page."""

    _browser = None

    @classmethod
    def launch(cls) -> None:
        from playwright.sync_api import sync_playwright

        cls._pw = sync_playwright().start()
        cls._browser = cls._pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])

    @classmethod
    def shutdown(cls) -> None:
        if cls._browser is not None:
            cls._browser.close()
            cls._pw.stop()

    def __init__(self, url: str, interval: float, running):
        self.page = self._browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.goto(f"{url}&poll={int(interval * 1000)}")
        self.polls, self.failed = 0, False

    def stop(self) -> None:
        """Called while the job still runs: read what the page did so far."""
        self.polls = int(self.page.evaluate("Number(document.body.dataset.polls || 0)"))
        self.failed = not self.page.is_hidden("#error")

    def close(self) -> dict:
        self.page.close()
        return {"polls": self.polls, "failed_polls": int(self.failed)}


def _cpu() -> float:
    """CPU seconds of this process (the driver, and the HTTP poller if any), all threads."""
    t = os.times()
    return t.user + t.system


def poll_cpu_ms(handle, n: int = 20) -> float:
    """CPU milliseconds one poll costs the driver: building ``/api/state`` and encoding it,
    timed ``n`` times on this thread's own CPU clock (unaffected by other processes)."""
    dashboard = handle._driver.dashboard  # the benchmark looks inside; users see only the page
    t0 = time.thread_time()
    for _ in range(n):
        json.dumps(dashboard.model.view(), default=str)
    return (time.thread_time() - t0) * 1000 / n


def full_page_poll_cpu_ms(n: int = 20) -> dict:
    """The most one poll can cost: a model holding its limits (every checkpoint row kept,
    every series point), 8 tasks per epoch, built from the benchmark's own job plan."""
    from epochal.epochs.history import EpochHistory
    from epochal.ui.model import MAX_POINTS, MAX_ROWS, DashboardModel

    plan = throughput.wordcount("bench-dashboard-full", "/tmp/never-written", 1000, 2, 4).plan()
    history = EpochHistory(MAX_ROWS)
    sample = {"barrier_s": 0.01, "alignment_s": 0.002, "sync_s": 0.001, "upload_wait_s": 0.0, "upload_s": 0.02,
              "durable_s": 0.0, "ack_s": 0.035}
    for e in range(1, MAX_ROWS + 1):
        history.add_completed({"epoch": e, "reason": "periodic", "duration_s": 0.04, "wall_time": 1e9 + e,
                               "bytes": 5000, "state_bytes": 90000, "metadata_s": 0.003,
                               "tasks": {t.id: dict(sample) for t in plan.tasks}})
    state = {"state": "running", "generation": 0, "history": history, "timeline": [], "savepoints": [],
             "highest_triggered": MAX_ROWS}
    model = DashboardModel(plan, lambda: state, lambda: None)
    tasks = {t.id: {"watermark": 1e9, "rss_bytes": 1 << 27, "backpressure_ratio": 0.1} for t in plan.tasks}
    for i in range(MAX_POINTS):
        model.on_progress({"time": 1e9 + i, "records_in_per_s": 1e4, "records_out_per_s": 1e4, "tasks": tasks})
    t0 = time.thread_time()
    for _ in range(n):
        doc = json.dumps(model.view(), default=str)
    return {"cpu_ms": (time.thread_time() - t0) * 1000 / n, "bytes": len(doc), "rows": MAX_ROWS,
            "points_kept": MAX_POINTS, "tasks": len(plan.tasks)}


def run_once(mode: str, args, spark, rep: int) -> dict:
    work = tempfile.mkdtemp(prefix=f"epochal-bench-dashboard-{mode}-", dir=args.tmp)
    flow = throughput.wordcount("bench-dashboard", os.path.join(work, "out"), args.records, args.parallelism,
                                args.splits)
    expected = (args.records // args.splits) * args.splits
    record = {"mode": mode, "repetition": rep, "lines": expected, "loadavg_1m_before": os.getloadavg()[0],
              "started_at": harness.now_iso()}
    metrics = ep.MetricsConfig(ui=mode == "ui-polled", log=False)
    checkpoint = ep.CheckpointConfig(interval=args.interval, storage="file://" + os.path.join(work, "ckpt"))
    poller = None
    try:
        tree0 = harness.tree_cpu_seconds()
        handle = flow.start(checkpoint=checkpoint, runtime=args.runtime, spark=spark, metrics=metrics)
        cpu0 = _cpu()
        if mode == "ui-polled":
            poller = (BrowserPoller if args.poller == "browser" else HttpPoller)(
                handle.ui_url, args.poll_interval,
                # a poll that fails while the driver closes its server after the job ended is no failure
                lambda: handle.running and handle._driver.state not in ("finished", "failed"))
        deadline = time.monotonic() + args.run_timeout
        while True:  # wait, and let a browser poller read its page while the job still runs
            if isinstance(poller, BrowserPoller):
                poller.stop()
            try:
                result = handle.wait(1.0)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        record["driver_cpu_s"] = _cpu() - cpu0
        tree1 = harness.tree_cpu_seconds()
        # every process of the run: driver, tasks, and the page's client (the browser with --poller browser)
        record["tree_cpu_s"] = tree1 - tree0 if tree0 is not None and tree1 is not None else None
        if poller is not None:  # the page's document at its largest of the run (every epoch in it)
            record["poll_cpu_ms"] = poll_cpu_ms(handle)
            record["checkpoint_rows"] = len(handle._driver.dashboard.model.view()["checkpoints"])
            record.update(poller.close())
            poller = None
    except Exception as exc:  # reported, not hidden; the other runs go on
        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        return record
    finally:
        if poller is not None:
            poller.close()
        shutil.rmtree(work, ignore_errors=True)
    record.update({"duration_s": result.duration_s, "records_in": result.records_in,
                   "records_per_s": result.records_in / result.duration_s, "attempts": result.attempts,
                   "completed_epochs": len(result.completed_epochs),
                   "records_per_cpu_s": result.records_in / record["tree_cpu_s"] if record.get("tree_cpu_s") else None})
    if result.records_in != expected:
        record["error"] = f"sources read {result.records_in} lines, expected {expected}"
    if record.get("failed_polls"):
        record["error"] = f"{record['failed_polls']} polls of the dashboard failed"
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runtime", default="local", choices=("local", "spark"))
    p.add_argument("--records", type=int, default=400_000, help="input lines")
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--splits", type=int, default=4)
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval (s)")
    p.add_argument("--poller", default="http", choices=("http", "browser"))
    p.add_argument("--poll-interval", type=float, default=2.0, help="seconds between the page's polls (the page: 2)")
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--tmp", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true", help="a few seconds: 20k lines, 1 repetition")
    args = p.parse_args(argv)
    if args.smoke:
        args.records, args.repetitions = min(args.records, 20_000), 1
    info = harness.machine()
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import start_local_session

        spark = start_local_session()
    if args.poller == "browser":
        BrowserPoller.launch()
    runs = []
    for rep in range(args.repetitions):
        for mode in harness.rotated(list(MODES), rep):
            run = run_once(mode, args, spark, rep)
            print(json.dumps({k: v for k, v in run.items() if k != "started_at"}), flush=True)
            runs.append(run)
    BrowserPoller.shutdown()
    summary = {}
    for mode in MODES:
        rates = [r["records_per_s"] for r in runs if r["mode"] == mode and "error" not in r]
        summary[mode] = {"records_per_s": harness.summary(rates),
                         "driver_cpu_s_per_s": harness.summary([r["driver_cpu_s"] / r["duration_s"] for r in runs
                                                                if r["mode"] == mode and "error" not in r]),
                         "records_per_cpu_s": harness.summary([r["records_per_cpu_s"] for r in runs if r["mode"] == mode
                                                               and r.get("records_per_cpu_s")])}
    polls = [r["poll_cpu_ms"] for r in runs if r.get("poll_cpu_ms") is not None]
    summary["poll_cpu_ms"] = harness.summary(polls)
    # the share of one core the page's polling costs the driver, from the per-poll CPU
    summary["poll_core_share"] = (harness.median(polls) / 1000 / args.poll_interval) if polls else None
    summary["full_page"] = full_page_poll_cpu_ms()
    summary["full_page_core_share"] = summary["full_page"]["cpu_ms"] / 1000 / args.poll_interval
    base, polled = (summary[m]["records_per_s"]["median"] for m in MODES)
    summary["ratio_ui_polled_to_no_ui"] = polled / base if base and polled else None
    # CPU per record of every process of the run (far less sensitive to other tenants than wall time)
    base, polled = (summary[m]["records_per_cpu_s"]["median"] for m in MODES)
    summary["cpu_efficiency_ratio_ui_polled_to_no_ui"] = polled / base if base and polled else None
    # What the dashboard adds to the driver's CPU (server, model, and this benchmark's own HTTP
    # poller, which runs in the driver's process: an upper bound), as a share of the CPU the
    # whole job uses without it. On a machine whose cores the job saturates, the job loses at
    # most that share of its throughput; unlike wall-clock throughput, CPU time barely moves
    # with other tenants' load.
    job_cores = harness.median([r["tree_cpu_s"] / r["duration_s"] for r in runs
                                if r["mode"] == "no-ui" and "error" not in r and r.get("tree_cpu_s")])
    extra = [summary["ui-polled"]["driver_cpu_s_per_s"]["median"], summary["no-ui"]["driver_cpu_s_per_s"]["median"]]
    summary["job_cores_no_ui"] = job_cores
    summary["dashboard_extra_driver_cores"] = extra[0] - extra[1] if None not in extra else None
    summary["dashboard_cpu_share_of_job"] = (summary["dashboard_extra_driver_cores"] / job_cores
                                             if job_cores and summary["dashboard_extra_driver_cores"] is not None
                                             else None)
    doc = {"benchmark": "dashboard", "command": [sys.executable, *sys.argv], "args": vars(args), "machine": info,
           "finished_at": harness.now_iso(),
           "errors": [r["error"] for r in runs if "error" in r], "summary": summary, "runs": runs}
    out = Path(args.out) if args.out else (Path(tempfile.mkstemp(suffix=".json")[1]) if args.smoke
                                           else harness.RESULTS / "dashboard.json")
    harness.write_json(out, doc)
    print(f"ui-polled / no-ui throughput: {summary['ratio_ui_polled_to_no_ui']}; the dashboard's extra driver CPU: "
          f"{summary['dashboard_extra_driver_cores']} cores = {summary['dashboard_cpu_share_of_job']} of the job's "
          f"{summary['job_cores_no_ui']} cores -> {out}")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
