"""End-to-end latency: a record enters the pipeline → a read-committed reader sees it.

Pipeline (issue 24): a rate-limited ``GeneratorSource`` (2 splits) → ``key_by`` (64 keys) →
``reduce`` (a running count per key; the output carries the input's production time) → an
exactly-once sink, parallelism 2. Sinks: the jsonl ``FileSink`` (a reader lists the output
directory every ``--poll`` seconds and reads each newly published part file) and the
transactional ``LogSink`` (a read_committed ``LogReader`` per partition, polled as often).
A record's latency = the time the reader first saw it − its production time.

Each cell (sink × rate × checkpoint interval × ``max_concurrent``) is one run; cells are
interleaved (every repetition rotates the order), and a 1 s-interval run at the same rate
is the throughput reference: *throughput* = records / (last − first production time), the
rate the source achieved (back-pressure from checkpointing slows it), and its ratio to the
reference run of the same sink, rate and repetition.

Where the latency goes, per record (from the completed epochs' timings; the record's epoch
is in its part file or commit marker):

* ``wait_s`` — production → its epoch's trigger (about half the interval);
* ``checkpoint_s`` — trigger → ``_metadata`` written: the barrier's travel and alignment,
  the snapshot, the sinks' durability steps and state upload, the acknowledgements;
* ``visible_s`` — ``_metadata`` written → seen by the reader: the ``complete`` message, the
  sink's commit, the reader's poll.

and per epoch (medians over epochs of the slowest task): ``barrier_s`` (trigger → snapshot
start), ``alignment_s``, ``sync_s``, ``upload_s`` (of which ``durable_s``), ``ack_s``
(trigger → last ack), ``metadata_s``.

    python benchmarks/latency.py [--runtime spark|local] [--seconds 6] [--rates 10000 100000]
        [--intervals 0.005 0.01 0.02 1] [--concurrency 1 4] [--sinks file log]
        [--repetitions 1] [--smoke] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink, LogSink  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "latency.json"
KEYS = 64
_FILE_EPOCH = re.compile(r"-e(\d+)-")


def stamped(split: int, offset: int):
    """Record i of a split with its production time (a benchmark-only, non-replayable field)."""
    i = offset
    while True:
        yield {"k": (split * 7919 + i) % KEYS, "t": time.time(), "n": 1}
        i += 1


def key(record: dict) -> int:
    return record["k"]


def count(acc: dict, record: dict) -> dict:
    return {"k": record["k"], "t": record["t"], "n": acc["n"] + 1}


class Poller(threading.Thread):
    """Polls the sink's committed output like an external read-committed consumer;
    ``seen`` holds ``(seen_at, produced_at, epoch)`` per record."""

    def __init__(self, poll: float):
        super().__init__(daemon=True)
        self.poll, self.seen = poll, []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.scan()
            time.sleep(self.poll)
        self.scan()

    def scan(self):
        raise NotImplementedError


class FileReader(Poller):
    """Polls a FileSink directory; with ``keep_rows`` also keeps every committed row in
    ``rows`` (for an oracle check)."""

    def __init__(self, path: str, poll: float, keep_rows: bool = False):
        super().__init__(poll)
        self.path, self.files, self.keep_rows, self.rows = path, set(), keep_rows, []

    def scan(self):
        if not os.path.isdir(self.path):
            return
        for name in sorted(os.listdir(self.path)):
            if name.startswith(("_", ".")) or name in self.files:
                continue
            now = time.time()
            m = _FILE_EPOCH.search(name)
            epoch = int(m.group(1)) if m else None
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    row = json.loads(line)
                    if self.keep_rows:
                        self.rows.append(row)
                    self.seen.append((now, row["t"], epoch))
            self.files.add(name)


class LogTopicReader(Poller):
    def __init__(self, root: str, topic: str, partitions: int, poll: float):
        super().__init__(poll)
        self.root, self.topic, self.partitions = root, topic, partitions
        self.readers, self.offsets, self.batches = None, [0] * partitions, [0] * partitions

    def scan(self):
        from epochal.sources.log import LogReader, TransactionalLog

        if self.readers is None:
            log = TransactionalLog(self.root, self.topic)
            if not log.exists():
                return
            self.readers = [LogReader(self.root, self.topic, p, log=log) for p in range(self.partitions)]
        for p, reader in enumerate(self.readers):
            reader.refresh()
            now = time.time()
            batches = reader.batches()
            for batch in batches[self.batches[p]:]:
                epoch = _txn_epoch(batch.txn)
                for record in reader.read(batch.base_offset, batch.count):
                    self.seen.append((now, record["t"], epoch))
            self.batches[p] = len(batches)


class Reader(threading.Thread):
    """Polls a FileSink directory every 10 ms (used by ``backpressure.py``): ``latencies``
    per record (seen − its ``"t"``), ``sink_times`` the records' ``"w"`` stamps if any."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.path, self.seen_files, self.latencies = path, set(), []
        self.sink_times: list[float] = []
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


