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
epoch-aligned       epoch-thread with the input on two channels (records alternate), the
                    barrier reaching channel 1 ``--skew`` of its records after channel 0:
                    epochal's ``AlignedBarrierHandler`` blocks channel 0 until then (its
                    records wait: their latency counts from when they arrived)
epoch-unaligned     the same two channels, the snapshot at the first barrier with channel 1's
                    in-flight records (the ``--skew`` before its barrier) pickled as channel
                    state, no channel blocked
none-cec            the CEC operator (``EventualWindows``) with no scheduler and no log
cec                 + Gopen/R and Gchecks (``--budget``, ``--max-extent``) in the output log
                    on local files, one flush every ``--interval`` records (equal cadence)
==================  ======================================================================

Then recovery against the extent: ``cec`` again for each ``--extents`` value of ``max_extent``
(the same input; budget ``--sweep-budget``, 0 by default, so max_extent alone sets the extent),
each reporting the eventual checkpoint's extent (records read back, T's lag)
and the time to rebuild the windows and replay after T (``recovery_vs_extent`` in the JSON).

Reported per mode: latency p50 / p99 / p999 / max (µs; the max is the longest pause), the latency of the records at a
checkpoint (the barrier's record for epochs, a flush's for CEC), throughput (records/s, and
normalised to its own no-checkpoint mode), and recovery: the time to rebuild the state at the
end of the run and the records to replay (epochs: restore the last snapshot, replay what came
after it; CEC: the eventual checkpoint from the log — its extent in records read back — the
windows restored, the records after T replayed).

Throughput is normalised to the mode's own no-checkpoint run (``throughput_normalised``: heap
modes to ``none-heap``, CEC to ``none-cec``) and to ``none-heap`` (``throughput_vs_none_heap``).
The JSON records the machine's load average at the start and the end (``machine.loadavg_at_start``,
``loadavg_at_end``): figures from a loaded machine are not the quiet result.

What it does not measure: real channels between processes (the two channels are queues of the
one loop: the alignment's hold and the channel state's size, not a network), Spark, or a sink.
In-process, one operator: the seed's claim is about the operator's own pauses, and that is what
this isolates.

Usage::

    python benchmarks/eventual.py                           # --size small: 10k windows, 10 MB
    python benchmarks/eventual.py --size medium             # 100k windows, 100 MB (~10× longer)
    python benchmarks/eventual.py --size large              # 1M windows, 1 GB (heap; hours, ≥ 8 GB RAM)
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

from epochal.alignment.handlers import AlignedBarrierHandler  # noqa: E402
from epochal.backends.heap import HeapStateBackend  # noqa: E402
from epochal.backends.keygroups import key_group_for  # noqa: E402
from epochal.backends.storage import CheckpointStorage  # noqa: E402
from epochal.eventual.extent import CheckpointScheduler, ExtentPolicy  # noqa: E402
from epochal.eventual.log import OutputLog  # noqa: E402
from epochal.eventual.operator_state import EventualWindows, Tumbling  # noqa: E402
from epochal.eventual.records import Position  # noqa: E402
from epochal.eventual.recovery import construct  # noqa: E402
from epochal.epochs.barrier import Barrier  # noqa: E402
import pickle  # noqa: E402

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



def _fire_all(backend, open_windows: set) -> None:
    """Every open window fires (its state deleted): the input passed their end."""
    for wid in open_windows:
        backend.delete(STATE, key_group_for(wid, MAX_PARALLELISM), wid)
    open_windows.clear()


def _count(backend, agg, open_windows: set, wid) -> None:
    """One record into window ``wid``'s count (a get and a put on the heap backend)."""
    kg = key_group_for(wid, MAX_PARALLELISM)
    acc = backend.get(STATE, kg, wid)
    backend.put(STATE, kg, wid, agg.add(agg.zero if acc is None else acc, 1))
    open_windows.add(wid)

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
            _fire_all(backend, open_windows)
        current = start
        _count(backend, agg, open_windows, (key, start))
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


