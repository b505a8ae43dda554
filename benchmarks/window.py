"""Large-state sliding window: throughput vs. window size at a fixed checkpoint interval.

The synthetic workload of IBM Streams' Fig. 7(b) (seed 000 §7.2): one source sends
tuples to a chain of downstream operators, one of which keeps a sliding window of the
incoming tuples; the window size varies, the checkpoint interval is fixed (8 s). IBM
measured blocking checkpoints losing 4 % of the throughput at 8 MB and 40 % at 512 MB,
non-blocking ones keeping 94 % at 512 MB.

Dataflow (runtime="local" by default, ``--runtime spark`` optional)::

    GeneratorSource (unthrottled, record i = (i, --payload-bytes incompressible bytes))
      → map1 … map<--maps> (pass-through, parallelism 1: fused with the source into one task)
      → key_by(i % --keys) → SlidingWindow (parallelism --parallelism) → jsonl FileSink

``SlidingWindow`` keeps the last ``W`` records of every key in MapState used as a ring
buffer (``window.put(n % W, record)``: the window's content *is* the state) and the
window's count and sum of record indexes in ValueState. ``W = size / (payload × keys)``,
so the windows of all keys together hold ``size`` MB of payload. Every record whose index
is a multiple of ``--emit-every`` makes it emit ``[i, wall time, key, count, sum]``; those
rows are both the benchmark's clock and its check (count and sum have a closed form).

What is measured: the window must be full before the throughput matters. A run feeds
``R = keys × W`` records to fill every window, then ``--post-records`` more (by default
sized from a calibration run so the post-fill phase of a baseline run lasts
``--measure-seconds``, 40 s = five 8 s checkpoints). The **steady rate** of a run is
(records between the first stamp past the fill and the last stamp) / (time between them):
start-up, the fill and the final epoch do not count. The checkpoints of the measured phase
are the periodic ones *triggered* inside it (trigger ≈ completion wall time − duration):
all of them snapshot full windows. Per size and mode the report gives the steady rate
normalised to the no-checkpoint run of the same size and repetition (median of the paired
ratios), checkpoint duration p50/p99, synchronous part per checkpoint (``max_sync_s``, the
task blocked) p50/p99, and bytes uploaded / referenced per checkpoint.

All modes run in one invocation, interleaved: for every repetition and size the modes run
in an order rotated by (repetition + size index), so no mode always runs first.

Reading the modes: ``heap-blocking`` serialises the whole window on the task thread at the
barrier (its upload still runs on the uploader thread; IBM's blocking operator also
persisted synchronously). ``heap-thread`` freezes the buckets (copy-on-write) and
serialises on the uploader thread — which holds the GIL while pickling, so the task thread
still slows down during the serialisation. ``heap-fork`` (the heap default on Linux) forks
at the barrier and serialises in the child process: the task's GIL stays free. ``rocksdb-incr``'s ratio also contains
RocksDB's per-access cost (every record does two gets and two puts through pickle and
RocksDB, ~4× slower than the heap here), since the baseline keeps the window on the heap.

Usage::

    python benchmarks/window.py                  # 8 64 256 MB, 3 repetitions (~45 min on 2 cores)
    python benchmarks/window.py --large          # adds 512 MB (~60 min; --repetitions 1: ~20 min)
    python benchmarks/window.py --sizes 8 512 --repetitions 1 --modes heap-blocking heap-fork
    python benchmarks/window.py --smoke --out /tmp/w.json   # < 60 s

A heap cell lasts ~45 s (start-up, fill, 40 s measured); a rocksdb-incr cell ~3 min (the
same records at a quarter of the rate).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.backends.choice import BackendSpec  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

BASELINE = "no-checkpoint"  # the only mode run with CheckpointConfig(interval=None)
MODES = {
    BASELINE: BackendSpec("heap"),
    "heap-blocking": BackendSpec("heap", {"snapshot_mode": "blocking"}),
    "heap-thread": BackendSpec("heap", {"snapshot_mode": "thread"}),  # copy-on-write, pickled on a thread
    "heap-fork": BackendSpec("heap", {"snapshot_mode": "fork"}),  # the heap default on Linux
    "rocksdb-incr": BackendSpec("rocksdb", {"incremental": True}),
}
COLORS = {BASELINE: "tab:gray", "heap-blocking": "tab:red", "heap-thread": "tab:orange", "heap-fork": "tab:blue",
          "rocksdb-incr": "tab:green"}  # one colour per mode in every panel of the plot


# ---------------------------------------------------------------------- the pipeline
def records_of(payload_bytes: int):
    """The source function: record i = (i, payload_i), payload_i incompressible and a pure
    function of i (so the source stays replayable)."""
    def records(_split: int, offset: int):
        i = offset
        while True:
            yield (i, hashlib.shake_128(i.to_bytes(8, "little")).digest(payload_bytes))
            i += 1
    return records


def passthrough(x):
    """One stateless operator of the chain: forwards every tuple unchanged."""
    return x


class SlidingWindow(ep.KeyedProcessFunction):
    """The last ``size`` records of every key, in MapState used as a ring buffer.

    State per key: ``window`` (slot ``n % size`` → record) and ``agg`` = (records seen n,
    sum of the record indexes in the window), updated incrementally (the evicted record is
    read back). Emits ``[i, time.time(), key, records in window, sum]`` for every record
    whose index ``i`` is a multiple of ``emit_every``.
    """

    def __init__(self, size: int, emit_every: int):
        self.size = size
        self.emit_every = emit_every

    def open(self, ctx):
        self.window = ctx.map_state("window")
        self.agg = ctx.value_state("agg", default=(0, 0))

    def process(self, key, record):
        i = record[0]
        n, total = self.agg.value()
        slot = n % self.size
        evicted = self.window.get(slot)
        if evicted is not None:
            total -= evicted[0]
        self.window.put(slot, record)
        n += 1
        total += i
        self.agg.update((n, total))
        if i % self.emit_every == 0:
            return ([i, time.time(), key, min(n, self.size), total],)
        return None


def window_job(name: str, out: str, *, keys: int, per_key: int, post_records: int, payload_bytes: int,
               maps: int, emit_every: int, parallelism: int) -> ep.Dataflow:
    """source → map×``maps`` → key_by(i % keys) → SlidingWindow(per_key) → jsonl sink."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    src = ep.sources.GeneratorSource(records_of(payload_bytes), num_splits=1,
                                     limit=keys * per_key + post_records, records_per_second=None)
    stream = flow.source("records", src, parallelism=1)
    for k in range(1, maps + 1):
        stream = stream.map(f"map{k}", passthrough, parallelism=1)
    (stream.key_by(lambda r: r[0] % keys).process("window", SlidingWindow(per_key, emit_every))
           .sink("out", FileSink(out, format="jsonl"), parallelism=1))
    return flow


