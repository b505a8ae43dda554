"""End-to-end latency: a record enters the pipeline → a read-committed reader sees it.

For each guarantee (exactly-once: transactional FileSink, published when the epoch
completes; at-least-once: the same sink publishing at each barrier) and each checkpoint
interval (default 0.2, 1, 5 s), one run of a rate-limited pipeline (source → map →
rebalance → sink, parallelism 2). Each record carries the wall-clock time at which the
source produced it; a reader thread lists the output directory every 10 ms and reads each
newly visible part file, so a record's latency = time the reader first saw it − its
production time. Runs are interleaved across modes; the JSON keeps every percentile.

    python benchmarks/latency.py [--runtime spark|local] [--seconds 12] [--rate 2000]
                                 [--intervals 0.2 1 5] [--smoke] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "latency.json"


def stamped(split: int, offset: int):
    """Record i of a split with its production time (a benchmark-only, non-replayable field)."""
    i = offset
    while True:
        yield {"split": split, "i": i, "t": time.time()}
        i += 1


def tag(record: dict) -> dict:
    return record


class Reader(threading.Thread):
    """Polls the sink directory like an external read-committed consumer."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.path, self.seen_files, self.latencies = path, set(), []
        self.sink_times: list[float] = []  # when the records seen reached the sink ("w"), if stamped
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.scan()
            time.sleep(0.01)
        self.scan()

    def scan(self):
        if not os.path.isdir(self.path):
            return
        for name in sorted(os.listdir(self.path)):
            if name.startswith(("_", ".")) or name in self.seen_files:
                continue
            now = time.time()
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    record = json.loads(line)
                    self.latencies.append(now - record["t"])
                    if "w" in record:
                        self.sink_times.append(record["w"])
            self.seen_files.add(name)


def one_run(guarantee: str, interval: float, args, spark) -> dict:
    tmp = tempfile.mkdtemp(prefix="epochal-latency-")
    out = os.path.join(tmp, "out")
    per_split = int(args.rate / 2 * args.seconds)
    flow = ep.Dataflow("latency", parallelism=2)
    src = flow.source("src", ep.sources.GeneratorSource(stamped, num_splits=2, limit=per_split,
                                                        records_per_second=args.rate / 2))
    src.map("tag", tag).rebalance().sink("out", FileSink(out, format="jsonl"))
    reader = Reader(out)
    reader.start()
    result = flow.run(guarantee=guarantee, runtime=args.runtime, spark=spark,
                      checkpoint=ep.CheckpointConfig(interval=interval, storage=f"file://{tmp}/ckpt"),
                      channels=ep.ChannelConfig(linger="5ms"))
    reader.stop.set()
    reader.join()
    lat = reader.latencies
    return {
        "guarantee": guarantee, "interval_s": interval, "records": len(lat), "expected": 2 * per_split,
        "latency_s": {"p50": harness.percentile(lat, 50), "p90": harness.percentile(lat, 90),
                      "p99": harness.percentile(lat, 99), "max": max(lat) if lat else None},
        "completed_epochs": len(result.completed_epochs), "duration_s": result.duration_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="end-to-end latency, exactly-once vs at-least-once")
    parser.add_argument("--runtime", default="spark", choices=["spark", "local"])
    parser.add_argument("--seconds", type=float, default=12.0, help="input duration per run")
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s in total")
    parser.add_argument("--intervals", type=float, nargs="+", default=[0.2, 1.0, 5.0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.intervals = 1.0, [0.2]
    out = args.out or (Path(tempfile.mkdtemp()) / "latency.json" if args.smoke else RESULTS)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(8)
    started = harness.now_iso()
    runs = []
    for interval in args.intervals:
        for guarantee in ("exactly-once", "at-least-once"):
            print(f"running {guarantee} @ {interval} s ...", flush=True)
            runs.append(one_run(guarantee, interval, args, spark))
    rows = [[r["guarantee"], f"{r['interval_s']:g}", harness.fmt(r["latency_s"]["p50"], ".3f"),
             harness.fmt(r["latency_s"]["p99"], ".3f"), str(r["records"]), str(r["completed_epochs"])]
            for r in runs]
    print(harness.table(["guarantee", "interval s", "p50 s", "p99 s", "records", "epochs"], rows))
    harness.write_json(out, {"benchmark": "latency", "command": " ".join(sys.argv), "started_at": started,
                             "finished_at": harness.now_iso(), "machine": harness.machine(),
                             "config": {"runtime": args.runtime, "seconds": args.seconds, "rate": args.rate},
                             "runs": runs})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