def run_channels(args, mode: str, tmp: str) -> dict:
    """``epoch-aligned`` / ``epoch-unaligned``: the heap backend's copy-on-write snapshots
    (``thread``) with the input on two channels, record ``i`` on channel ``i % 2``. Epoch ``e``'s
    barrier reaches channel 0 before global record ``e * interval`` and channel 1 ``--skew`` of
    its records later. Aligned: the real handler blocks channel 0 between them; its records are
    held and processed after the snapshot, their latency from arrival to done. Unaligned: the
    snapshot is taken at channel 0's barrier, with channel 1's in-flight records pickled."""
    backend = HeapStateBackend(range(MAX_PARALLELISM), snapshot_mode="thread")
    storage = CheckpointStorage(f"file://{tmp}/ckpt", "bench")
    agg, size, skew, interval = Padded(args.value_bytes), args.window, args.skew, args.interval
    aligned = mode == "epoch-aligned"
    handler = AlignedBarrierHandler(2)
    lat, at_ckpt, held, channel_state = [], [], [], []
    current = None
    open_windows: set = set()
    uploads: list = []
    threads: list = []

    def process(key, ts):
        nonlocal current
        start = ts - ts % size
        if current is None or start > current:  # the input passed the windows' end: fire them all
            _fire_all(backend, open_windows)
            current = start
        _count(backend, agg, open_windows, (key, start))

    def snapshot(epoch, extra=None):
        job = backend.snapshot(epoch)
        thread = threading.Thread(target=upload, args=(job, storage, f"{tmp}/chk-{epoch}", uploads))
        thread.start()
        threads.append(thread)
        if extra is not None:
            channel_state.append(len(pickle.dumps(extra)))

    def release():
        for key, ts, t_arrive in held:
            process(key, ts)
            lat.append(time.perf_counter() - t_arrive)
        held.clear()

    t_start = time.perf_counter()
    for i, (key, ts) in enumerate(records(args)):
        ch = i % 2
        t_arrive = time.perf_counter()
        epoch = i // interval
        if ch == 0 and i % interval == 0 and i:
            if aligned:
                handler.on_barrier(0, Barrier(epoch))
            else:  # unaligned: snapshot now, with what is in flight on channel 1 before its barrier
                snapshot(epoch, [r for r in records_at(args, range(i + 1, i + 2 * skew + 1, 2))])
                at_ckpt.append(time.perf_counter() - t_arrive)
        if ch == 1 and i > interval and (i - 2 * skew - 1) % interval == 0 and aligned:
            result = handler.on_barrier(1, Barrier(epoch))
            if result.snapshot_epoch is not None:
                snapshot(result.snapshot_epoch)
                at_ckpt.append(time.perf_counter() - t_arrive)
                release()
        if aligned and handler.is_blocked(ch):
            held.append((key, ts, t_arrive))
            continue
        process(key, ts)
        lat.append(time.perf_counter() - t_arrive)
    release()
    elapsed = time.perf_counter() - t_start
    for thread in threads:
        thread.join()
    out = {"elapsed_s": elapsed, "latency": lat, "at_checkpoint": at_ckpt, "checkpoints": len(at_ckpt),
           "alignment": "aligned" if aligned else "unaligned", "skew_records": skew}
    if channel_state:
        out["channel_state_bytes"] = {"median": harness.median(channel_state), "max": max(channel_state)}
    blobs = [u for u in uploads if isinstance(u, (bytes, bytearray))]
    if blobs:
        t0 = time.perf_counter()
        HeapStateBackend(range(MAX_PARALLELISM), snapshot_mode="thread").restore([blobs[-1]])
        last = (args.tuples - 1) // interval * interval
        out["recovery"] = {"restore_s": time.perf_counter() - t0, "replay_records": args.tuples - last,
                           "snapshot_bytes": len(blobs[-1])}
    backend.close()
    return out


def records_at(args, indices) -> list:
    """The records at global ``indices`` (what a channel holds in flight)."""
    keys = args.windows
    return [((i * 7919) % keys, i) for i in indices if i < args.tuples]


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


SIZES = {  # windows open at once, bytes of state each: ≈ 10 MB, 100 MB, 1 GB on the heap backend
    "small": {"windows": 10_000, "value_bytes": 1000},
    "medium": {"windows": 100_000, "value_bytes": 1000},
    "large": {"windows": 1_000_000, "value_bytes": 1000},
}


def summarize(name: str, r: dict) -> dict:
    lat = [x * 1e6 for x in r.pop("latency")]
    at = [x * 1e6 for x in r.pop("at_checkpoint")]
    pct = {f"p{q}": harness.percentile(lat, q) for q in (50, 99, 99.9)}
    r.update({"mode": name, "throughput": len(lat) / r["elapsed_s"], "latency_us": {**pct, "max": max(lat)},
              "longest_pause_us": max(lat),
              "at_checkpoint_us": {"median": harness.median(at), "max": max(at, default=None)}})
    return r