def check_stamps(stamps: list, keys: int, per_key: int) -> int:
    """Number of emitted rows whose key, count or sum is wrong. Key k receives i = k, k +
    keys, ... in order, so after record i its window holds n = min(i // keys + 1, per_key)
    records: i, i - keys, ..., i - (n - 1) keys."""
    bad = 0
    for i, _t, key, n, total in stamps:
        m = min(i // keys + 1, per_key)
        bad += key != i % keys or n != m or total != m * i - keys * m * (m - 1) // 2
    return bad


# ---------------------------------------------------------------------- one run
def window_shape(size_mb: float, args) -> tuple[int, int]:
    """(records per key window W, total window records R = keys × W) for ``size_mb`` MB."""
    per_key = max(1, int(size_mb * (1 << 20)) // (args.payload_bytes * args.keys))
    return per_key, per_key * args.keys


def run_once(size_mb: float, mode: str, post_records: int, args, spark, rep: int) -> dict:
    per_key, fill = window_shape(size_mb, args)
    work = tempfile.mkdtemp(prefix=f"epochal-window-{mode}-", dir=args.tmp)
    out = os.path.join(work, "out")
    flow = window_job(f"window-{mode}-{size_mb:g}", out, keys=args.keys, per_key=per_key, post_records=post_records,
                      payload_bytes=args.payload_bytes, maps=args.maps, emit_every=args.emit_every,
                      parallelism=args.parallelism)
    interval = None if mode == BASELINE else args.interval
    rec = {"size_mb": size_mb, "mode": mode, "repetition": rep, "interval_s": interval, "per_key": per_key,
           "fill_records": fill, "post_records": post_records, "window_bytes": fill * args.payload_bytes,
           "loadavg_1m_before": os.getloadavg()[0]}
    try:
        result = harness.run_job(flow, rec, args.run_timeout, runtime=args.runtime, spark=spark, backend=MODES[mode],
                                 checkpoint=ep.CheckpointConfig(interval=interval, timeout=600,
                                                                storage="file://" + os.path.join(work, "ckpt")))
        stamps = sorted(harness.jsonl_rows(out)) if result is not None else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result is None:
        return rec
    rec.update(measure(stamps, result.completed_epochs, fill))
    rec["records_per_s"] = result.records_in / rec["wall_s"]
    rec["attempts"] = result.attempts
    expected = fill + post_records
    bad = check_stamps(stamps, args.keys, per_key)
    if result.records_in != expected:
        rec["error"] = f"source read {result.records_in} records, expected {expected}"
    elif bad or len(stamps) != len(range(0, expected, args.emit_every)):
        rec["error"] = f"{bad} wrong window aggregates, {len(stamps)} rows for {expected} records"
    elif rec["steady_records_per_s"] is None:
        rec["error"] = "fewer than two stamps after the fill: raise --post-records or lower --emit-every"
    return rec


def measure(stamps: list, epochs: list[dict], fill: int) -> dict:
    """Steady post-fill rate from the stamps; the periodic checkpoints triggered in that phase."""
    post = [s for s in stamps if s[0] >= fill]
    t_start, t_end = (post[0][1], post[-1][1]) if post else (None, None)
    steady = (post[-1][0] - post[0][0]) / (t_end - t_start) if len(post) >= 2 and t_end > t_start else None
    measured = [e for e in epochs if e["reason"] == "periodic" and post
                and t_start <= e["wall_time"] - e["duration_s"] <= t_end]
    keep = ("epoch", "duration_s", "max_sync_s", "max_alignment_s", "max_upload_s", "bytes", "state_bytes")
    return {
        "steady_records_per_s": steady,
        "measured_s": t_end - t_start if post else None,
        "fill_s": t_start - stamps[0][1] if post and stamps else None,
        "stamps": len(stamps),
        "periodic_checkpoints": sum(1 for e in epochs if e["reason"] == "periodic"),
        "measured_checkpoints": [{k: e.get(k) for k in keep} for e in measured],
    }


# ---------------------------------------------------------------------- aggregation
def aggregate(runs: list[dict]) -> dict:
    """``{size: {mode: row}}``: the ratio is the median over repetitions of the run's steady
    rate / the no-checkpoint steady rate of the same size and repetition; checkpoint
    percentiles pool the measured checkpoints of all repetitions."""
    ok = [r for r in runs if "error" not in r]
    base = {(r["size_mb"], r["repetition"]): r["steady_records_per_s"] for r in ok if r["mode"] == BASELINE}
    out: dict = {}
    for size in sorted({r["size_mb"] for r in runs}):
        for mode in [m for m in MODES if any(r["mode"] == m for r in runs)]:
            rs = [r for r in ok if r["size_mb"] == size and r["mode"] == mode]
            ratios = [r["steady_records_per_s"] / base[(size, r["repetition"])] for r in rs
                      if base.get((size, r["repetition"]))]
            ck = [c for r in rs for c in r["measured_checkpoints"]]
            out.setdefault(f"{size:g}", {})[mode] = {
                "runs_ok": len(rs),
                "runs_failed": sum(1 for r in runs if r["size_mb"] == size and r["mode"] == mode and "error" in r),
                "ratio_to_baseline": harness.median(ratios),
                "paired_ratios": harness.summary(ratios),
                "steady_records_per_s": harness.summary([r["steady_records_per_s"] for r in rs]),
                "whole_records_per_s": harness.median([r["records_per_s"] for r in rs]),
                "fill_s": harness.median([r["fill_s"] for r in rs]),
                "measured_s": harness.median([r["measured_s"] for r in rs]),
                "measured_checkpoints": harness.summary([len(r["measured_checkpoints"]) for r in rs]),
                "checkpoint_duration_s": _p50_p99([c["duration_s"] for c in ck]),
                "sync_s": _p50_p99([c["max_sync_s"] for c in ck]),
                "bytes_per_checkpoint": harness.median([c["bytes"] for c in ck]),
                "state_bytes_per_checkpoint": harness.median([c["state_bytes"] for c in ck]),
            }
    return out


def _p50_p99(values: list[float]) -> dict:
    return {"p50": harness.percentile(values, 50), "p99": harness.percentile(values, 99)}


def _ms(d: dict) -> str:
    return "-" if d["p50"] is None else f"{d['p50'] * 1e3:.0f} / {d['p99'] * 1e3:.0f}"


def render(summary: dict) -> str:
    rows = []
    for size, modes in summary.items():
        for mode, s in modes.items():
            rows.append([size, mode, harness.fmt(s["steady_records_per_s"]["median"]),
                         harness.fmt(s["ratio_to_baseline"], ".3f"),
                         harness.fmt(s["measured_checkpoints"]["median"], ".0f"),
                         _ms(s["checkpoint_duration_s"]), _ms(s["sync_s"]),
                         harness.fmt(s["bytes_per_checkpoint"] and s["bytes_per_checkpoint"] / 2**20, ".1f")])
    return harness.table(["MB", "mode", "steady rec/s", "ratio", "ckpts", "ckpt p50/p99 ms", "sync p50/p99 ms",
                          "MB/ckpt"], rows)


# ---------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=None, help="window state sizes in MB (default 8 64 256)")
    p.add_argument("--large", action="store_true", help="add 512 MB")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                   help=f"modes to run (default all; {BASELINE} always runs: ratios need it)")
    p.add_argument("--interval", type=float, default=None, help="checkpoint interval in s (default 8, IBM's)")
    p.add_argument("--repetitions", type=int, default=None, help="interleaved repetitions (default 3; 1 with --smoke)")
    p.add_argument("--measure-seconds", type=float, default=None,
                   help="size the post-fill phase so a baseline run spends about this long in it (default 40)")
    p.add_argument("--post-records", type=int, default=None, help="records after the fill (overrides calibration)")
    p.add_argument("--payload-bytes", type=int, default=1024)
    p.add_argument("--keys", type=int, default=None, help="distinct keys (default 256; 16 with --smoke)")
    p.add_argument("--maps", type=int, default=4, help="stateless maps between the source and the window")
    p.add_argument("--emit-every", type=int, default=None, help="stamp/aggregate every k-th record (default 1000)")
    p.add_argument("--parallelism", type=int, default=2, help="parallelism of the window operator")
    p.add_argument("--runtime", choices=("local", "spark"), default="local")
    p.add_argument("--run-timeout", type=float, default=900.0, help="s before a run is cancelled as hung")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and interval, < 60 s")
    p.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/window.json)")
    p.add_argument("--plot", type=Path, default=None, help="PNG (default: next to the JSON)")
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    smoke = args.smoke
    args.modes = [m for m in MODES if m in args.modes or m == BASELINE]
    if args.sizes is None:
        args.sizes = [0.5, 1.0] if smoke else [8, 64, 256] + ([512] if args.large else [])
    elif args.large and 512 not in args.sizes:
        args.sizes.append(512)
    args.interval = args.interval or (0.3 if smoke else 8.0)
    args.repetitions = args.repetitions or (1 if smoke else 3)
    args.measure_seconds = args.measure_seconds or (2.0 if smoke else 40.0)
    args.keys = args.keys or (16 if smoke else 256)
    args.emit_every = args.emit_every or (50 if smoke else 1000)
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "window.json" if smoke
                    else harness.RESULTS / "window.json")
    args.plot = args.plot or args.out.with_suffix(".png")
    return args


