"""State TTL soak: an unbounded key space (a new key per record) with ttl 10 s.

Per backend (heap, RocksDB) and per variant (``ttl``: ``value_state("n", ttl=10 s)``;
``none``: the same state without ttl):

* **soak** — a rate-limited generator (``--rate`` records/s, one new key each) → ``key_by``
  → a counting ``KeyedProcessFunction`` → nothing (outputs filtered), exactly-once,
  checkpoints every ``--interval`` s, for ``--seconds``. Every second: the newest completed
  checkpoint's state bytes and the RSS of the task processes. With ttl the state should be
  flat after the first ttl period; without it it grows with every record.
* **capacity** — the same job on a bounded backlog of ``--capacity-records`` records at full
  speed: records/s with and without ttl, side by side (the cost of stamping, expiry checks
  and the sweep);
* **operator** — the keyed operator alone in this process (no job, no transport: what TTL
  adds per record, without start-up and scheduling noise), ``--operator-records`` new keys
  in batches of 500, ``--repetitions`` times, median.

    python benchmarks/ttl.py [--seconds 30] [--none-seconds S] [--rate 5000] [--backends heap rocksdb]
                             [--skip-jobs] [--smoke] [--out PATH]

The 10-minute soak of issue 32: ``--seconds 600 --none-seconds 120`` (the no-ttl run only
shows the growth; ``bounded`` in each soak compares the minute after 2 ttl with the last one).

Writes ``benchmarks/results/ttl.json`` (``--smoke``: a few seconds per run, a temporary file).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from soak import memory, task_processes  # noqa: E402

import epochal as ep  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "ttl.json"
TTL_S = 10.0


def new_keys(split: int, offset: int):
    """A new key per record, for ever."""
    i = offset
    while True:
        yield f"s{split}-{i}"
        i += 1


class Count(ep.KeyedProcessFunction):
    def __init__(self, ttl):
        self.ttl = ttl

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0, ttl=self.ttl)

    def process(self, key, value):
        self.n.update(self.n.value() + 1)
        return None


def flow(name: str, ttl, rate: float | None, limit: int | None, parallelism: int) -> ep.Dataflow:
    f = ep.Dataflow(name, parallelism=parallelism)
    (f.source("keys", ep.sources.GeneratorSource(new_keys, num_splits=parallelism, limit=limit,
                                                 records_per_second=rate))
      .key_by(lambda k: k).process("count", Count(ttl))
      .sink("out", ep.sinks.FileSink(tempfile.mkdtemp(prefix="ttl-bench-out-"), format="jsonl")))
    return f


def soak(backend: str, variant: str, args) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"ttl-soak-{backend}-{variant}-")
    ttl = ep.StateTtl(args.ttl) if variant == "ttl" else None
    handle = flow(f"ttl-soak-{backend}-{variant}", ttl, args.rate, None, args.parallelism).start(
        runtime="local", backend=backend,
        checkpoint=ep.CheckpointConfig(interval=args.interval, storage=f"file://{tmp}/ckpt"))
    seconds = args.seconds if variant == "ttl" else (args.none_seconds or args.seconds)
    samples, t0 = [], time.monotonic()
    try:
        while time.monotonic() - t0 < seconds and handle.running:
            time.sleep(1.0)
            epochs = handle.completed_epochs
            rss = {t: (memory(p) or {}).get("rss") for t, p in task_processes().items() if t.startswith("count")}
            samples.append({"t": round(time.monotonic() - t0, 1),
                            "state_bytes": epochs[-1].get("state_bytes") if epochs else None,
                            "epoch": epochs[-1]["epoch"] if epochs else None,
                            "task_rss": sum(v for v in rss.values() if v),
                            "records_in_per_s": handle.metrics().get("records_in_per_s")})
    finally:
        handle.cancel()
        try:
            handle.wait(60)
        except ep.JobFailedError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    late = [s for s in samples if s["t"] >= 1.5 * args.ttl and s["state_bytes"]]
    return {"backend": backend, "variant": variant, "rate": args.rate, "ttl_s": args.ttl if ttl else None,
            "samples": samples,
            "state_bytes_after_1.5_ttl": {"min": min((s["state_bytes"] for s in late), default=None),
                                          "max": max((s["state_bytes"] for s in late), default=None)},
            "final_state_bytes": samples[-1]["state_bytes"] if samples else None,
            "final_task_rss": samples[-1]["task_rss"] if samples else None,
            "records_per_s": _achieved_rate(samples),
            "bounded": bounded(samples, args.ttl)}


def _achieved_rate(samples) -> float | None:
    """Median records/s the sources read (the soak is rate-limited: says whether the job kept up)."""
    rates = [s["records_in_per_s"] for s in samples if s.get("records_in_per_s")]
    return round(harness.median(rates)) if rates else None


def bounded(samples: list[dict], ttl_s: float) -> dict:
    """State bytes and task RSS in the minute after the first 2 ttl periods against the last
    minute of the run: flat means the last minute's maximum is within ``tolerance`` of the
    first one's (an unbounded state grows with the run length instead)."""
    t_end = samples[-1]["t"] if samples else 0.0
    first = [s for s in samples if 2 * ttl_s <= s["t"] < 2 * ttl_s + 60]
    last = [s for s in samples if s["t"] >= t_end - 60 and s["t"] >= 2 * ttl_s + 60]
    out: dict = {"first_window_s": [2 * ttl_s, 2 * ttl_s + 60], "last_window_s": [max(t_end - 60, 2 * ttl_s + 60), t_end]}
    for field in ("state_bytes", "task_rss"):
        a = [s[field] for s in first if s[field]]
        b = [s[field] for s in last if s[field]]
        out[field] = {"first_max": max(a, default=None), "last_max": max(b, default=None),
                      "last_to_first": round(max(b) / max(a), 3) if a and b else None}
    return out


