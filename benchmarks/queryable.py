"""Queryable state: lookup latency and lookups/s against a running job, and what the query
load costs the job (issue 33, seed 004 §4.3.1).

One job per backend (heap, rocksdb — in the task process, ``BackendSpec("rocksdb",
{"query_sidecar": False})`` — and ``rocksdb-sidecar``: RocksDB with its lookups served by a
sidecar process per task, RocksDB's default), local
runtime by default: a source offering ``--rate`` records/s (two splits) feeds a keyed operator keeping one queryable balance per
account (``--keys`` accounts, parallelism 2), epochs every ``--interval`` s. After a warm-up,
``--repetitions`` rounds of four windows of ``--window`` seconds each, interleaved, then one
more query-free window::

    no-queries, read-committed, no-queries, read-uncommitted, no-queries, read-committed, ...

* ``no-queries`` — the job alone;
* ``read-committed`` — one client thread issuing point lookups of random accounts back to
  back (``JobHandle.query``), read from the newest completed epoch;
* ``read-uncommitted`` — the same through the tasks' mailboxes (live state).

Each query window is compared with the mean of the two query-free windows around it (the
machine's load drifts: a side-by-side ratio, not one against a distant baseline); the
ratios of all repetitions are reported with their median, min and max. The same ratio for
every inner query-free window against *its* neighbours is the noise floor: a query effect
smaller than that spread is not resolved.

Reported per window: the keyed operator's records/s (from the tasks' cumulative counters
in the driver's live metrics, every 0.2 s); per query window: lookups/s and latency p50 /
p99 / max (client side, ``perf_counter`` around each call). A multi-key lookup of every
account (read-committed) is timed too.

Usage::

    python benchmarks/queryable.py --out benchmarks/results/queryable.json
    python benchmarks/queryable.py --smoke --out /tmp/q.json        # ~20 s
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.backends.choice import BackendSpec  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


#: RocksDB with read-committed lookups served by a sidecar process per task (epochal.query.sidecar)
SIDECAR = "rocksdb-sidecar"


def deposits(keys: int):
    def generate(split: int, offset: int):
        r = random.Random(split * 7919 + offset)
        while True:
            yield (r.randrange(keys), 1)
    return generate


class Balance(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.balance = ctx.value_state("balance", default=0, queryable=True)

    def process(self, key, record):
        self.balance.update(self.balance.value() + record[1])


def processed(handle) -> int:
    """Records the keyed operator processed so far (cumulative counters of the live metrics)."""
    server = handle._driver.server
    live = dict(getattr(server, "live", {}) or {})
    return sum(m.get("operators", {}).get("balance", [0])[0] for m in live.values())


def measure_window(handle, seconds: float, lookups=None) -> dict:
    """Run ``lookups`` (a callable doing one lookup) back to back for ``seconds``; the
    operator's records/s over the window and the lookups' latencies."""
    latencies: list[float] = []
    stop = threading.Event()

    def load():
        while not stop.is_set():
            t = time.perf_counter()
            lookups()
            latencies.append(time.perf_counter() - t)

    thread = threading.Thread(target=load, daemon=True) if lookups else None
    n0, t0 = processed(handle), time.monotonic()
    if thread:
        thread.start()
    time.sleep(seconds)  # the measurement window itself, not a synchronisation
    stop.set()
    if thread:
        thread.join(30)
    n1, t1 = processed(handle), time.monotonic()
    out = {"records_per_s": (n1 - n0) / (t1 - t0), "window_s": t1 - t0}
    if lookups:
        ms = [x * 1000 for x in latencies]
        out.update(lookups=len(ms), lookups_per_s=len(ms) / (t1 - t0),
                   latency_ms={"p50": harness.percentile(ms, 50), "p99": harness.percentile(ms, 99), "max": max(ms)})
    return out


def side_by_side(windows: list[dict]) -> dict:
    """Per mode, each window's records/s over the mean of its two neighbours (query-free
    windows on both sides, by construction of the order) and the median / min / max of
    those ratios; ``"no-queries"`` rates every inner query-free window against the
    query-free windows two steps away (the noise floor)."""
    out: dict = {}
    for i in range(1, len(windows) - 1):
        mode = windows[i]["mode"]
        step = 2 if mode == "no-queries" else 1
        if i - step < 0 or i + step >= len(windows):
            continue
        around = (windows[i - step]["records_per_s"] + windows[i + step]["records_per_s"]) / 2
        ratio = windows[i]["records_per_s"] / around if around else None
        windows[i]["side_by_side_ratio"] = ratio
        if ratio is not None:
            out.setdefault(mode, {"each": []})["each"].append(ratio)
    for entry in out.values():
        each = sorted(entry["each"])
        entry.update(median=harness.percentile(each, 50), min=each[0], max=each[-1], n=len(each))
    return out


def run_backend(backend: str, args, tmp: str) -> dict:
    name = f"queryable-{backend}-{os.getpid()}"
    flow = ep.Dataflow(name, parallelism=2)
    source = ep.sources.GeneratorSource(deposits(args.keys), num_splits=2, records_per_second=args.rate / 2)
    (flow.source("deposits", source)
         .key_by(lambda r: r[0])
         .process("balance", Balance())
         .sink("out", ep.sinks.FileSink(os.path.join(tmp, name, "out"))))
    spec = backend if backend == "heap" else BackendSpec("rocksdb", {"query_sidecar": backend == SIDECAR})
    handle = flow.start(runtime=args.runtime, backend=spec,
                        checkpoint=ep.CheckpointConfig(interval=args.interval, storage=f"file://{tmp}/{name}/ckpt"),
                        metrics=ep.MetricsConfig(interval=0.2))
    r = random.Random(1)
    try:
        handle.query("balance", "balance", 0, timeout=120)  # the first epoch completed: queries answer
        time.sleep(args.warmup)  # warm-up window
        lookups = {
            "read-committed": lambda: handle.query("balance", "balance", r.randrange(args.keys)),
            "read-uncommitted": lambda: handle.query("balance", "balance", r.randrange(args.keys),
                                                     isolation="read-uncommitted"),
        }
        order = []
        for _ in range(args.repetitions):
            order += ["no-queries", "read-committed", "no-queries", "read-uncommitted"]
        order.append("no-queries")
        windows = []
        for mode in order:
            windows.append({"mode": mode, **measure_window(handle, args.window, lookups.get(mode))})
        every = list(range(args.keys))
        multi = []
        for _ in range(args.multi):
            t = time.perf_counter()
            result = handle.query("balance", "balance", every)
            multi.append((time.perf_counter() - t) * 1000)
        return {"backend": backend, "windows": windows, "ratios": side_by_side(windows),
                "last_epoch_read": result.epoch,
                "multi_key_ms": {"keys": args.keys, "p50": harness.percentile(multi, 50),
                                 "p99": harness.percentile(multi, 99)}}
    finally:
        handle.cancel()
        try:
            handle.wait(60)
        except ep.JobFailedError:
            pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "queryable.json")
    p.add_argument("--runtime", default="local")
    p.add_argument("--backends", default=f"heap,rocksdb,{SIDECAR}")
    p.add_argument("--rate", type=float, default=100_000.0, help="records/s offered (both splits)")
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--interval", type=float, default=0.1, help="epoch interval, seconds")
    p.add_argument("--window", type=float, default=4.0, help="seconds per measurement window")
    p.add_argument("--repetitions", type=int, default=5, help="rounds of (no queries, read-committed, no queries, "
                                                               "read-uncommitted)")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--multi", type=int, default=50, help="multi-key lookups of every account to time")
    p.add_argument("--smoke", action="store_true", help="tiny run: 5k records/s, 1.5 s windows")
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.rate, args.window, args.warmup, args.multi, args.keys = 5000.0, 1.0, 0.5, 5, 100
        args.repetitions = 1
    tmp = args.tmp or tempfile.mkdtemp(prefix="epochal-queryable-")
    doc = {"benchmark": "queryable", "time": harness.now_iso(), "machine": harness.machine(),
           "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "runs": [],
           "errors": []}
    for backend in args.backends.split(","):
        try:
            doc["runs"].append(run_backend(backend, args, tmp))
        except Exception as exc:
            doc["errors"].append(f"{backend}: {type(exc).__name__}: {exc}")
    harness.write_json(args.out, doc)
    for run in doc["runs"]:
        for w in run["windows"]:
            lat = w.get("latency_ms", {})
            ratio = w.get("side_by_side_ratio")
            print(f"{run['backend']:15s} {w['mode']:17s} {w['records_per_s']:>10,.0f} rec/s"
                  + (f" ({ratio:.2f}x its neighbours)" if ratio is not None else " " * 22)
                  + (f"  {w['lookups_per_s']:>8,.0f} lookups/s  p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms"
                     if lat else ""))
        for mode, r in run["ratios"].items():
            print(f"{run['backend']:15s} {mode:17s} side-by-side ratio median {r['median']:.3f} "
                  f"[{r['min']:.3f}, {r['max']:.3f}] over {r['n']}")
        print(f"{run['backend']:15s} multi-key ({run['multi_key_ms']['keys']} keys) p50 "
              f"{run['multi_key_ms']['p50']:.2f} ms p99 {run['multi_key_ms']['p99']:.2f} ms")
    for e in doc["errors"]:
        print("ERROR", e)
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
