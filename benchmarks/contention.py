"""What ``iceberg_contention.py`` and ``delta_contention.py`` share: N table-sink writer
processes commit the same epochs at the same moment, in two modes (the sink's backoff as
shipped, or immediate retries); the writers' loop, the per-mode summary and the command line.

A script supplies ``make_sink(target)`` (the sink over its table; ``target`` a URI or a
catalog) and ``run_mode(mode, args, tmp) -> dict`` (table, writers, row count), the latter
built on :func:`run_writers` and :func:`summary`.
"""
from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from pathlib import Path

import harness
import pyarrow as pa

SCHEMA = pa.schema([("id", pa.int64()), ("subtask", pa.int64()), ("epoch", pa.int64())])
MODES = ("backoff", "no-backoff")


def writer_process(make_sink, target, subtask: int, subtasks: int, epochs: int, rows: int, mode: str, sealed, out,
                   cap: float | None = None):
    """One sink subtask: ``epochs`` epochs of ``rows`` rows; puts ``(subtask, stats, error)``.
    ``cap``: another backoff cap (seconds) than the sink's."""
    try:
        from epochal.alignment.factory import SinkMode
        from epochal.connectors import commit_retry
        from epochal.epochs.lineage import Lineage
        from epochal.sinks import SinkContext

        if mode == "no-backoff":
            commit_retry.backoff = lambda attempt, rng=None: 0.0
        elif cap is not None:
            commit_retry.BACKOFF_CAP_S = cap
        ctx = SinkContext("out", subtask=subtask, parallelism=subtasks, job="bench", generation=0,
                          mode=SinkMode.TRANSACTIONAL, lineage=Lineage("0123456789ab"))
        w = make_sink(target).create_writer(ctx)
        w.restore(None)
        for epoch in range(1, epochs + 1):
            base = (epoch * subtasks + subtask) * rows
            w.write_many([{"id": base + i, "subtask": subtask, "epoch": epoch} for i in range(rows)])
            w.snapshot(epoch)
            job = w.durability_job(epoch)
            if job is not None:
                job()
            sealed.wait(300)  # every subtask sealed epoch: the checkpoint completes now
            w.notify_epoch_complete(epoch)
        out.put((subtask, w.commit_stats, None))
    except Exception:  # reported by the parent
        out.put((subtask, [], traceback.format_exc(limit=5)))


def run_writers(ctx, make_sink, target, mode: str, args) -> tuple[list, list[str], float]:
    """``args.subtasks`` writer processes (multiprocessing context ``ctx``) through every
    epoch: their commit stats ``(attempts, seconds)``, their errors, the wall time."""
    sealed, out = ctx.Barrier(args.subtasks), ctx.Queue()
    procs = [ctx.Process(target=writer_process, args=(make_sink, target, s, args.subtasks, args.epochs, args.rows,
                                                      mode, sealed, out, args.cap)) for s in range(args.subtasks)]
    started = time.time()
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(60)
    wall = time.time() - started
    return [s for r in results for s in r[1]], [r[2] for r in results if r[2]], wall


def summary(mode: str, args, stats: list, errors: list[str], wall: float, rows: int, distinct: int,
            **extra) -> dict:
    """One mode's record: attempts and commit time per commit, failures, exactly-once
    (``rows`` in the table, ``distinct`` ids); ``extra`` fields follow ``wall_s``."""
    attempts = [a for a, _ in stats]
    seconds = [t for _, t in stats]
    expected = args.subtasks * args.epochs * args.rows
    return {
        "mode": mode, "subtasks": args.subtasks, "epochs": args.epochs, "commits": len(stats),
        "failed_writers": len(errors), "errors": [e.strip().splitlines()[-1] for e in errors][:3],
        "attempts": {"mean": (sum(attempts) / len(attempts)) if attempts else None,
                     "p50": harness.percentile(attempts, 50), "p99": harness.percentile(attempts, 99),
                     "max": max(attempts, default=None)},
        "over_8_attempts": sum(1 for a in attempts if a > 8),
        "commit_s": {"p50": harness.percentile(seconds, 50), "p99": harness.percentile(seconds, 99),
                     "max": max(seconds, default=None)},
        "wall_s": wall, **extra,
        "rows": rows, "rows_expected": expected, "exactly_once": rows == expected == distinct,
    }


def main(name: str, description: str, run_mode) -> int:
    """The command line of benchmark ``name`` (``iceberg_contention``, ``delta_contention``):
    runs every mode, writes the JSON, prints the table; 0 iff the ``backoff`` runs were
    exactly-once without a failed writer."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--subtasks", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cap", type=float, default=None, help="backoff cap in seconds (default: the sink's)")
    parser.add_argument("--smoke", action="store_true", help="4 subtasks, 2 epochs")
    parser.add_argument("--out", type=Path, default=harness.RESULTS / f"{name}.json")
    parser.add_argument("--tmp", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        args.subtasks, args.epochs, args.rows = 4, 2, 10
    info = harness.machine()
    tmp = Path(tempfile.mkdtemp(prefix=f"{name.replace('_', '-')}-", dir=args.tmp))
    runs = [run_mode(mode, args, tmp) for mode in args.modes.split(",")]
    doc = {"benchmark": name, "machine": info, "finished": harness.now_iso(),
           "config": {"subtasks": args.subtasks, "epochs": args.epochs, "rows": args.rows, "smoke": args.smoke,
                      "backoff_cap_s": args.cap},
           "runs": runs}
    harness.write_json(args.out, doc)
    print(harness.table(["mode", "commits", "failed", "attempts mean/p99/max", ">8", "commit p50/p99 s", "exact"],
                        [[r["mode"], str(r["commits"]), str(r["failed_writers"]),
                          f"{harness.fmt(r['attempts']['mean'], '.1f')}/{r['attempts']['p99']}/{r['attempts']['max']}",
                          str(r["over_8_attempts"]),
                          f"{harness.fmt(r['commit_s']['p50'], '.2f')}/{harness.fmt(r['commit_s']['p99'], '.2f')}",
                          str(r["exactly_once"])] for r in runs]))
    print(f"wrote {args.out}")
    return 0 if all(r["exactly_once"] and not r["failed_writers"] for r in runs if r["mode"] == "backoff") else 1
