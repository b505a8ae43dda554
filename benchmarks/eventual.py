"""Continuous eventual checkpoints (seed 003) against epoch snapshots, on the same keyed window
job, in one run: does CEC keep the per-record latency free of checkpoint pauses?

The job: ``--tuples`` records ``(key, ts, 1)``, keys uniform over ``--windows`` keys, one
record per µs of event time, tumbling windows of ``--window`` µs closing in event time (every
open window closes at once when the input passes its end: the same burst in every mode); each
window's accumulator carries ``--value-bytes`` of padding, so the state is about
``windows × value_bytes``. Every mode runs the records on one thread, as an epochal task does,
as fast as it can (capacity, not an offered rate); a record's latency is the time its iteration
took, checkpoint work included — so a pause shows as the latency of the records it delays.

==================  ======================================================================
mode                checkpointing
==================  ======================================================================
none-heap           the heap backend (get / add / put per record), no checkpoint
epoch-blocking      + a snapshot every ``--interval`` records, serialized at the barrier
epoch-thread        + the same cadence, copy-on-write, pickled on an uploader thread
epoch-fork          + the same cadence, serialized by a forked child (epochal's default)
none-cec            the CEC operator (``EventualWindows``) with no scheduler and no log
cec                 + Gopen/R and Gchecks (``--budget``, ``--max-extent``) in the output log
                    on local files, one flush every ``--interval`` records (equal cadence)
==================  ======================================================================

Reported per mode: latency p50 / p99 / p999 / max (µs), the latency of the records at a
checkpoint (the barrier's record for epochs, a flush's for CEC), throughput (records/s, and
normalised to its own no-checkpoint mode), and recovery: the time to rebuild the state at the
end of the run and the records to replay (epochs: restore the last snapshot, replay what came
after it; CEC: the eventual checkpoint from the log — its extent in records read back — the
windows restored, the records after T replayed).

What it does not measure: channels and alignment (an epoch barrier's alignment delay is
another cost on top, ``benchmarks/alignment.py``), unaligned checkpoints (channel state: no
channel here), Spark, or a sink. In-process, one operator: the seed's claim is about the
operator's own pauses, and that is what this isolates.

Usage::

    python benchmarks/eventual.py                           # 10k windows, 10 MB state (~1 min)
    python benchmarks/eventual.py --windows 100000 --value-bytes 1000   # 100 MB (~5 min)
    python benchmarks/eventual.py --smoke --out /tmp/e.json # seconds
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from epochal.backends.heap import HeapStateBackend  # noqa: E402
from epochal.backends.keygroups import key_group_for  # noqa: E402
from epochal.backends.storage import CheckpointStorage  # noqa: E402
from epochal.eventual.extent import CheckpointScheduler, ExtentPolicy  # noqa: E402
from epochal.eventual.log import OutputLog  # noqa: E402
from epochal.eventual.operator_state import EventualWindows, Tumbling  # noqa: E402
from epochal.eventual.records import Position  # noqa: E402
from epochal.eventual.recovery import construct  # noqa: E402

MAX_PARALLELISM = 128
STATE = "w/acc"


class Padded:
    """Sum with ``pad`` bytes of state per window (the accumulator is ``(sum, pad)``)."""

    def __init__(self, value_bytes: int):
        self.pad = os.urandom(value_bytes)
        self.made = 0

    @property
    def zero(self):  # a new object per window (pickle would share one object's bytes)
        self.made += 1
        return (0, self.pad[:-4] + self.made.to_bytes(4, "little", signed=False)[:4])

    def add(self, acc, value):
        return (acc[0] + value, acc[1])

    def result(self, acc):
        return acc[0]


def records(args, start: int = 0):
    """``(key, ts)`` of record ``n`` is ``((n * 7919) % windows, n)``: uniform, deterministic, and
    seekable by position (``start``), as a replayable source is."""
    keys = args.windows
    for i in range(start, args.tuples):
        yield (i * 7919) % keys, i


def upload(job, storage, path: str, uploads: list) -> None:
    """The uploader thread: serialize (or, forked, upload) and make the snapshot durable."""
    if job.uses_storage:
        uploads.append(job.run(storage, "bench"))
        return
    data = job.run()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    uploads.append(data)


def run_heap(args, mode: str, tmp: str) -> dict:
    """The epoch modes (and their no-checkpoint baseline) over the heap backend."""
    backend = HeapStateBackend(range(MAX_PARALLELISM), snapshot_mode=None if mode == "none-heap" else mode[6:])
    storage = CheckpointStorage(f"file://{tmp}/ckpt", "bench")
    agg, size = Padded(args.value_bytes), args.window
    lat, at_ckpt, since = [], [], 0
    open_windows, current = set(), None
    uploads: list = []
    threads: list = []
    t_start = time.perf_counter()
    for n, (key, ts) in enumerate(records(args)):
        t0 = time.perf_counter()
        start = ts - ts % size
        if current is not None and start != current:  # the input passed the windows' end: fire them all
            for wid in open_windows:
                backend.delete(STATE, key_group_for(wid, MAX_PARALLELISM), wid)
            open_windows.clear()
        current = start
        wid = (key, start)
        kg = key_group_for(wid, MAX_PARALLELISM)
        acc = backend.get(STATE, kg, wid)
        backend.put(STATE, kg, wid, agg.add(agg.zero if acc is None else acc, 1))
        open_windows.add(wid)
        snap = mode != "none-heap" and (n + 1) % args.interval == 0
        if snap:
            job = backend.snapshot(n)  # the synchronous part, at the barrier
            thread = threading.Thread(target=upload, args=(job, storage, f"{tmp}/chk-{n}", uploads))
            thread.start()
            threads.append(thread)
            since = n + 1
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        if snap:
            at_ckpt.append(t1 - t0)
    elapsed = time.perf_counter() - t_start
    for thread in threads:
        thread.join()
    out = {"elapsed_s": elapsed, "latency": lat, "at_checkpoint": at_ckpt, "checkpoints": len(at_ckpt)}
    blobs = [u for u in uploads if isinstance(u, (bytes, bytearray))]
    if blobs:  # a crash at the last record: restore the last snapshot, replay what came after it
        last_blob = blobs[-1]
        t0 = time.perf_counter()
        HeapStateBackend(range(MAX_PARALLELISM), snapshot_mode="thread").restore([last_blob])
        out["recovery"] = {"restore_s": time.perf_counter() - t0, "replay_records": args.tuples - since,
                           "snapshot_bytes": len(last_blob)}
    elif uploads:
        out["recovery"] = {"replay_records": args.tuples - since, "note": "fork snapshots upload files; "
                           "restore time as for epoch-thread"}
    backend.close()
    return out


def run_cec(args, mode: str, tmp: str) -> dict:
    """CEC (and its own no-checkpoint baseline: no scheduler, no log)."""
    size = args.window
    policy = ExtentPolicy(budget=args.budget, max_extent=args.max_extent)
    logging = mode == "cec"
    log = OutputLog(f"{tmp}/log") if logging else None
    make = lambda: EventualWindows(Tumbling(size), Padded(args.value_bytes), closing="time",  # noqa: E731
                                   scheduler=CheckpointScheduler(policy) if logging else None)
    op = make()
    lat, at_ckpt, lags = [], [], []
    t_start = time.perf_counter()
    for n, (key, ts) in enumerate(records(args)):
        t0 = time.perf_counter()
        t = Position(ts, n)
        out = op.on_tuple(key, 1, t)
        flush = logging and (n + 1) % args.interval == 0
        if logging:
            log.append(out)
            log.append(op.background())
            if flush:
                log.flush()
                log.truncate_behind(op.extent_start())
                lags.append(op.metrics()["extent_lag"])
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        if flush:
            at_ckpt.append(t1 - t0)
    elapsed = time.perf_counter() - t_start
    result = {"elapsed_s": elapsed, "latency": lat, "at_checkpoint": at_ckpt, "checkpoints": len(at_ckpt)}
    if logging:  # a crash at the last record: the EC from the log, its windows, replay after T
        log.flush()
        t0 = time.perf_counter()
        ec = construct(OutputLog(f"{tmp}/log").frames_backward())
        fresh = make()
        fresh.restore(ec)
        replay = 0
        for key, ts in records(args, ec.T.seq + 1):  # the input seeks to the record after T
            fresh.on_tuple(key, 1, Position(ts, ts))
            replay += 1
        result["recovery"] = {"restore_and_replay_s": time.perf_counter() - t0, "replay_records": replay,
                              "extent_records": ec.extent, "open_windows": ec.n,
                              "T_lag_us": ec.tc.ts - ec.T.ts if ec.tc else 0}
        result["extent_lag_us"] = {"max": max(lags, default=0), "median": harness.median(lags)}
        result["footprints"] = op.footprints
        result["log_bytes"] = log.bytes_written
    return result


def summarize(name: str, r: dict) -> dict:
    lat = [x * 1e6 for x in r.pop("latency")]
    at = [x * 1e6 for x in r.pop("at_checkpoint")]
    pct = {f"p{q}": harness.percentile(lat, q) for q in (50, 99, 99.9)}
    r.update({"mode": name, "throughput": len(lat) / r["elapsed_s"], "latency_us": {**pct, "max": max(lat)},
              "at_checkpoint_us": {"median": harness.median(at), "max": max(at, default=None)}})
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tuples", type=int, default=625_000, help="records (the run ends mid-interval: a crash "
                   "at the last record replays half an interval under epochs)")
    p.add_argument("--windows", type=int, default=10_000, help="keys = windows open at once")
    p.add_argument("--window", type=int, default=200_000, help="window size in µs (= records)")
    p.add_argument("--value-bytes", type=int, default=1000)
    p.add_argument("--interval", type=int, default=50_000, help="records between checkpoints / flushes")
    p.add_argument("--budget", type=float, default=0.05)
    p.add_argument("--max-extent", type=int, default=100_000, help="µs")
    p.add_argument("--modes", default="none-heap,epoch-blocking,epoch-thread,epoch-fork,none-cec,cec")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: seconds")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "eventual.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.tuples, args.windows, args.window, args.interval, args.max_extent = 62_500, 2_000, 20_000, 5_000, 10_000
    info = harness.machine()
    doc = harness.new_doc("eventual", args, info)
    doc["errors"], doc["runs"] = [], []
    lines = []
    for mode in args.modes.split(","):
        tmp = tempfile.mkdtemp(prefix=f"eventual-{mode}-")
        try:
            raw = (run_cec if mode in ("cec", "none-cec") else run_heap)(args, mode, tmp)
            doc["runs"].append(summarize(mode, raw))
        except Exception as exc:  # a mode that fails is reported, the others still run
            doc["errors"].append(f"{mode}: {type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    base = {r["mode"]: r for r in doc["runs"]}
    for r in doc["runs"]:
        ref = base.get("none-cec" if "cec" in r["mode"] else "none-heap")
        if ref:
            r["throughput_normalised"] = r["throughput"] / ref["throughput"]
            r["p999_vs_no_checkpoint"] = r["latency_us"]["p99.9"] / ref["latency_us"]["p99.9"]
        lines.append(f"{r['mode']:15s} {r['throughput']:>10,.0f} rec/s  ×{r.get('throughput_normalised', 1):.2f}  "
                     f"p99 {r['latency_us']['p99']:8.1f} µs  p999 {r['latency_us']['p99.9']:8.1f} µs  "
                     f"max {r['latency_us']['max'] / 1000:8.1f} ms  recovery {r.get('recovery', {})}")
    return harness.write_and_report(args.out, doc, info, lines)


if __name__ == "__main__":
    sys.exit(main())
