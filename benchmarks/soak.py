"""Soak: does a job that runs for months keep its memory? A compressed month.

An unbounded keyed job (a rate-limited generator → ``key_by`` → ``reduce`` → FileSink,
exactly-once) checkpoints every 50 ms and publishes a progress event every 0.2 s — at
those rates ten minutes are 12,000 epochs, what a job with a 1 s interval does in three
hours and one with a 1 min interval in eight days. While it runs, the RSS (and PSS) of the
driver process and of every task process is sampled from ``/proc`` every few seconds, with
the number of the newest completed epoch. After a warm-up (the first ``--warmup`` epochs:
imports, caches, the allocator's arenas and the driver's bounded epoch history filling up)
a least-squares line of each process's RSS against the epoch gives its growth in bytes per
epoch. The goal (issue 23): at most 1 KB per epoch for the driver and the tasks together.

On ``--runtime spark`` the task processes are Spark's Python workers and the driver's JVM
is sampled too (reported apart: it is Spark's, not epochal's). Task processes are found as
this process's descendants whose name is ``ep <task id>`` (what a task shows in ``ps``).

    python benchmarks/soak.py [--runtime local spark] [--minutes 10] [--epochs 10000]
                              [--interval 0.05] [--metrics 0.2] [--smoke] [--out PATH]

Writes ``benchmarks/results/soak.json`` (``--smoke``: a temporary file, ~30 s per runtime).
Run it under the bench lock on a shared machine; the load average is recorded.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
GOAL_BYTES_PER_EPOCH = 1024


def numbers(split: int, offset: int):
    """Split ``split``'s records from ``offset`` on, for ever: ``(key, 1)``."""
    i = offset
    while True:
        yield (i * 7919 + split) % KEYS, 1
        i += 1


KEYS = 1000


def add(a, b):
    return a[0], a[1] + b[1]