def sweep_extents(args, extents: list[int]) -> list[dict]:
    """``cec`` once per ``max_extent`` (µs): recovery time and tuples replayed against the extent."""
    rows = []
    for extent in extents:
        tmp = tempfile.mkdtemp(prefix="eventual-extent-")
        try:
            r = run_cec(argparse.Namespace(**{**vars(args), "max_extent": extent, "budget": args.sweep_budget}),
                        "cec", tmp)
            rec = r["recovery"]
            rows.append({"max_extent_us": extent, "budget": args.sweep_budget, "extent_records": rec["extent_records"],
                         "T_lag_us": rec["T_lag_us"], "open_windows": rec["open_windows"],
                         "replay_records": rec["replay_records"], "recovery_s": rec["restore_and_replay_s"],
                         "extent_lag_us_max": r["extent_lag_us"]["max"],
                         "throughput": len(r["latency"]) / r["elapsed_s"],
                         "p999_us": harness.percentile([x * 1e6 for x in r["latency"]], 99.9)})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="small",
                   help="open windows × state per window: small 10k × 1 kB, medium 100k, large 1M; the window, "
                   "the records and the checkpoint interval scale with it")
    p.add_argument("--tuples", type=int, default=None, help="records (default: 78 per window = 3.9 windows: the "
                   "run ends late in a window, whose footprints are then old unless max_extent forces Gchecks, and "
                   "mid-interval: a crash at the last record replays 0.8 of an interval under epochs)")
    p.add_argument("--windows", type=int, default=None, help="keys = windows open at once (default: --size)")
    p.add_argument("--window", type=int, default=None, help="window size in µs (= records; default 20 per key)")
    p.add_argument("--value-bytes", type=int, default=None, help="state bytes per window (default: --size)")
    p.add_argument("--interval", type=int, default=None, help="records between checkpoints / flushes "
                   "(default: 5 per key)")
    p.add_argument("--skew", type=int, default=None, help="epoch-aligned/unaligned: channel 1's records between "
                   "the barrier on channel 0 and its own (default: interval / 10)")
    p.add_argument("--budget", type=float, default=0.05)
    p.add_argument("--max-extent", type=int, default=None, help="µs (default: half a window)")
    p.add_argument("--extents", default=None, help="max_extent values (µs, comma-separated) for recovery against "
                   "the extent (default: window/8, /4, /2, 1, 2 windows); 'none' to skip")
    p.add_argument("--sweep-budget", type=float, default=0.0, help="the budget of the --extents runs (0: only "
                   "max_extent forces Gchecks, so it alone sets the extent)")
    p.add_argument("--modes", default="none-heap,epoch-blocking,epoch-thread,epoch-fork,epoch-aligned,"
                   "epoch-unaligned,none-cec,cec")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: seconds")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "eventual.json")
    args = p.parse_args(argv)
    size = SIZES[args.size]
    if args.smoke:
        size = {"windows": 2_000, "value_bytes": 1000}
    args.windows = args.windows or size["windows"]
    args.value_bytes = args.value_bytes or size["value_bytes"]
    args.window = args.window or 20 * args.windows
    args.tuples = args.tuples or 78 * args.windows
    args.interval = args.interval or 5 * args.windows
    args.interval += args.interval % 2  # channel 0's barrier falls on an even record
    args.skew = args.skew if args.skew is not None else args.interval // 10
    args.max_extent = args.max_extent or args.window // 2
    if not 0 <= 2 * args.skew + 1 < args.interval:
        p.error(f"--skew must be below half the interval ({args.interval // 2}), got {args.skew}")
    extents = [] if args.extents == "none" else (
        [int(x) for x in args.extents.split(",")] if args.extents else
        [args.window // 8, args.window // 4, args.window // 2, args.window, 2 * args.window])
    info = harness.machine()
    doc = harness.new_doc("eventual", args, info)
    doc["errors"], doc["runs"] = [], []
    lines = []
    for mode in args.modes.split(","):
        tmp = tempfile.mkdtemp(prefix=f"eventual-{mode}-")
        try:
            run = run_cec if mode in ("cec", "none-cec") else run_channels if mode in (
                "epoch-aligned", "epoch-unaligned") else run_heap
            doc["runs"].append(summarize(mode, run(args, mode, tmp)))
        except Exception as exc:  # a mode that fails is reported, the others still run
            doc["errors"].append(f"{mode}: {type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        doc["recovery_vs_extent"] = sweep_extents(args, extents)
    except Exception as exc:
        doc["errors"].append(f"extents: {type(exc).__name__}: {exc}")
    base = {r["mode"]: r for r in doc["runs"]}
    for r in doc["runs"]:
        ref = base.get("none-cec" if "cec" in r["mode"] else "none-heap")
        if ref:
            r["throughput_normalised"] = r["throughput"] / ref["throughput"]
            r["p999_vs_no_checkpoint"] = r["latency_us"]["p99.9"] / ref["latency_us"]["p99.9"]
        if "none-heap" in base:
            r["throughput_vs_none_heap"] = r["throughput"] / base["none-heap"]["throughput"]
        lines.append(f"{r['mode']:15s} {r['throughput']:>10,.0f} rec/s  ×{r.get('throughput_normalised', 1):.2f}  "
                     f"p99 {r['latency_us']['p99']:8.1f} µs  p999 {r['latency_us']['p99.9']:8.1f} µs  "
                     f"max {r['latency_us']['max'] / 1000:8.1f} ms  recovery {r.get('recovery', {})}")
    for row in doc.get("recovery_vs_extent", []):
        lines.append(f"max_extent {row['max_extent_us']:>9,} µs: extent {row['extent_records']:>7,} records, T lag "
                     f"{row['T_lag_us']:>9,} µs, replay {row['replay_records']:>9,}, recovery {row['recovery_s']:.3f} s")
    return harness.write_and_report(args.out, doc, info, lines)


if __name__ == "__main__":
    sys.exit(main())