def calibrate(args, spark) -> tuple[int, dict]:
    """Post-fill records for ~measure-seconds, from a baseline run at the smallest size."""
    probe_post = 10_000 if args.smoke else 60_000
    rec = run_once(min(args.sizes), BASELINE, probe_post, args, spark, rep=-1)
    rate = rec.get("steady_records_per_s") or rec.get("records_per_s") or 10_000
    return max(probe_post, int(rate * args.measure_seconds)), rec


def main(argv=None) -> int:
    args = parse_args(argv)
    info = harness.machine()
    print(f"epochal window benchmark: runtime={args.runtime} sizes={args.sizes} MB interval={args.interval} s "
          f"repetitions={args.repetitions} cores={info['cpu_count']} load={info['loadavg_at_start']}", flush=True)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(args.parallelism + 2)
    doc = {**harness.new_doc("window", args, info),
           "modes": {m: {"kind": s.kind, "options": s.options, "color": COLORS[m],
                         "checkpoints": m != BASELINE} for m, s in MODES.items()},
           "method": {
               "workload": f"GeneratorSource → {args.maps} pass-through maps → key_by(i % {args.keys}) → "
                           f"sliding window (MapState ring buffer, {args.payload_bytes} B incompressible payload per "
                           f"record, parallelism {args.parallelism}) → jsonl FileSink",
               "steady_rate": "records between the first stamp after every window is full and the last stamp / "
                              "time between them (start-up, fill and final epoch excluded)",
               "ratio": "median over repetitions of steady rate / no-checkpoint steady rate (same size, repetition)",
               "checkpoints": "periodic checkpoints triggered inside the measured phase (all of full windows)",
           },
           "runs": []}
    t_start = time.monotonic()
    try:
        if args.post_records is None:
            args.post_records, probe = calibrate(args, spark)
            doc["calibration"] = probe
            print(f"calibration: baseline {harness.fmt(probe.get('steady_records_per_s'))} rec/s → "
                  f"{args.post_records:,} post-fill records {probe.get('error', '')}", flush=True)
        doc["config"]["post_records"] = args.post_records
        for rep in range(args.repetitions):
            for k, size in enumerate(args.sizes):
                for mode in harness.rotated(args.modes, rep + k):
                    r = run_once(size, mode, args.post_records, args, spark, rep)
                    doc["runs"].append(r)
                    print(f"[{time.monotonic() - t_start:6.0f} s] {size:>5g} MB {mode:<16s} " + (
                        f"ERROR {r['error']}" if "error" in r else
                        f"steady {harness.fmt(r['steady_records_per_s']):>8s} rec/s  fill {r['fill_s']:.1f} s  "
                        f"measured {r['measured_s']:.1f} s  {len(r['measured_checkpoints'])} ckpts  "
                        f"load {r['loadavg_1m_before']:.1f}"), flush=True)
    finally:
        harness.finish(doc, info)
        doc["total_s"] = time.monotonic() - t_start
        doc["summary"] = aggregate(doc["runs"])
        doc["errors"] = [f"{r['size_mb']:g} MB {r['mode']} rep {r['repetition']}: {r['error']}"
                         for r in doc["runs"] if "error" in r]
        harness.write_json(args.out, doc)
    print()
    print(render(doc["summary"]))
    print(f"total {doc['total_s']:.0f} s")
    return harness.plot_and_exit_code("window", doc, args.plot, args.out)


if __name__ == "__main__":
    sys.exit(main())