def _txn_epoch(txn) -> int | None:
    m = re.search(r"e(\d+)", str(txn))
    return int(m.group(1)) if m else None


def one_run(sink_kind: str, rate: float, interval: float, concurrent: int, args, spark) -> dict:
    tmp = tempfile.mkdtemp(prefix="epochal-latency-")
    per_split = int(rate / 2 * args.seconds)
    flow = ep.Dataflow("latency", parallelism=2)
    src = flow.source("src", ep.sources.GeneratorSource(stamped, num_splits=2, limit=per_split,
                                                        records_per_second=rate / 2))
    counted = src.key_by(key).reduce("count", count)
    if sink_kind == "file":
        out = os.path.join(tmp, "out")
        counted.sink("out", FileSink(out, format="jsonl"))
        reader: Poller = FileReader(out, args.poll)
    else:
        counted.sink("out", LogSink(os.path.join(tmp, "log"), "t", partitions=2))
        reader = LogTopicReader(os.path.join(tmp, "log"), "t", 2, args.poll)
    reader.start()
    result = flow.run(guarantee="exactly-once", runtime=args.runtime, spark=spark,
                      checkpoint=ep.CheckpointConfig(interval=interval, max_concurrent=concurrent,
                                                     storage=f"file://{tmp}/ckpt"),
                      channels=ep.ChannelConfig(linger=args.linger))
    reader.stop.set()
    reader.join()
    seen = reader.seen
    lat = [s - p for s, p, _e in seen]
    produced = sorted(p for _s, p, _e in seen)
    span = produced[-1] - produced[0] if len(produced) > 1 else None
    epochs = {e["epoch"]: e for e in result.completed_epochs}
    parts = {"wait_s": [], "checkpoint_s": [], "visible_s": []}
    for s, p, e in seen:
        c = epochs.get(e)
        if c is None:
            continue
        trigger, done = c["wall_time"] - c["duration_s"], c["wall_time"] + c.get("metadata_s", 0.0)
        parts["wait_s"].append(trigger - p)
        parts["checkpoint_s"].append(done - trigger)
        parts["visible_s"].append(s - done)
    per_epoch = {k: [] for k in ("barrier_s", "alignment_s", "sync_s", "upload_s", "durable_s", "ack_s")}
    for c in result.completed_epochs:
        for k in per_epoch:
            values = [t[k] for t in c["tasks"].values() if t.get(k) is not None]
            if values:
                per_epoch[k].append(max(values))
    per_epoch["metadata_s"] = [c.get("metadata_s", 0.0) for c in result.completed_epochs]
    per_epoch["duration_s"] = [c["duration_s"] for c in result.completed_epochs]
    return {
        "sink": sink_kind, "rate": rate, "interval_s": interval, "max_concurrent": concurrent,
        "records": len(lat), "expected": 2 * per_split, "loadavg": os.getloadavg()[0],
        "latency_s": {q: harness.percentile(lat, v) for q, v in (("p50", 50), ("p90", 90), ("p99", 99),
                                                               ("p999", 99.9))} | {"max": max(lat, default=None)},
        "parts_s": {k: {"p50": harness.percentile(v, 50), "p99": harness.percentile(v, 99)} for k, v in parts.items()},
        "per_epoch_p50_s": {k: harness.percentile(v, 50) for k, v in per_epoch.items()},
        "per_epoch_p99_s": {k: harness.percentile(v, 99) for k, v in per_epoch.items()},
        "throughput": len(lat) / span if span else None,
        "completed_epochs": len(result.completed_epochs), "aborted_epochs": len(result.aborted_epochs),
        "duration_s": result.duration_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="exactly-once end-to-end latency")
    parser.add_argument("--runtime", default="spark", choices=["spark", "local"])
    parser.add_argument("--seconds", type=float, default=6.0, help="input duration per run")
    parser.add_argument("--rates", type=float, nargs="+", default=[10_000.0, 100_000.0], help="records/s in total")
    parser.add_argument("--intervals", type=float, nargs="+", default=[0.005, 0.01, 0.02])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="checkpoint max_concurrent")
    parser.add_argument("--sinks", nargs="+", default=["file", "log"], choices=["file", "log"])
    parser.add_argument("--reference", type=float, default=1.0, help="the throughput reference interval")
    parser.add_argument("--poll", type=float, default=0.002, help="reader poll period")
    parser.add_argument("--linger", default="2ms")
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rates, args.intervals, args.concurrency, args.sinks = 1.0, [2000.0], [0.02], [2], ["file"]
    out = args.out or (Path(tempfile.mkdtemp()) / "latency.json" if args.smoke else RESULTS)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(8)
    started, machine = harness.now_iso(), harness.machine()
    cells = [(s, r, i, c) for s in args.sinks for r in args.rates for i in args.intervals for c in args.concurrency]
    cells += [(s, r, args.reference, 1) for s in args.sinks for r in args.rates]
    runs = []
    for rep in range(args.repetitions):
        for sink_kind, rate, interval, concurrent in harness.rotated(cells, rep):
            print(f"rep {rep}: {sink_kind} sink, {rate:,.0f} rec/s, interval {interval:g} s, max_concurrent "
                  f"{concurrent} (load {os.getloadavg()[0]:.1f}) ...", flush=True)
            run = one_run(sink_kind, rate, interval, concurrent, args, spark)
            run["repetition"] = rep
            runs.append(run)
    for run in runs:
        ref = next((r for r in runs if r["sink"] == run["sink"] and r["rate"] == run["rate"]
                    and r["interval_s"] == args.reference and r["repetition"] == run["repetition"]), None)
        run["throughput_vs_reference"] = (run["throughput"] / ref["throughput"]
                                          if ref and ref["throughput"] and run["throughput"] else None)
    rows = [[r["sink"], f"{r['rate']:,.0f}", f"{r['interval_s']:g}", str(r["max_concurrent"]),
             *(harness.fmt(1e3 * r["latency_s"][q], ".1f") if r["latency_s"][q] is not None else "-"
               for q in ("p50", "p99", "p999")),
             harness.fmt(r["throughput"], ",.0f"), harness.fmt(r["throughput_vs_reference"], ".2f"),
             harness.fmt(1e3 * (r["per_epoch_p50_s"]["duration_s"] or 0), ".1f"),
             f"{r['completed_epochs']}/{r['aborted_epochs']}", f"{r['records']}/{r['expected']}",
             f"{r['loadavg']:.1f}"] for r in runs]
    print(harness.table(["sink", "rate", "interval s", "conc", "p50 ms", "p99 ms", "p999 ms", "rec/s", "vs 1 s",
                         "ckpt p50 ms", "epochs/aborted", "records", "load"], rows))
    harness.write_json(out, {"benchmark": "latency", "command": " ".join(sys.argv), "started_at": started,
                             "finished_at": harness.now_iso(), "machine": machine,
                             "config": {"runtime": args.runtime, "seconds": args.seconds, "poll": args.poll,
                                        "linger": args.linger, "keys": KEYS},
                             "runs": runs})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
