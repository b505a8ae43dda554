"""The answer gap of a RocksDB job's read-committed lookups around a start and a restart,
with the query sidecar (RocksDB's default: the task answers in-process until its sidecar is
ready, then hands over, epochal/query/handover.py) and without (``query_sidecar=False``).

Per run: a job of ``queryable.py`` (deposits to ``--keys`` accounts, a queryable balance,
parallelism 2, epochs every 0.05 s) with one crash of ``balance[1]`` mid-run (after epoch
3); a reader does back-to-back read-committed point lookups from the start. Reported: the
time from ``start`` to the first answer, the longest gap between consecutive answers (it
spans the restart when answers came before the crash; if the crash came first, it is small),
lookups and errors. Variants alternate run by run (the machine's load drifts)::

    python benchmarks/query_handover.py --runs 5 --out benchmarks/results/query_handover.json
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloudpickle  # noqa: E402
import harness  # noqa: E402
import queryable  # noqa: E402
from queryable import Balance, deposits  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.backends.choice import BackendSpec  # noqa: E402
from epochal.query import JobEnded  # noqa: E402

cloudpickle.register_pickle_by_value(queryable)  # its Balance runs in the tasks


def run(sidecar: bool, args, tmp: str) -> dict:
    name = f"handover-{'sidecar' if sidecar else 'in-process'}-{os.getpid()}-{time.monotonic_ns()}"
    flow = ep.Dataflow(name, parallelism=2)
    source = ep.sources.GeneratorSource(deposits(args.keys), num_splits=2, limit=args.per_split,
                                        records_per_second=args.rate / 2)
    (flow.source("deposits", source)
         .key_by(lambda r: r[0])
         .process("balance", Balance())
         .sink("out", ep.sinks.FileSink(os.path.join(tmp, name, "out"))))
    t0 = time.monotonic()
    handle = flow.start(runtime="local", backend=BackendSpec("rocksdb", {"query_sidecar": sidecar}),
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=f"file://{tmp}/{name}/ckpt"),
                        faults=[ep.testing.CrashAtRecord("balance", subtask=1, record=args.crash_at, after_epoch=3)])
    answers: list[float] = []
    errors: list[str] = []
    stop = threading.Event()

    def reader():
        key = 0
        while not stop.is_set():
            try:
                handle.query("balance", "balance", key % args.keys, timeout=60)
            except JobEnded:
                return
            except Exception as exc:  # reported, not hidden
                errors.append(repr(exc))
                return
            answers.append(time.monotonic())
            key += 1

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    result = handle.wait(300)
    stop.set()
    thread.join(60)
    gaps = [b - a for a, b in zip(answers, answers[1:])]
    return {"variant": "sidecar" if sidecar else "in-process", "attempts": result.attempts,
            "first_answer_s": answers[0] - t0 if answers else None,
            "max_gap_s": max(gaps) if gaps else None, "lookups": len(answers), "errors": errors}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--rate", type=float, default=5000.0)
    p.add_argument("--per-split", type=int, default=6000)
    p.add_argument("--crash-at", type=int, default=4000, help="the record of balance[1] that crashes it")
    p.add_argument("--smoke", action="store_true", help="one run per variant")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "query_handover.json")
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.runs = 1
    tmp = args.tmp or tempfile.mkdtemp(prefix="query-handover-")
    doc = {"benchmark": "query_handover", "time": harness.now_iso(), "machine": harness.machine(),
           "config": {k: v for k, v in vars(args).items() if k not in ("out", "tmp")}, "runs": []}
    for _ in range(args.runs):
        for sidecar in (True, False):
            doc["runs"].append(run(sidecar, args, tmp))
            print(doc["runs"][-1], flush=True)
    doc["loadavg_at_end"] = os.getloadavg()
    for variant in ("sidecar", "in-process"):
        runs = [r for r in doc["runs"] if r["variant"] == variant]
        doc[variant] = {field: harness.summary([r[field] for r in runs if r[field] is not None])
                        for field in ("first_answer_s", "max_gap_s")}
    doc["errors"] = [e for r in doc["runs"] for e in r["errors"]]
    harness.write_json(args.out, doc)
    print({v: doc[v] for v in ("sidecar", "in-process")})
    return 0 if not doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
