"""A thousand tasks and beyond (issue 50): the real driver, simulated tasks, measured.

The driver's side of a job — attempts and launch units, the coordinator server over pinned
TLS, ``_metadata`` (signed), retention, failover-region restarts, restore planning, the
dashboard — is the product's code, started through ``start_job(..., launcher=...)``; the
tasks are simulated (``scale_sim.py``: a thread each, a few processes, the real
``wire.connect`` and message sequence, real state files, a delay per epoch, scheduled
failures). One run is ``scale_run.run_once`` (its docstring defines every figure).

Sweep: ``--tasks`` × ``--intervals``; in every run of ``n >= 100`` one task fails on
schedule, so each run also measures a failover region's restart. The report
(``benchmarks/results/scale.json``) holds every run, and per interval and figure the growth
with the number of tasks: the log-log slope between the smallest and largest ``n >= 100``
(``constant`` below 0.3, ``linear`` up to 1.3, ``worse`` beyond) and the figure per task.
Every run records ``os.getloadavg()`` at its start and end: on a shared machine the figures
are taken under that load, and the simulated tasks share the cores with the driver.

    python benchmarks/scale.py [--tasks 10,100,1000] [--intervals 0.1,1,10] [--seconds 15]
        [--delay 0.02] [--jitter 0.5] [--state file|inline] [--state-bytes 1024] [--smoke] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_run import run_once  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"

#: (figure, how to read it from a run) — the figures whose growth the report classifies
FIGURES = {
    "beyond_slowest_p99_s": lambda r: r["beyond_slowest_s"]["p99"],
    "ack_to_complete_p99_s": lambda r: r["ack_to_complete_s"]["p99"],
    "trigger_fanout_p99_s": lambda r: r["trigger_fanout_s"]["p99"],
    "driver_cpu_share": lambda r: (r["steady"] or {}).get("driver_cpu_share"),
    "driver_rss_bytes": lambda r: r["driver_rss_bytes"]["max"],
    "metadata_bytes": lambda r: r["metadata_bytes"],
    "metadata_write_p50_s": lambda r: r["metadata_write_s"]["p50"],
    "restore_plan_s": lambda r: r["restore_plan_s"],
    "failover_running_s": lambda r: r["failovers"][0]["running_s"] if r["failovers"] else None,
    "dashboard_p50_ms": lambda r: r["dashboard_ms"]["p50"],
    "dashboard_bytes": lambda r: r["dashboard_bytes"],
    "plan_compile_s": lambda r: r["plan_compile_s"],
    "connected_s": lambda r: r["connected_s"],
}


NOTE = ("taken under the load recorded per run (load_start / load_end: os.getloadavg()); the simulated tasks run on "
        "the same 2 cores as the driver. Runs with ack_workers=1 are from the first sweep, whose simulator sent every "
        "ack of a process from one thread behind each state file's fsyncs: their task_work_max is that queue, not the "
        "configured delay (the overhead figures subtract it); ack_workers=32 runs write and send in parallel")

#: what the profiles showed (cProfile of the coordinator's loop thread, 1,000 tasks, 1 s
#: epochs, 9 completions, load ~19 on 2 cores), kept beside the curves they explain
FINDINGS = {
    "fixed": [
        "plan compilation was quadratic in the parallelism (each subtask listed every split of its source): "
        "10,000 tasks 18.9 s -> 0.26 s, 1,000 tasks 0.28 s -> 0.02 s (epochal/plan.py; tests/test_plan_scale.py)",
        "PhysicalPlan.task() scanned every task; the coordinator calls it for every task of every completed epoch, so "
        "each completion was quadratic: 1.6 s of the loop thread over 9 completions at 1,000 tasks, before the fix "
        "(epochal/plan.py; tests/test_plan_scale.py)",
        "CoordinatorServer.__init__ found each task's upstream tasks by scanning every channel per task: "
        "O(tasks x channels), cubic in the parallelism of an all-to-all shuffle (p=150: 2.66 s -> 0.08 s; p=1,000 "
        "would have taken ~13 min at every attempt's start); not exercised by the simulated job, which has no "
        "channels (epochal/runtime/driver/coordinator_server.py upstream_tasks; tests/test_coordinator_upstream.py)",
    ],
    "after_fixes_profile": (
        "coordinator loop thread, 1,000 tasks, 1 s epochs, 9 completions, load ~30, parallel simulator acks: "
        "_complete 2.30 s per completion, of which retention's unlinks 0.85 s (7,000 unlinks), _metadata JSON "
        "encoding 0.89 s (27 encodes: 3 per completion), the sends (complete + trigger, 20,004 sendall) 0.38 s per "
        "epoch, re-reading kept _metadata 0.04 s; plan.task no longer shows; the loop was idle (queue wait) 122 of "
        "158 s: latency-bound, not CPU-bound"),
    "open": [
        "retention runs on the coordinator's loop thread after every completion and unlinks every state file of the "
        "checkpoint it drops, one by one: 1,000 unlinks per epoch at 1,000 tasks = 8.3 s of the loop over 9 "
        "completions (0.9 s each, on a loaded disk); acks, triggers and completions wait meanwhile",
        "_metadata is JSON-encoded three times per completion when signed (encode_document, json.loads, sign's "
        "canonical form, encode_document again), twice with indent=1, which disables json's C encoder: 5.8 s of "
        "the loop over 9 completions at 1,000 tasks (280 KB documents); retention then reads and parses every "
        "kept _metadata again (storage.load_metadata per chk directory)",
        "the completion is broadcast by one sendall per task on the loop thread (TLS records, ~0.13 ms each): "
        "linear, 1.3 s per epoch at 10,000 tasks",
        "start-up: every task's pinned-TLS + HMAC handshake runs on its own driver thread (and every connection keeps "
        "one reading thread in the driver for the job's life); 1,000 tasks took 62-199 s to connect under load ~31 "
        "(connected_s; growth about linear); 5,000 tasks were not measured: under load ~28 they connected at about one "
        "per second (416 after 7 min, every process at 2-3 % CPU), so the run was stopped; a failover region of one "
        "task rejoins in 0.1-0.9 s",
    ],
}


def classify(slope: float | None) -> str | None:
    if slope is None:
        return None
    return "constant" if slope < 0.3 else "linear" if slope <= 1.3 else "worse"


def growth(runs: list[dict]) -> dict:
    """Per interval and figure: values by n, the log-log slope over n >= 100, its class."""
    out: dict = {}
    for interval in sorted({r["interval_s"] for r in runs}):
        at = {r["n"]: r for r in runs if r["interval_s"] == interval}
        entry = {}
        for name, get in FIGURES.items():
            values = {n: get(r) for n, r in sorted(at.items())}
            usable = {n: v for n, v in values.items() if n >= 100 and v is not None and v > 0}
            slope = None
            if len(usable) >= 2:
                lo, hi = min(usable), max(usable)
                slope = math.log(usable[hi] / usable[lo]) / math.log(hi / lo)
            entry[name] = {"by_n": values, "per_task": {n: (v / n if v is not None else None) for n, v in values.items()},
                           "loglog_slope": slope, "growth": classify(slope)}
        out[str(interval)] = entry
    return out


def seconds_to_epochs(seconds: float, interval: float, n: int) -> int:
    """Epochs of one run: ``seconds / interval``, at least 4, at most 40 (12 from 1,000 tasks
    on: their epochs outlast short intervals, and the run must end)."""
    return max(4, min(40 if n < 1000 else 12, int(round(seconds / interval))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="10,100,1000")
    ap.add_argument("--intervals", default="0.1,1,10")
    ap.add_argument("--seconds", type=float, default=15.0, help="run length per point (epochs = seconds / interval, 4..40; 12 at most from 1,000 tasks)")
    ap.add_argument("--delay", type=float, default=0.02, help="each task's ack delay per epoch (s)")
    ap.add_argument("--jitter", type=float, default=0.5)
    ap.add_argument("--state", choices=("file", "inline"), default="file")
    ap.add_argument("--state-bytes", type=int, default=1024)
    ap.add_argument("--per-process", type=int, default=500, help="simulated tasks per process (at most 4 processes)")
    ap.add_argument("--root", default=None, help="where the checkpoints go (default: a temporary directory)")
    ap.add_argument("--smoke", action="store_true", help="N=10 at 0.1 s for about a second")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--label", default="", help="what code the runs measure (recorded in every run)")
    ap.add_argument("--append", action="store_true", help="add these runs to those already in --out (growth recomputed)")
    args = ap.parse_args(argv)
    if args.smoke:
        points = [(10, 0.1, 10)]
    else:
        points = [(int(n), float(i), seconds_to_epochs(args.seconds, float(i), int(n)))
                  for n in args.tasks.split(",") for i in args.intervals.split(",")]
    runs = []
    if args.append and Path(args.out).exists():
        runs = json.loads(Path(args.out).read_text())["runs"]
    for n, interval, epochs in points:
        processes = max(1, min(4, math.ceil(n / args.per_process)))
        fail = {n // 2 + 1: epochs // 2} if n >= 100 else ({3: epochs // 2} if args.smoke else {})
        t0 = time.monotonic()
        run = run_once(n, interval, epochs=epochs, delay=args.delay, jitter=args.jitter, processes=processes,
                       state=args.state, state_bytes=args.state_bytes, fail=fail, root=args.root)
        run["label"] = args.label
        runs.append(run)
        print(f"n={n} interval={interval}s epochs={epochs}: beyond slowest p99 "
              f"{_ms(run['beyond_slowest_s']['p99'])}, driver CPU {_pct((run['steady'] or {}).get('driver_cpu_share'))}, "
              f"_metadata {run['metadata_bytes']} B in {_ms(run['metadata_write_s']['p50'])} (p50), restore plan "
              f"{_ms(run['restore_plan_s'])}, dashboard {_ms_raw(run['dashboard_ms']['p50'])}, load {run['load_start'][0]:.1f}"
              f" ({time.monotonic() - t0:.0f} s)", flush=True)
    doc = {"benchmark": "scale", "issue": 50, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                          "platform": platform.platform()},
           "note": NOTE,
           "settings": {k: v for k, v in vars(args).items() if k not in ("out", "append")},
           "load_at_write": os.getloadavg(),
           "findings": FINDINGS,
           "runs": runs, "growth": growth(runs)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


def _ms(v):
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _ms_raw(v):
    return "-" if v is None else f"{v:.1f} ms"


def _pct(v):
    return "-" if v is None else f"{v * 100:.0f}%"


if __name__ == "__main__":
    sys.exit(main())
