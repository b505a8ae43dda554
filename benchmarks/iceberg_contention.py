"""Iceberg commit contention: N sink subtasks committing the same epoch at the same moment.

Every epoch of an exactly-once IcebergSink is one snapshot per subtask, and all subtasks
commit when the same checkpoint completes: they race on the catalog's compare-and-swap, and
all but one lose each round (issue 36: 8 attempts without backoff gave up at ~9 subtasks).
This drives ``--subtasks`` real :class:`~epochal.connectors.iceberg.sink.IcebergSinkWriter`
instances, one process each (SQL catalog on sqlite, warehouse on local disk), through
``--epochs`` epochs: each writes ``--rows`` rows, seals the epoch, waits until every writer
sealed it (the checkpoint completes), then commits. Two modes:

* ``backoff``: the sink as shipped (full-jitter exponential backoff between attempts,
  a deadline instead of an attempt count);
* ``no-backoff``: retries immediately, as before; ``over_8`` counts the commits that needed
  more than 8 attempts — the ones the old sink gave up on (a failed job attempt).

Reported per mode: attempts per commit (mean, p50, p99, max), commit time per commit (p50,
p99, max: from the moment the checkpoint completed), the time until the last subtask of an
epoch committed, commits that failed, and whether the table holds every row exactly once.

    python benchmarks/iceberg_contention.py [--subtasks 16] [--epochs 5] [--rows 100] [--smoke]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import pyarrow as pa  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("subtask", pa.int64()), ("epoch", pa.int64())])
MODES = ("backoff", "no-backoff")


def writer_process(catalog: dict, subtask: int, subtasks: int, epochs: int, rows: int, mode: str, sealed, out,
                   cap: float | None = None):
    """One sink subtask: ``epochs`` epochs of ``rows`` rows; puts ``(subtask, stats, error)``.
    ``cap``: another backoff cap (seconds) than the sink's."""
    try:
        from epochal.alignment.factory import SinkMode
        from epochal.connectors import commit_retry
        from epochal.epochs.lineage import Lineage
        from epochal.sinks import IcebergSink, SinkContext

        if mode == "no-backoff":
            commit_retry.backoff = lambda attempt, rng=None: 0.0
        elif cap is not None:
            commit_retry.BACKOFF_CAP_S = cap
        ctx = SinkContext("out", subtask=subtask, parallelism=subtasks, job="bench", generation=0,
                          mode=SinkMode.TRANSACTIONAL, lineage=Lineage("0123456789ab"))
        w = IcebergSink(catalog, "db.t", schema=SCHEMA).create_writer(ctx)
        w.restore(None)
        ends = []
        for epoch in range(1, epochs + 1):
            base = (epoch * subtasks + subtask) * rows
            w.write_many([{"id": base + i, "subtask": subtask, "epoch": epoch} for i in range(rows)])
            w.snapshot(epoch)
            job = w.durability_job(epoch)
            if job is not None:
                job()
            sealed.wait(300)  # every subtask sealed epoch: the checkpoint completes now
            w.notify_epoch_complete(epoch)
            ends.append(time.time())
        out.put((subtask, w.commit_stats, ends, None))
    except Exception:  # reported by the parent
        out.put((subtask, [], [], traceback.format_exc(limit=5)))


def run_mode(mode: str, args, tmp: Path) -> dict:
    from epochal.sinks import IcebergSink

    root = tmp / mode
    root.mkdir(parents=True)
    catalog = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    IcebergSink(catalog, "db.t", schema=SCHEMA).claim("bench", "out", resume=False)
    ctx = mp.get_context("fork")
    sealed, out = ctx.Barrier(args.subtasks), ctx.Queue()
    procs = [ctx.Process(target=writer_process, args=(catalog, s, args.subtasks, args.epochs, args.rows, mode,
                                                      sealed, out, args.cap)) for s in range(args.subtasks)]
    started = time.time()
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(60)
    wall = time.time() - started
    errors = [r[3] for r in results if r[3]]
    stats = [s for r in results for s in r[1]]
    attempts = [a for a, _ in stats]
    seconds = [t for _, t in stats]
    from pyiceberg.catalog import load_catalog

    props = dict(catalog)
    rows = load_catalog(props.pop("name", "default"), **props).load_table("db.t").scan().to_arrow()
    ids = rows.column("id").to_pylist()
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
        "wall_s": wall,
        "rows": len(ids), "rows_expected": expected, "exactly_once": len(ids) == expected == len(set(ids)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cap", type=float, default=None, help="backoff cap in seconds (default: the sink's)")
    parser.add_argument("--smoke", action="store_true", help="4 subtasks, 2 epochs")
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "iceberg_contention.json")
    parser.add_argument("--tmp", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        args.subtasks, args.epochs, args.rows = 4, 2, 10
    info = harness.machine()
    tmp = Path(tempfile.mkdtemp(prefix="iceberg-contention-", dir=args.tmp))
    runs = [run_mode(mode, args, tmp) for mode in args.modes.split(",")]
    doc = {"benchmark": "iceberg_contention", "machine": info, "finished": harness.now_iso(),
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


if __name__ == "__main__":
    sys.exit(main())