def capacity(backend: str, variant: str, args) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"ttl-cap-{backend}-{variant}-")
    ttl = ep.StateTtl(args.ttl) if variant == "ttl" else None
    f = flow(f"ttl-cap-{backend}-{variant}", ttl, None, args.capacity_records // args.parallelism, args.parallelism)
    t0 = time.monotonic()
    f.run(runtime="local", backend=backend, checkpoint=ep.CheckpointConfig(interval=1.0, storage=f"file://{tmp}/ckpt"))
    wall = time.monotonic() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    return {"backend": backend, "variant": variant, "records": args.capacity_records, "wall_s": round(wall, 2),
            "records_per_s": round(args.capacity_records / wall)}


def _operator_rate(backend: str, variant: str, keys: list, ttl_s: float) -> float:
    from epochal.backends.heap import HeapStateBackend
    from epochal.backends.rocksdb import RocksDBStateBackend
    from epochal.operators.base import OperatorContext
    from epochal.operators.keyed import KeyedProcessOperator

    b = HeapStateBackend(range(128), snapshot_mode="thread") if backend == "heap" else RocksDBStateBackend(range(128))
    try:
        ctx = OperatorContext("count", "count[0]", 0, 1, 0, "ttl-bench", 128, b, range(128))
        op = KeyedProcessOperator(ctx, str, Count(ep.StateTtl(ttl_s) if variant == "ttl" else None))
        t0 = time.perf_counter()
        for i in range(0, len(keys), 500):
            op.process_batch(keys[i:i + 500])
        return len(keys) / (time.perf_counter() - t0)
    finally:
        b.close()


def operator(backend: str, args) -> list[dict]:
    """Both variants, interleaved repetition by repetition (a loaded machine drifts); the
    ratio ttl / none per repetition, median."""
    keys = [f"k{i}" for i in range(args.operator_records)]
    rates = {"ttl": [], "none": []}
    for rep in range(args.repetitions):
        for variant in (("ttl", "none") if rep % 2 == 0 else ("none", "ttl")):
            rates[variant].append(_operator_rate(backend, variant, keys, args.ttl))
    ratios = [t / n for t, n in zip(rates["ttl"], rates["none"])]
    return [{"backend": backend, "variant": v, "records": args.operator_records,
             "records_per_s": round(harness.median(rates[v])), "per_repetition": [round(r) for r in rates[v]],
             "ttl_to_none_median": round(harness.median(ratios), 3)} for v in ("ttl", "none")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--none-seconds", type=float, default=None,
                   help="soak length of the no-ttl variant (default: --seconds); it only shows the growth")
    p.add_argument("--rate", type=float, default=5000.0)
    p.add_argument("--ttl", type=float, default=TTL_S)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--capacity-records", type=int, default=200_000)
    p.add_argument("--backends", nargs="+", default=["heap", "rocksdb"])
    p.add_argument("--operator-records", type=int, default=200_000)
    p.add_argument("--repetitions", type=int, default=7)
    p.add_argument("--skip-jobs", action="store_true", help="only the in-process operator part")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.seconds, args.ttl, args.rate, args.capacity_records = 4.0, 1.0, 1000.0, 4000
        args.operator_records, args.repetitions = 5000, 1
    out = args.out or (Path(tempfile.mkdtemp()) / "ttl.json" if args.smoke else RESULTS)
    doc = {"benchmark": "ttl", "machine": harness.machine(), "args": {k: v for k, v in vars(args).items()
                                                                          if k != "out"},
           "soak": [], "capacity": [], "operator": [], "errors": []}
    for backend in args.backends:
        doc["operator"].extend(operator(backend, args))
        for variant in ("ttl", "none"):
            if args.skip_jobs:
                continue
            try:
                doc["capacity"].append(capacity(backend, variant, args))
                doc["soak"].append(soak(backend, variant, args))
            except Exception as exc:  # report what ran
                doc["errors"].append(f"{backend}/{variant}: {type(exc).__name__}: {exc}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    for c in doc["operator"]:
        print(f"operator {c['backend']:8s} {c['variant']:5s} {c['records_per_s']:>9,} records/s "
              f"{c['per_repetition']} (ttl/none median {c['ttl_to_none_median']})")
    for c in doc["capacity"]:
        print(f"capacity {c['backend']:8s} {c['variant']:5s} {c['records_per_s']:>9,} records/s")
    for s in doc["soak"]:
        print(f"soak     {s['backend']:8s} {s['variant']:5s} state bytes after 1.5 ttl "
              f"{s['state_bytes_after_1.5_ttl']}, final {s['final_state_bytes']}, task RSS {s['final_task_rss']}, "
              f"bounded {s['bounded']}")
    print(f"wrote {out}")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