# ------------------------------------------------------------------ /proc sampling
def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> list[int]:
    children, out, stack = _proc_children(), [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def memory(pid: int) -> dict | None:
    """``{"rss", "pss"}`` in bytes of process ``pid`` (None once it is gone)."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    rss = next((int(row.split()[1]) * 1024 for row in status.splitlines() if row.startswith("VmRSS:")), None)
    rollup = _read(f"/proc/{pid}/smaps_rollup") or ""
    pss = next((int(row.split()[1]) * 1024 for row in rollup.splitlines() if row.startswith("Pss:")), None)
    return {"rss": rss, "pss": pss}


def task_processes() -> dict[str, int]:
    """task id → pid of this process's descendants named ``ep <task id>``."""
    found = {}
    for pid in _descendants(os.getpid()):
        name = (_read(f"/proc/{pid}/comm") or "").strip()
        if name.startswith("ep "):
            found[name[3:]] = pid
    return found


def jvm_processes() -> list[int]:
    return [pid for pid in _descendants(os.getpid()) if (_read(f"/proc/{pid}/comm") or "").strip() == "java"]


class Sampler(threading.Thread):
    """Every ``period`` s: the newest completed epoch and the memory of every process."""

    def __init__(self, period: float, progress: dict):
        super().__init__(name="soak-sampler", daemon=True)
        self.period, self.progress, self.samples = period, progress, []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(self.period):
            self.sample()

    def sample(self):
        tasks = {task: memory(pid) for task, pid in task_processes().items()}
        jvm = [memory(pid) for pid in jvm_processes()]
        self.samples.append({
            "t": time.monotonic(), "epoch": self.progress.get("epoch"), "completed": self.progress.get("completed"),
            "driver": memory(os.getpid()), "tasks": {k: v for k, v in tasks.items() if v is not None},
            "jvm": [m for m in jvm if m is not None], "attempt": self.progress.get("attempt"),
        })


# ------------------------------------------------------------------ growth
def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None with fewer than 3 points or no spread in x."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def growth(samples: list[dict], warmup_epochs: int) -> dict:
    """Bytes per epoch after warm-up: per process (RSS and PSS), the driver, the tasks summed,
    and both together."""
    steady = [s for s in samples if s["epoch"] is not None and s["epoch"] >= warmup_epochs]
    out = {"samples": len(steady), "from_epoch": steady[0]["epoch"] if steady else None,
           "to_epoch": steady[-1]["epoch"] if steady else None}
    for kind in ("rss", "pss"):
        driver = slope([(s["epoch"], s["driver"][kind]) for s in steady if s["driver"] and s["driver"][kind]])
        tasks = {}
        for task in sorted({t for s in steady for t in s["tasks"]}):
            pts = [(s["epoch"], s["tasks"][task][kind]) for s in steady
                   if task in s["tasks"] and s["tasks"][task][kind] is not None]
            tasks[task] = slope(pts)
        jvm = slope([(s["epoch"], sum(m[kind] or 0 for m in s["jvm"])) for s in steady if s["jvm"]])
        task_sum = sum(v for v in tasks.values() if v is not None) if tasks else None
        out[kind] = {
            "driver_bytes_per_epoch": driver, "tasks_bytes_per_epoch": task_sum, "per_task": tasks,
            "total_bytes_per_epoch": None if driver is None or task_sum is None else driver + task_sum,
            "jvm_bytes_per_epoch": jvm,
        }
    total = out["rss"]["total_bytes_per_epoch"]
    out["goal_bytes_per_epoch"] = GOAL_BYTES_PER_EPOCH
    out["goal_met"] = None if total is None else total <= GOAL_BYTES_PER_EPOCH
    return out


# ------------------------------------------------------------------ one run
def one_run(runtime: str, args, spark) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"epochal-soak-{runtime}-")
    progress: dict = {}
    events = {"count": 0, "restarts": 0, "states": set()}

    def listener(p):
        events["count"] += 1
        events["states"].add(p["state"])
        events["restarts"] = max(events["restarts"], len(p.get("restarts") or ()))
        progress.update(epoch=p["last_completed_epoch"], completed=p["checkpoints"]["completed"],
                        attempt=p.get("attempt"))

    flow = ep.Dataflow(f"soak-{runtime}", parallelism=args.parallelism)
    (flow.source("numbers", ep.sources.GeneratorSource(numbers, num_splits=args.parallelism,
                                                       records_per_second=args.rate))
        .key_by(lambda r: r[0]).reduce("count", add)
        .sink("out", FileSink(os.path.join(tmp, "out"), format="jsonl")))
    sampler = Sampler(args.sample, progress)
    rec: dict = {"runtime": runtime, "epoch_interval_s": args.interval, "metrics_interval_s": args.metrics}
    t0 = time.monotonic()
    handle = flow.start(runtime=runtime, spark=spark,
                        checkpoint=ep.CheckpointConfig(interval=args.interval, storage=f"file://{tmp}/ckpt",
                                                       timeout="30s"),
                        metrics=ep.MetricsConfig(interval=args.metrics, listener=listener, log=False, status=False))
    sampler.start()
    deadline = t0 + args.minutes * 60
    try:
        while True:
            time.sleep(1.0)
            epoch = progress.get("epoch") or 0
            if time.monotonic() >= deadline and epoch >= args.epochs:
                break
            if time.monotonic() >= deadline + args.minutes * 60:  # far too slow: report what there is
                rec["error"] = f"only {epoch} epochs after {2 * args.minutes} min"
                break
            if not handle.running:
                rec["error"] = "the job ended by itself"
                break
    finally:
        sampler.sample()
        sampler.stop.set()
        sampler.join()
        restarts = events["restarts"]  # before the cancel (which ends the attempt as a failure)
        handle.cancel()
        try:
            handle.wait(120)
        except Exception:  # cancelled: JobFailedError("cancelled by the user") is the expected end
            pass
    rec["wall_s"] = time.monotonic() - t0
    rec["epochs"] = progress.get("epoch")
    rec["completed_epochs"] = progress.get("completed")
    rec["epochs_per_s"] = (rec["epochs"] or 0) / rec["wall_s"]
    rec["progress_events"] = events["count"]
    rec["restarts"] = restarts
    rec["warmup_epochs"] = min(args.warmup, (rec["epochs"] or 0) // 3)
    rec["growth"] = growth(sampler.samples, rec["warmup_epochs"])
    rec["samples"] = [{"epoch": s["epoch"], "t": round(s["t"] - t0, 2),
                       "driver_rss": s["driver"]["rss"] if s["driver"] else None,
                       "tasks_rss": {k: v["rss"] for k, v in s["tasks"].items()},
                       "jvm_rss": sum(m["rss"] or 0 for m in s["jvm"]) if s["jvm"] else None}
                      for s in sampler.samples]
    first = next((s for s in sampler.samples if s["epoch"] and s["epoch"] >= rec["warmup_epochs"]), None)
    last = sampler.samples[-1] if sampler.samples else None
    if first and last:
        rec["rss_after_warmup"] = {"driver": first["driver"]["rss"], "tasks": sum(v["rss"] for v in first["tasks"].values())}
        rec["rss_at_end"] = {"driver": last["driver"]["rss"] if last["driver"] else None,
                             "tasks": sum(v["rss"] for v in last["tasks"].values())}
    shutil.rmtree(tmp, ignore_errors=True)
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(description="memory of a long-running job, per epoch")
    parser.add_argument("--runtime", nargs="+", default=["local", "spark"], choices=["local", "spark"])
    parser.add_argument("--minutes", type=float, default=10.0, help="at least this long per runtime")
    parser.add_argument("--epochs", type=int, default=10_000, help="and at least this many epochs")
    parser.add_argument("--interval", type=float, default=0.05, help="checkpoint interval, s")
    parser.add_argument("--metrics", type=float, default=0.2, help="metrics interval, s")
    parser.add_argument("--rate", type=float, default=500.0, help="records/s per source split")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between memory samples")
    parser.add_argument("--warmup", type=int, default=2000, help="epochs before growth is measured")
    parser.add_argument("--smoke", action="store_true", help="~30 s per runtime, a temporary output")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        args.minutes, args.epochs, args.sample, args.warmup = 0.4, 50, 1.0, 20
    out = args.out or (Path(tempfile.mkdtemp()) / "soak.json" if args.smoke else RESULTS)
    info = harness.machine()
    doc = harness.new_doc("soak", args, info)
    doc["runs"], doc["errors"] = [], []
    spark = None
    for runtime in args.runtime:
        if runtime == "spark" and spark is None:
            try:
                from epochal.runtime.launch.spark import _local_session
            except ImportError:  # the flat runtime layout before issue 22
                from epochal.runtime.launch.spark import _local_session
            spark = _local_session(2 * args.parallelism + 2)
        print(f"soak on {runtime}: {args.minutes:g} min and {args.epochs} epochs at least ...", flush=True)
        rec = one_run(runtime, args, spark)
        doc["runs"].append(rec)
        if rec.get("error"):
            doc["errors"].append(f"{runtime}: {rec['error']}")
        if rec["restarts"]:
            doc["errors"].append(f"{runtime}: the job restarted {rec['restarts']} time(s)")
    rows = []
    for r in doc["runs"]:
        g = r["growth"]["rss"]
        kb = lambda v: harness.fmt(None if v is None else v / 1024, ".3f")  # noqa: E731
        rows.append([r["runtime"], str(r["epochs"]), f"{r['wall_s'] / 60:.1f}", kb(g["driver_bytes_per_epoch"]),
                     kb(g["tasks_bytes_per_epoch"]), kb(g["total_bytes_per_epoch"]), kb(g["jvm_bytes_per_epoch"]),
                     str(r["growth"]["goal_met"])])
    print(harness.table(["runtime", "epochs", "min", "driver KB/epoch", "tasks KB/epoch", "total KB/epoch",
                         "JVM KB/epoch", "goal met"], rows))
    harness.finish(doc, info)
    harness.write_json(out, doc)
    print(f"wrote {out}")
    if doc["errors"]:
        print("ERRORS:\n  " + "\n  ".join(doc["errors"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
