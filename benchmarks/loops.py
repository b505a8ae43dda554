"""Loop workload: throughput and checkpoint duration as records in flight inside the loop grow.

K records enter a loop and each goes round R times (a countdown), so K records circulate
at once; R = max(2, iterations // K) keeps the total work (loop iterations) roughly equal
across K. Reported per K: loop iterations per second (wall time of the whole job,
start-up included, and the steady part, measured from the first to the last completed
epoch), checkpoint duration (median / max of periodic epochs) and the records the heads
logged per epoch (the loop's in-transit state, seed 004 Alg. 7).

Usage::

    python benchmarks/loops.py                             # local runtime, K = 100, 1k, 10k
    python benchmarks/loops.py --runtime spark
    python benchmarks/loops.py --smoke --out /tmp/loops.json
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
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def countdown(rounds: int):
    def gen(split: int, offset: int):
        i = offset
        while True:
            yield (split, i, rounds)
            i += 1
    return gen


def loop_job(name: str, out: str, in_flight: int, rounds: int, parallelism: int) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=parallelism)
    src = flow.source("records", ep.sources.GeneratorSource(countdown(rounds), num_splits=parallelism,
                                                            limit=in_flight // parallelism))

    def body(s):
        step = s.map("step", lambda r: (r[0], r[1], r[2] - 1))
        return step.filter("more", lambda r: r[2] > 0).key_by(lambda r: (r[0], r[1])), step.filter("done", lambda r: r[2] <= 0)

    src.iterate("loop", body).sink("out", FileSink(out, format="jsonl"))
    return flow


def run_once(k: int, args, spark, tmp: str) -> dict:
    rounds = max(2, args.iterations // k)
    out, ckpt = tempfile.mkdtemp(dir=tmp), tempfile.mkdtemp(dir=tmp)
    flow = loop_job(f"loops-{k}", out, k, rounds, args.parallelism)
    t0 = time.monotonic()
    result = flow.run(guarantee=args.guarantee, runtime=args.runtime, spark=spark,
                      checkpoint=ep.CheckpointConfig(interval=args.interval, storage="file://" + ckpt),
                      channels=ep.ChannelConfig(batch_size=args.batch_size))
    wall = time.monotonic() - t0
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    k_eff = (k // args.parallelism) * args.parallelism
    iterations = k_eff * rounds
    epochs = result.completed_epochs
    periodic = [e for e in epochs if e["reason"] == "periodic"] or epochs
    return {
        "in_flight": k_eff, "rounds": rounds, "iterations": iterations, "wall_s": wall,
        "iterations_per_s": iterations / wall,
        "completed_epochs": len(epochs),
        "final_rounds": sum(1 for e in epochs if e["reason"] == "final"),
        "checkpoint_duration_s": harness.summary([e["duration_s"] for e in periodic]),
        "logged_per_epoch": harness.summary([e.get("loop_logged", 0) for e in periodic]),
        "max_upload_s": harness.summary([e["max_upload_s"] for e in periodic]),
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--in-flight", type=int, nargs="+", default=None, help="records circulating at once (K)")
    p.add_argument("--iterations", type=int, default=None, help="total loop iterations per run")
    p.add_argument("--runtime", choices=("spark", "local"), default="local")
    p.add_argument("--guarantee", default="exactly-once")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    if args.in_flight is None:
        args.in_flight = [40, 400] if args.smoke else [100, 1000, 10000]
    if args.iterations is None:
        args.iterations = 4000 if args.smoke else 200_000
    if args.out is None:
        args.out = Path(tempfile.mkdtemp()) / "loops.json" if args.smoke else harness.RESULTS / "loops.json"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(16)
    tmp = args.tmp or tempfile.mkdtemp(prefix="epochal-bench-loops-")
    runs, errors = [], []
    for k in args.in_flight:
        try:
            runs.append(run_once(k, args, spark, tmp))
        except Exception as exc:  # noqa: BLE001 — report, keep measuring
            errors.append({"in_flight": k, "error": f"{type(exc).__name__}: {exc}"})
    doc = {"benchmark": "loops", "started": harness.now_iso(), "config": {k: str(v) for k, v in vars(args).items()},
           "machine": harness.machine(), "runs": runs, "errors": errors}
    harness.write_json(args.out, doc)
    rows = [[str(r["in_flight"]), str(r["rounds"]), harness.fmt(r["iterations_per_s"]),
             harness.fmt(r["checkpoint_duration_s"]["median"], ".3f"), harness.fmt(r["checkpoint_duration_s"]["max"], ".3f"),
             harness.fmt(r["logged_per_epoch"]["median"]), str(r["completed_epochs"])] for r in runs]
    print(harness.table(["in flight", "rounds", "iter/s", "ckpt p50 s", "ckpt max s", "logged/epoch", "epochs"], rows))
    print(f"wrote {args.out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
