"""Consistent regions (issue 30): does a failure in one part of a job leave the other alone?

One job, two independent pipelines — A and B, each a scheduled source → ``key_by`` →
running count (keyed state) → an exactly-once jsonl ``FileSink`` — run in three modes:

* ``failure-free``: A and B in two regions, nothing killed (the reference);
* ``one-region``: no regions (the job is one region, as before regions existed) and
  ``RestartStrategy(failover="full")``: every failure restarts every task; a task process of
  B's count is SIGKILLed from outside every ``--kill-every`` seconds;
* ``failover``: no regions, the default ``failover="region"``: A and B share no channel, so
  they are two failover regions of the one region and B restarts alone; the same kills;
* ``two-regions``: ``ep.Region("a")`` and ``ep.Region("b")``, the same kills.

Record ``i`` of a split is *due* at ``t0 + i / rate`` (the source never emits it earlier and
catches up after a restart), so a record's latency = the time a read-committed reader (a
directory poller, every 2 ms) first saw it − its due time: it counts the epoch wait, the
commit and any stall a restart causes. Per mode: A's latency p50/p99/max and its longest
output gap (the longest time no new A output became visible) over the records due after
the warm-up, B's the same, and B's recovery time (failure seen → restarted attempt running,
from the attempt timelines). Every run's committed output is checked against a plain-Python
oracle (count per key, each value 1..n once): exactly-once, no record lost or repeated.

    python benchmarks/regions.py [--runtime spark|local] [--seconds 40] [--kill-every 10]
        [--rate 2000] [--interval 0.05] [--repetitions 1] [--smoke] [--out PATH]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from latency import FileReader  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402
from epochal.sources.base import Poll, Source, SourceReader  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "regions.json"
KEYS = 32
MODES = ["failure-free", "one-region", "failover", "two-regions"]


class ScheduledSource(Source):
    """Record ``i`` of split ``s``: ``{"k", "t": due time, "i"}``, emitted once ``t0 + i / rate``
    passed; replayable (a pure function of the offset), ``limit`` records per split."""

    def __init__(self, t0: float, rate: float, limit: int, splits: int = 1):
        self.t0, self.rate, self.limit, self.n = t0, rate, limit, splits

    def splits(self) -> list:
        return list(range(self.n))

    def create_reader(self, splits, state, *, subtask=0, parallelism=1) -> SourceReader:
        return _Reader(self, list(splits), state or {})


class _Reader(SourceReader):
    def __init__(self, source: ScheduledSource, splits: list, state: dict):
        self.s = source
        self.offset = {sp: int(state.get(str(sp), 0)) for sp in splits}

    def poll(self, max_records: int) -> Poll:
        now = time.time()
        for sp, i in self.offset.items():
            due = min(self.s.limit, int((now - self.s.t0) * self.s.rate) + 1, i + max_records)
            if due > i:
                self.offset[sp] = due
                return Poll([{"k": (sp * 7919 + j) % KEYS, "t": self.s.t0 + j / self.s.rate, "i": j}
                             for j in range(i, due)], split=sp,
                            finished=all(o >= self.s.limit for o in self.offset.values()))
        if all(o >= self.s.limit for o in self.offset.values()):
            return Poll([], finished=True)
        return Poll([], idle=True)

    def snapshot(self) -> dict:
        return {str(sp): i for sp, i in self.offset.items()}


class Count(ep.KeyedProcessFunction):
    """Running count per key; ``[k, n, t]`` out. Leaves ``<pid>-<random>`` in ``pid_dir`` per
    open, so the benchmark finds the process to kill and counts (re)starts."""

    def __init__(self, pid_dir: str):
        self.pid_dir = pid_dir

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)
        open(os.path.join(self.pid_dir, f"{os.getpid()}-{uuid.uuid4().hex[:6]}"), "w").close()

    def process(self, key, record):
        self.n.update(self.n.value() + 1)
        yield {"k": key, "n": self.n.value(), "t": record["t"]}


def oracle(limit: int) -> collections.Counter:
    """Plain Python: the rows a running count per key emits for ``limit`` records (split 0)."""
    per_key = collections.Counter((0 * 7919 + j) % KEYS for j in range(limit))
    return collections.Counter((k, n) for k, c in per_key.items() for n in range(1, c + 1))


def build(mode: str, tmp: str, t0: float, args) -> tuple[ep.Dataflow, dict]:
    limit = int(args.rate * args.seconds)
    flow = ep.Dataflow("regions-bench", parallelism=1)
    dirs = {}
    for part in ("a", "b"):
        out, pids = os.path.join(tmp, f"out-{part}"), os.path.join(tmp, f"pids-{part}")
        os.makedirs(pids)
        src = flow.source(f"src-{part}", ScheduledSource(t0, args.rate, limit),
                          region=None if mode in ("one-region", "failover") else part)
        src.key_by(lambda r: r["k"]).process(f"count-{part}", Count(pids)).sink(f"out-{part}", FileSink(out))
        dirs[part] = (out, pids)
    return flow, dirs


def latency(seen: list, since: float) -> dict:
    lat = [s - t for s, t, _epoch in seen if t >= since]
    stamps = sorted(s for s, t, _epoch in seen if t >= since)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"records": len(lat), "p50_s": harness.percentile(lat, 50), "p99_s": harness.percentile(lat, 99),
            "max_s": max(lat, default=None), "longest_gap_s": max(gaps, default=None)}


def recoveries(result) -> list[float]:
    """Failure seen → the next attempt running, per restart (seconds); for a failover
    region restarting alone: failure seen → its restarted tasks running again
    (``JobResult.failovers``' ``running_s``)."""
    if result.failovers:
        return [f["running_s"] for f in result.failovers]
    timeline = result.attempt_timeline
    return [timeline[i + 1]["running_s"] - timeline[i]["failed_s"] for i in range(len(timeline) - 1)
            if timeline[i].get("failed_s") is not None and timeline[i + 1].get("running_s") is not None]


def _kill_newest(pid_dir: str, killed: set, kills: list, t0: float) -> bool:
    """SIGKILL the newest live process that opened B's count; False when there is none."""
    names = sorted(os.listdir(pid_dir), key=lambda n: os.path.getmtime(os.path.join(pid_dir, n)), reverse=True)
    for name in names:
        pid = int(name.split("-")[0])
        if pid in killed:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.add(pid)
        kills.append({"pid": pid, "at_s": time.time() - t0})
        return True
    return False


def one_run(mode: str, args, spark) -> dict:
    tmp = tempfile.mkdtemp(prefix="epochal-regions-")
    t0 = time.time() + args.warmup
    flow, dirs = build(mode, tmp, t0, args)
    readers = {p: FileReader(out, 0.002, keep_rows=True) for p, (out, _pids) in dirs.items()}
    for r in readers.values():
        r.start()
    rec: dict = {"mode": mode, "loadavg_at_start": os.getloadavg()[0]}
    kills: list[dict] = []
    stop = threading.Event()

    def killer():
        pids_b = dirs["b"][1]
        killed: set[int] = set()
        first = t0 + args.kill_every
        k = 0
        while not stop.is_set():
            at = first + k * args.kill_every
            if at > t0 + args.seconds - args.kill_every / 2:
                return
            if stop.wait(max(0.0, at - time.time())):
                return
            if _kill_newest(pids_b, killed, kills, t0):
                k += 1
            else:  # B's task not (re)started yet: try again shortly
                stop.wait(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    if mode != "failure-free":
        thread.start()
    options = dict(runtime=args.runtime, checkpoint=ep.CheckpointConfig(interval=args.interval,
                                                                        storage=f"file://{tmp}/ckpt"),
                   restart=ep.RestartStrategy(max_attempts=100, delay=0.0,
                                              failover="full" if mode == "one-region" else "region"),
                   metrics=ep.MetricsConfig(log=False, status=False))
    if args.runtime == "spark":
        options["spark"] = spark
    result = harness.run_job(flow, rec, timeout=args.seconds + args.warmup + 300, **options)
    stop.set()
    for r in readers.values():
        r.stop.set()
        r.join()
    rec["kills"] = kills
    if result is None:
        return rec
    limit = int(args.rate * args.seconds)
    truth = oracle(limit)
    for part, r in readers.items():
        got = collections.Counter((row["k"], row["n"]) for row in r.rows)
        rec[f"exact_{part}"] = got == truth
        rec[f"latency_{part}"] = latency(r.seen, t0 + args.settle)
    per_region = result.regions or {"job": result}
    rec["attempts"] = {name: res.attempts for name, res in per_region.items()}
    rec["recovery_s"] = {name: recoveries(res) for name, res in per_region.items()}
    rec["opens"] = {part: len(os.listdir(pids)) for part, (_out, pids) in dirs.items()}
    rec["failovers"] = len(result.failovers)
    rec["loadavg_at_end"] = os.getloadavg()[0]
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="spark", choices=["spark", "local"])
    parser.add_argument("--seconds", type=float, default=40.0, help="input duration per run")
    parser.add_argument("--kill-every", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s per pipeline")
    parser.add_argument("--interval", type=float, default=0.05, help="checkpoint interval (both regions)")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds from start to the first due record")
    parser.add_argument("--settle", type=float, default=2.0, help="records due in the first seconds are ignored")
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, local runtime, one repetition")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.smoke:
        args.runtime, args.seconds, args.kill_every, args.rate, args.warmup, args.repetitions = \
            "local", 6.0, 3.0, 500.0, 8.0, 1
        if args.out == RESULTS:
            args.out = Path(tempfile.mkdtemp()) / "regions.json"
    info = harness.machine()
    doc = harness.new_doc("regions", args, info)
    doc["runs"], doc["errors"] = [], []
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import session_for

        spark = session_for(None, 8)
    for rep in range(args.repetitions):
        for mode in harness.rotated(MODES, rep):
            rec = one_run(mode, args, spark)
            rec["repetition"] = rep
            doc["runs"].append(rec)
            if "error" in rec:
                doc["errors"].append(f"{mode} #{rep}: {rec['error']}")
            elif not (rec["exact_a"] and rec["exact_b"]):
                doc["errors"].append(f"{mode} #{rep}: output differs from the oracle (a: {rec['exact_a']}, "
                                     f"b: {rec['exact_b']})")
            elif mode != "failure-free" and not rec["kills"]:
                doc["errors"].append(f"{mode} #{rep}: no kill landed")
            print(json.dumps({k: rec.get(k) for k in ("mode", "kills", "attempts", "latency_a", "latency_b",
                                                      "recovery_s", "exact_a", "exact_b")}), flush=True)
    lines = []
    for rec in doc["runs"]:
        if "latency_a" in rec:
            a, b = rec["latency_a"], rec["latency_b"]
            lines.append(f"{rec['mode']:13s} kills {len(rec['kills'])}: A p99 {harness.fmt(a['p99_s'], '.3f')} s "
                         f"max gap {harness.fmt(a['longest_gap_s'], '.2f')} s | B p99 {harness.fmt(b['p99_s'], '.3f')}"
                         f" s max gap {harness.fmt(b['longest_gap_s'], '.2f')} s | recovery {rec['recovery_s']} "
                         f"| attempts {rec['attempts']}")
    return harness.write_and_report(args.out, doc, info, lines)


if __name__ == "__main__":
    sys.exit(main())
