"""Alignment time and checkpoint duration vs parallelism (seed 004 §4.4 shape) — in one run.

The job is the two-shuffle keyed word count of ``throughput.py`` (``wordcount``: lines →
split → pair, key_by(word) → count, key_by(count % 5) → bucket, union → jsonl FileSink;
4 tasks per unit of parallelism) with small keyed state, fed at a **fixed rate** (default
10,000 lines/s in total, about a third of what one parallelism-1 run sustains on the
2-core development machine): a moderately loaded pipeline, the realistic case — an
unthrottled source measures checkpoints of a saturated pipeline whose channels are full,
where a barrier waits behind every queued batch (``--rate 0`` runs that case).

For every parallelism (default 1, 2, 4, 8) × guarantee (exactly-once: aligned barriers +
2PC sink; at-least-once: barrier tracker) one run of ``--seconds`` of input, checkpoint
interval 1 s, interleaved across repetitions. Per periodic epoch the JobResult holds the
epoch's duration (trigger → last acknowledgement) and every task's sample (barrier delay
from trigger to the task's snapshot, alignment = first → last barrier on its inputs, sync
part, upload, acknowledgement time). Reported per (parallelism, guarantee), nearest-rank
p50 / p99 over all periodic epochs of all repetitions:

- checkpoint duration; alignment time per task (tasks with ≥ 2 inputs) and per epoch
  (maximum over tasks); sync time per epoch and per operator;
- the FileSink's pre-commit (close + fsync of the epoch's part file): the ``out`` tasks'
  sync part;
- the *critical task* of each epoch (the one acknowledged last) and the parts of its
  acknowledgement time: barrier delay (incl. its alignment), sync, wait for its uploader,
  upload (write + fsync of its state file), rest (ack transit, the coordinator's queue) —
  which step dominates checkpoint duration;
- throughput: offered and achieved lines/s, CPU seconds.

The machine has few cores: parallelism p runs 4p task processes, so p = 8 means 32
processes on 2 cores; the JSON records tasks per core for every cell.

Usage::

    python benchmarks/alignment.py                         # local runtime, ~6 min
    python benchmarks/alignment.py --runtime spark         # embedded Spark
    python benchmarks/alignment.py --rate 0 --lines 300000 # unthrottled (saturated) pipeline
    python benchmarks/alignment.py --smoke --out /tmp/a.json   # < 60 s
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloudpickle  # noqa: E402
import harness  # noqa: E402
import throughput  # noqa: E402  (the word count job; registers workload by value)

cloudpickle.register_pickle_by_value(throughput)  # its pipeline functions run in the task processes

import epochal as ep  # noqa: E402

GUARANTEES = ("exactly-once", "at-least-once")
TARGET_P99_S = 0.100  # issue 6: checkpoint duration p99 under 100 ms for small state at parallelism 4
PARTS = ("barrier_s", "sync_s", "upload_wait_s", "upload_s", "rest_s")


def operator_of(task: str) -> str:
    return task.split("[", 1)[0]


# ---------------------------------------------------------------------- one run
def run_once(p: int, guarantee: str, args, spark, rep: int) -> dict:
    """One job; its measurements (or its error)."""
    work = tempfile.mkdtemp(prefix=f"epochal-align-p{p}-", dir=args.tmp)
    split_rate = args.rate / args.splits if args.rate else None
    flow = throughput.wordcount(f"align-p{p}-{guarantee}", os.path.join(work, "out"), args.lines, p, args.splits,
                                split_rate)
    plan = flow.plan()
    cores = os.cpu_count() or 1
    record = {"parallelism": p, "guarantee": guarantee, "repetition": rep, "tasks": len(plan.tasks),
              "tasks_per_core": len(plan.tasks) / cores, "parallelism_per_core": p / cores, "lines": (args.lines // args.splits) * args.splits,
              "offered_lines_per_s": args.rate or None, "loadavg_1m_before": os.getloadavg()[0],
              "inputs": {t.id: len(t.inputs) for t in plan.tasks}}
    checkpoint = ep.CheckpointConfig(interval=args.interval, storage="file://" + os.path.join(work, "ckpt"))
    cpu0 = harness.tree_cpu_seconds()
    t0 = time.monotonic()
    try:
        handle = flow.start(guarantee=guarantee, checkpoint=checkpoint, runtime=args.runtime, spark=spark)
        try:
            result = handle.wait(args.run_timeout)
        except TimeoutError:
            handle.cancel()
            record["error"] = f"hung: not finished after {args.run_timeout} s (cancelled)"
            return record
    except Exception as exc:  # reported, not hidden; the other cells still run
        record["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu1 = harness.tree_cpu_seconds()
    (attempt,) = result.attempt_timeline[-1:]
    active = attempt["stopped_s"] - attempt["running_s"]  # all tasks running → all gone (incl. final epoch)
    record.update({
        "wall_s": time.monotonic() - t0, "duration_s": result.duration_s, "running_s": attempt["running_s"],
        "cpu_s": cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None,
        "records_in": result.records_in, "attempts": result.attempts,
        "achieved_lines_per_s": result.records_in / active if active > 0 else None,
        "whole_lines_per_s": result.records_in / result.duration_s,
        "aborted_epochs": len(result.aborted_epochs),
        "backpressure_s": {t: round(m.get("backpressure_s", 0.0), 4) for t, m in result.task_metrics.items()},
        "epochs": [_compact(e) for e in result.completed_epochs],
    })
    if result.records_in != record["lines"]:
        record["error"] = f"sources read {result.records_in} lines, expected {record['lines']}"
    return record


def _compact(epoch: dict) -> dict:
    """An epoch of the JobResult with its per-task samples rounded to microseconds."""
    keep = ("epoch", "reason", "duration_s", "metadata_s", "max_alignment_s", "max_sync_s", "max_upload_s", "bytes")
    out = {k: epoch.get(k) for k in keep}
    out["tasks"] = {t: {k: (round(v, 6) if isinstance(v, float) else v) for k, v in s.items()}
                    for t, s in epoch["tasks"].items()}
    return out


def schedule(parallelisms: list[int], repetitions: int) -> list[tuple[int, int, str]]:
    """Rotate the parallelism order per repetition and alternate the guarantee order."""
    cells = []
    for rep in range(repetitions):
        ps = parallelisms[rep % len(parallelisms):] + parallelisms[:rep % len(parallelisms)]
        for i, p in enumerate(ps):
            gs = GUARANTEES if (rep + i) % 2 == 0 else GUARANTEES[::-1]
            cells += [(rep, p, g) for g in gs]
    return cells


# ---------------------------------------------------------------------- aggregation
def _pct(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    return {"p50": harness.percentile(values, 50), "p99": harness.percentile(values, 99),
            "max": max(values, default=None), "n": len(values)}


def critical_path(epoch: dict) -> dict:
    """The task acknowledged last and the parts of its acknowledgement time."""
    task, s = max(epoch["tasks"].items(), key=lambda kv: kv[1]["ack_s"])
    rest = s["ack_s"] - s["barrier_s"] - s["sync_s"] - s["upload_wait_s"] - s["upload_s"]
    return {"task": task, "operator": operator_of(task), "ack_s": s["ack_s"], "barrier_s": s["barrier_s"],
            "alignment_s": s["alignment_s"], "sync_s": s["sync_s"], "upload_wait_s": s["upload_wait_s"],
            "upload_s": s["upload_s"], "rest_s": rest}


def _p99_epoch(epochs: list[dict]) -> dict | None:
    """The nearest-rank p99 epoch by duration: its critical task, and per operator the
    latest barrier arrival (trigger → snapshot start) — where its barrier lost time."""
    if not epochs:
        return None
    e = sorted(epochs, key=lambda e: e["duration_s"])[max(0, -(-99 * len(epochs) // 100) - 1)]
    slowest: dict = {}
    for t, s in e["tasks"].items():
        slowest[operator_of(t)] = max(slowest.get(operator_of(t), 0.0), s["barrier_s"])
    return {"epoch": e["epoch"], "duration_s": e["duration_s"], **critical_path(e), "barrier_by_operator": slowest}


def aggregate(runs: list[dict]) -> list[dict]:
    """One summary per (parallelism, guarantee) over the periodic epochs of its runs."""
    out = []
    cells = sorted({(r["parallelism"], r["guarantee"]) for r in runs}, key=lambda c: (c[0], GUARANTEES.index(c[1])))
    for p, g in cells:
        rs = [r for r in runs if r["parallelism"] == p and r["guarantee"] == g and "error" not in r]
        if not rs:
            out.append({"parallelism": p, "guarantee": g, "runs_ok": 0})
            continue
        epochs = [(r, e) for r in rs for e in r["epochs"] if e["reason"] != "final"]
        samples = [(r["inputs"][t], t, s) for r, e in epochs for t, s in e["tasks"].items()]
        crit = [critical_path(e) for _r, e in epochs]
        slow = _p99_epoch([e for _r, e in epochs])
        ops = sorted({operator_of(t) for _n, t, _s in samples}, key=lambda o: min(
            i for i, t in enumerate(rs[0]["inputs"]) if operator_of(t) == o))
        by_op = {o: {k: _pct([s[k] for _n, t, s in samples if operator_of(t) == o])
                     for k in ("barrier_s", "alignment_s", "sync_s", "upload_wait_s", "upload_s", "ack_s")}
                 for o in ops}
        duration = _pct([e["duration_s"] for _r, e in epochs])
        out.append({
            "parallelism": p, "guarantee": g, "runs_ok": len(rs), "tasks": rs[0]["tasks"],
            "tasks_per_core": rs[0]["tasks_per_core"], "parallelism_per_core": rs[0]["parallelism_per_core"],
            "periodic_epochs": len(epochs),
            "aborted_epochs": sum(r["aborted_epochs"] for r in rs),
            "checkpoint_s": duration,
            "checkpoint_with_metadata_s": _pct([e["duration_s"] + e["metadata_s"] for _r, e in epochs]),
            "alignment_task_s": _pct([s["alignment_s"] for n, _t, s in samples if n >= 2]),
            "alignment_max_s": _pct([e["max_alignment_s"] for _r, e in epochs]),
            "sync_max_s": _pct([e["max_sync_s"] for _r, e in epochs]),
            "upload_max_s": _pct([e["max_upload_s"] for _r, e in epochs]),
            "by_operator": by_op,
            "critical_operator": {o: sum(c["operator"] == o for c in crit) / len(crit) for o in ops} if crit else {},
            "critical_parts_p50_s": {k: harness.percentile([c[k] for c in crit], 50) for k in PARTS},
            "critical_of_p99_epoch": slow,
            "sink_sync_s": by_op.get("out", {}).get("sync_s"),  # FileSink pre-commit (close + fsync) + flush
            "target_p99_met": duration["p99"] is not None and duration["p99"] < TARGET_P99_S,
            "offered_lines_per_s": rs[0]["offered_lines_per_s"],
            "achieved_lines_per_s": harness.summary([r["achieved_lines_per_s"] for r in rs]),
            "whole_lines_per_s": harness.summary([r["whole_lines_per_s"] for r in rs]),
            "cpu_s": harness.summary([r["cpu_s"] for r in rs if r["cpu_s"] is not None]),
            "backpressure_s_max": max(max(r["backpressure_s"].values(), default=0.0) for r in rs),
        })
    return out


def render(summary: list[dict]) -> str:
    def ms(d):
        return "-" if not d or d.get("p50") is None else f"{d['p50'] * 1e3:.0f} / {d['p99'] * 1e3:.0f}"

    rows = []
    for c in summary:
        if not c.get("runs_ok"):
            rows.append([str(c["parallelism"]), c["guarantee"]] + ["failed"] + [""] * 10)
            continue
        parts = c["critical_parts_p50_s"]
        top = max(c["critical_operator"].items(), key=lambda kv: kv[1])
        rows.append([str(c["parallelism"]), c["guarantee"], str(c["tasks"]), f"{c['tasks_per_core']:g}",
                     harness.fmt(c["achieved_lines_per_s"]["median"]), str(c["periodic_epochs"]),
                     ms(c["checkpoint_s"]), ms(c["alignment_task_s"]), ms(c["alignment_max_s"]), ms(c["sync_max_s"]),
                     ms(c["sink_sync_s"]),
                     f"{top[0]} {top[1]:.0%}",
                     " ".join(f"{k[:-2].replace('upload_', '')}={harness.fmt(parts[k] and parts[k] * 1e3, '.0f')}"
                              for k in PARTS)])
    header = ["p", "guarantee", "tasks", "tasks/core", "lines/s", "epochs", "ckpt ms p50/p99", "align/task ms",
              "align/epoch ms", "sync ms", "sink sync ms", "last ack", "critical task p50 ms"]
    return harness.table(header, rows)


# ---------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parallelism", type=int, nargs="+", default=None, help="default 1 2 4 8 (1 2 with --smoke)")
    p.add_argument("--rate", type=float, default=10_000.0, help="total lines/s offered; 0 = unthrottled")
    p.add_argument("--seconds", type=float, default=None, help="input duration per run at --rate (default 20)")
    p.add_argument("--lines", type=int, default=None, help="lines per run (default rate x seconds; 300000 at rate 0)")
    p.add_argument("--splits", type=int, default=8, help="source splits (>= the largest parallelism)")
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval (s)")
    p.add_argument("--repetitions", type=int, default=None, help="interleaved repetitions (default 2; 1 with --smoke)")
    p.add_argument("--runtime", choices=("local", "spark"), default="local")
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--smoke", action="store_true", help="p = 1, 2; 2.5 s runs; < 60 s; JSON to a temp dir")
    p.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/alignment.json)")
    p.add_argument("--tmp", default=None, help="directory for sink output and checkpoints")
    args = p.parse_args(argv)
    if args.smoke:
        args.parallelism = args.parallelism or [1, 2]
        args.seconds = args.seconds or 2.5
        args.interval = min(args.interval, 0.5)
        args.rate = min(args.rate, 4000.0) if args.rate else 0.0
    args.parallelism = args.parallelism or [1, 2, 4, 8]
    args.seconds = args.seconds or 20.0
    args.repetitions = args.repetitions or (1 if args.smoke else 2)
    if args.lines is None:
        args.lines = int(args.rate * args.seconds) if args.rate else (20_000 if args.smoke else 300_000)
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "alignment.json" if args.smoke
                    else harness.RESULTS / "alignment.json")
    if args.lines < args.splits:
        p.error("need --lines >= --splits")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    info = harness.machine()
    print(f"epochal alignment benchmark: runtime={args.runtime} parallelism={args.parallelism} rate={args.rate:g} "
          f"lines={args.lines} interval={args.interval} repetitions={args.repetitions} cores={info['cpu_count']} "
          f"load={info['loadavg_at_start']}", flush=True)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(4 * max(args.parallelism))
    doc = {**harness.new_doc("alignment", args, info),
           "method": {
               "workload": "throughput.py wordcount (two shuffles, small keyed state, jsonl FileSink), "
                           + (f"{args.rate:g} lines/s offered in total" if args.rate else "unthrottled source"),
               "percentiles": "nearest rank over the periodic epochs of all repetitions (final epochs excluded)",
               "checkpoint_s": "trigger → last acknowledgement (writing _metadata afterwards: metadata_s)",
               "alignment_task_s": "per task with >= 2 inputs: first → last barrier on its inputs",
               "critical task": "the task acknowledged last; ack = barrier delay (trigger → its snapshot, "
                                "alignment included) + sync + wait (until its uploader starts) + upload "
                                "(write + fsync of its state file) + rest (ack transit, coordinator)",
               "achieved_lines_per_s": "lines / (all tasks running → all tasks gone), final epoch included",
               "oversubscription": f"{info['cpu_count']} cores; parallelism p runs 4p task processes",
           },
           "target_p99_s": TARGET_P99_S, "runs": []}
    t_start = time.monotonic()
    try:
        warm = run_once(max(args.parallelism), GUARANTEES[0], _warmup_args(args), spark, -1)
        doc["warmup"] = {k: warm.get(k) for k in ("duration_s", "error")}
        for rep, p, g in schedule(args.parallelism, args.repetitions):
            r = run_once(p, g, args, spark, rep)
            doc["runs"].append(r)
            ep_ = [e["duration_s"] for e in r.get("epochs", []) if e["reason"] != "final"]
            print(f"[{time.monotonic() - t_start:5.0f} s] rep {rep + 1} p={p} {g:13s} "
                  + (f"ERROR {r['error']}" if "error" in r else
                     f"{r['achieved_lines_per_s']:>8,.0f} lines/s  {len(ep_)} epochs  ckpt p50/p99 "
                     f"{harness.fmt(harness.percentile(ep_, 50), '.3f')}/{harness.fmt(harness.percentile(ep_, 99), '.3f')} s"
                     f"  load {r['loadavg_1m_before']:.1f}"), flush=True)
    finally:
        harness.finish(doc, info)
        doc["summary"] = aggregate(doc["runs"])
        doc["errors"] = [f"p={r['parallelism']} {r['guarantee']} rep {r['repetition']}: {r['error']}"
                         for r in doc["runs"] if "error" in r]
        harness.write_json(args.out, doc)
        if spark is not None:
            spark.stop()
    print()
    print(render(doc["summary"]))
    return harness.plot_and_exit_code("alignment", doc, Path(args.out).with_suffix(".png"), args.out)


def _warmup_args(args):
    """A short discarded run first (on Spark it starts the Python workers)."""
    ns = argparse.Namespace(**vars(args))
    ns.lines = max(args.splits, int((args.rate or 20_000) * 1.0))
    return ns


if __name__ == "__main__":
    sys.exit(main())
