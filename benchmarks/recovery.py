"""Recovery time after a crash, by keyed-state size and backend — golden vs crash runs.

The job has the shape of ``state.py`` (``make_flow``: one source → key_by → ``store`` →
jsonl FileSink; ``size / value_bytes`` keys each get one incompressible value, then hot
keys are updated), parallelism 2, checkpoint interval 1 s, exactly-once. Its ``store``
function here is :class:`CheckedStore`: every update emits ``(key, record, crc32 of the
value it replaces)``, so the committed output proves both exactly-once delivery and that
the restored values are the right ones.

Per state size (default 1, 64, 256 MB) and backend (default heap and RocksDB with full
snapshots; ``rocksdb-incr`` optional) one *golden* run and one *crash* run per
repetition. The crash is ``CrashAtRecord("store", subtask=0, how="exit", after_epoch=E)``
at ``--crash-at`` (80 %) of that task's input, where ``E`` is the first periodic epoch of
the cell's first golden run whose checkpoint holds the full state (≥ 95 % of the final
epoch's bytes): the process dies at the later of the two, so the restart restores a
checkpoint of (about) the nominal size — with an unthrottled source the state loads
faster than large checkpoints complete, and a crash after epoch 1 would restore a
fraction of it. From ``JobResult.attempt_timeline``:

- **recovery** = failure seen by the coordinator → every task of the next attempt has
  restored its state and runs, split into *stop* (the failed attempt's tasks are gone),
  *restart* (the driver picks the newest checkpoint and verifies its files' checksums,
  then starts a coordinator), *launch* (task processes up and connected) and *restore*
  (tasks read and install their state; ``restore_s`` per task is reported too);
- **extra wall time** = crash run − golden run (recovery + re-processing since the
  restored checkpoint + noise);
- the committed output of the crash run must equal the golden run's (multiset).

A process crash is seen at once on loopback (its coordinator connection closes), so the
failure time is the crash time within milliseconds. On Spark (``--runtime spark``) restart
differs: the failed attempt's barrier stage is cancelled (``cancelJobGroup``), the next
attempt is a new barrier stage, surviving tasks keep their Python workers and the crashed
one gets a new worker from Spark's daemon.

Usage::

    python benchmarks/recovery.py                         # 1, 64, 256 MB x heap, rocksdb, 2 repetitions (~10 min)
    python benchmarks/recovery.py --backends heap rocksdb rocksdb-incr --repetitions 3
    python benchmarks/recovery.py --smoke --out /tmp/r.json   # < 60 s
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloudpickle  # noqa: E402
import harness  # noqa: E402
import state  # noqa: E402  (the keyed job's shape and the backend specs)

cloudpickle.register_pickle_by_value(state)  # its pipeline functions run in the task processes

import epochal as ep  # noqa: E402
from epochal.backends.keygroups import key_group_for, subtask_for_key_group  # noqa: E402
from epochal.sinks import read_committed  # noqa: E402
from epochal.testing import CrashAtRecord  # noqa: E402

BACKENDS = {"heap": state.MODES["heap-fork"], "rocksdb": state.MODES["rocksdb-full"],
            "rocksdb-incr": state.MODES["rocksdb-incr"]}
PARTS = ("stop_s", "restart_s", "launch_s", "restore_s")


class CheckedStore(ep.KeyedProcessFunction):
    """Keeps the newest incompressible value per key (as ``state.Store``); every update
    (a key written before) emits ``(key, record, crc32(previous value))``: deterministic,
    so a crash run's output must equal the golden run's."""

    def __init__(self, value_bytes: int):
        self.value_bytes = value_bytes

    def open(self, ctx):
        self.v = ctx.value_state("v")

    def process(self, key, value):
        old = self.v.value()
        self.v.update(random.Random(value).randbytes(self.value_bytes))
        if old is not None:
            yield (key, value, zlib.crc32(old))


def records_of_subtask(keys: int, updates: int, subtask: int, parallelism: int, max_parallelism: int) -> int:
    """How many records the ``store`` task ``subtask`` receives (keys hashed as the job does)."""
    def mine(key):
        return subtask_for_key_group(key_group_for(key, max_parallelism), parallelism, max_parallelism) == subtask

    hot = {}
    n = sum(1 for k in range(keys) if mine(k))
    for i in range(keys, keys + updates):
        k = state.key_of_record(i, keys)
        if k not in hot:
            hot[k] = mine(k)
        n += hot[k]
    return n


# ---------------------------------------------------------------------- one run
def run_once(size_mb: int, backend: str, crash: tuple[int, int] | None, args, spark) -> dict:
    """One golden (``crash=None``) or crash run (``crash=(record, after_epoch)``);
    measurements and the committed output multiset."""
    keys = max(1, size_mb * (1 << 20) // args.value_bytes)
    work = tempfile.mkdtemp(prefix=f"epochal-recovery-{backend}-", dir=args.tmp)
    out = os.path.join(work, "out")
    updates = updates_for(keys, args)
    flow = state.make_flow(f"recovery-{backend}-{size_mb}", out, keys, updates, args.value_bytes,
                           args.parallelism, CheckedStore(args.value_bytes))
    faults = [] if crash is None else [CrashAtRecord("store", record=crash[0], subtask=0, how=args.how,
                                                     after_epoch=crash[1])]
    record = {"size_mb": size_mb, "backend": backend, "kind": "golden" if crash is None else "crash",
              "keys": keys, "updates": updates, "records": keys + updates, "crash": crash,
              "loadavg_1m_before": os.getloadavg()[0]}
    try:
        t0 = time.monotonic()
        handle = flow.start(runtime=args.runtime, spark=spark, backend=BACKENDS[backend], faults=faults,
                            checkpoint=ep.CheckpointConfig(interval=args.interval, timeout=600,
                                                           storage="file://" + os.path.join(work, "ckpt")),
                            restart=ep.RestartStrategy(max_attempts=2, delay=0))
        try:
            result = handle.wait(args.run_timeout)
        except TimeoutError:
            handle.cancel()
            record["error"] = f"hung: not finished after {args.run_timeout} s (cancelled)"
            return record
        record["wall_s"] = time.monotonic() - t0
        record["output"] = collections.Counter(json.dumps(r) for r in read_committed(out))
    except Exception as exc:  # reported, not hidden: the other cells still run
        record["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)
    timeline = result.attempt_timeline
    record.update(duration_s=result.duration_s, attempts=result.attempts, timeline=timeline,
                  startup_s=timeline[0]["running_s"], records_after_restore=result.records_in,
                  output_records=sum(record["output"].values()),
                  epochs=[{"epoch": e["epoch"], "reason": e["reason"], "duration_s": round(e["duration_s"], 4),
                           "state_mb": round(e["state_bytes"] / 2**20, 3)} for e in result.completed_epochs])
    if crash is None:
        if result.attempts != 1:
            record["error"] = f"golden run failed: {result.failures}"
        return record
    if result.attempts != 2:
        record["error"] = (f"expected one crash and one restart, got {result.attempts} attempt(s): "
                           f"{result.failures or 'the fault never fired (crash record beyond the input?)'}")
        return record
    failed, again = timeline
    if again["restored_epoch"] is None:
        record["error"] = "the restart found no completed checkpoint (restored from scratch)"
    restore = [t["restore_s"] for t in again["tasks"].values()]
    record.update(
        failed_at_s=failed["failed_s"], restored_epoch=again["restored_epoch"],
        restored_mb=again["restored_bytes"] / 2**20,
        recovery_s=again["running_s"] - failed["failed_s"],
        parts_s={"stop_s": failed["stopped_s"] - failed["failed_s"],
                 "restart_s": again["launched_s"] - failed["stopped_s"],
                 "launch_s": again["connected_s"] - again["launched_s"],
                 "restore_s": again["running_s"] - again["connected_s"]},
        task_restore_s=max(restore), cause=(failed["cause"] or "").splitlines()[0][:300],
    )
    return record


# ---------------------------------------------------------------------- aggregation
def aggregate(runs: list[dict]) -> list[dict]:
    """Per (size, backend): recovery parts and extra wall time of the crash runs, each
    paired with the golden run of the same repetition; output equality of every pair."""
    out = []
    for size, backend in sorted({(r["size_mb"], r["backend"]) for r in runs},
                                key=lambda c: (c[0], list(BACKENDS).index(c[1]))):
        cell = [r for r in runs if r["size_mb"] == size and r["backend"] == backend]
        pairs = []
        for rep in sorted({r["repetition"] for r in cell}):
            golden = next((r for r in cell if r["repetition"] == rep and r["kind"] == "golden"), None)
            crash = next((r for r in cell if r["repetition"] == rep and r["kind"] == "crash"), None)
            if golden and crash and "error" not in golden and "error" not in crash:
                pairs.append((golden, crash))
        if not pairs:
            out.append({"size_mb": size, "backend": backend, "runs_ok": 0})
            continue
        crashes = [c for _g, c in pairs]
        out.append({
            "size_mb": size, "backend": backend, "runs_ok": len(pairs),
            "restored_mb": harness.summary([c["restored_mb"] for c in crashes]),
            "restored_epoch": [c["restored_epoch"] for c in crashes],
            "recovery_s": harness.summary([c["recovery_s"] for c in crashes]),
            "parts_p50_s": {k: harness.median([c["parts_s"][k] for c in crashes]) for k in PARTS},
            "task_restore_s": harness.summary([c["task_restore_s"] for c in crashes]),
            "golden_startup_s": harness.summary([g["startup_s"] for g, _c in pairs]),
            "golden_s": harness.summary([g["duration_s"] for g, _c in pairs]),
            "crash_s": harness.summary([c["duration_s"] for c in crashes]),
            "extra_s": harness.summary([c["duration_s"] - g["duration_s"] for g, c in pairs]),
            "failed_at_s": harness.summary([c["failed_at_s"] for c in crashes]),
            "outputs_equal": all(c["output_equal"] for c in crashes),
        })
    return out


def updates_for(keys: int, args) -> int:
    return max(args.updates, int(args.updates_per_key * keys))


def full_state_epoch(golden: dict) -> int | None:
    """The first periodic epoch whose checkpoint holds ≥ 95 % of the final epoch's bytes,
    if two later periodic epochs follow it (the crash run, whose checkpoints run at other
    times, needs records left after it)."""
    periodic = [e for e in golden["epochs"] if e["reason"] != "final"]
    full = golden["epochs"][-1]["state_mb"] * 0.95
    first = next((i for i, e in enumerate(periodic) if e["state_mb"] >= full), None)
    return periodic[first]["epoch"] if first is not None and first + 2 < len(periodic) else None


def render(summary: list[dict]) -> str:
    rows = []
    for c in summary:
        if not c.get("runs_ok"):
            rows.append([str(c["size_mb"]), c["backend"], "failed"] + [""] * 7)
            continue
        parts = c["parts_p50_s"]
        rows.append([str(c["size_mb"]), c["backend"], harness.fmt(c["restored_mb"]["median"], ".1f"),
                     harness.fmt(c["recovery_s"]["median"], ".2f"),
                     " ".join(f"{k[:-2]}={parts[k]:.2f}" for k in PARTS),
                     harness.fmt(c["task_restore_s"]["median"], ".2f"), harness.fmt(c["golden_startup_s"]["median"], ".2f"),
                     harness.fmt(c["golden_s"]["median"], ".1f"), harness.fmt(c["extra_s"]["median"], ".2f"),
                     "yes" if c["outputs_equal"] else "NO"])
    return harness.table(["MB", "backend", "restored MB", "recovery s", "parts (median s)", "task restore s",
                          "cold start s", "golden s", "extra s", "output equal"], rows)


# ---------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="keyed state in MB (default 1 64 256)")
    p.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=["heap", "rocksdb"])
    p.add_argument("--updates", type=int, default=None,
                   help="hot-key updates after loading, at least (default 400000; 60000 with --smoke)")
    p.add_argument("--updates-per-key", type=float, default=2.0,
                   help="updates are at least this many per key (large states need a long update phase, so "
                        "that full-state checkpoints complete before the end; default 2)")
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--crash-at", type=float, default=0.8, help="fraction of store[0]'s input at which it crashes")
    p.add_argument("--how", choices=("exit", "raise"), default="exit", help="process crash or task exception")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--repetitions", type=int, default=None, help="golden + crash pairs per cell (default 2)")
    p.add_argument("--runtime", choices=("local", "spark"), default="local")
    p.add_argument("--run-timeout", type=float, default=900.0)
    p.add_argument("--smoke", action="store_true", help="1 and 2 MB, 1 repetition, < 60 s; JSON to a temp dir")
    p.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/recovery.json)")
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes = args.sizes or [1, 2]
        args.updates = args.updates or 60_000
        args.updates_per_key = 0.0
        args.interval = min(args.interval, 0.1)
    args.sizes = args.sizes or [1, 64, 256]
    args.updates = args.updates or 400_000  # >= 4 s of updates: a 1 MB state still sees periodic epochs
    args.repetitions = args.repetitions or (1 if args.smoke else 2)
    if not 0 < args.crash_at < 1:
        p.error("--crash-at must be between 0 and 1")
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "recovery.json" if args.smoke
                    else harness.RESULTS / "recovery.json")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    info = harness.machine()
    print(f"epochal recovery benchmark: runtime={args.runtime} sizes={args.sizes} MB backends={args.backends} "
          f"updates={args.updates} crash-at={args.crash_at} repetitions={args.repetitions} "
          f"cores={info['cpu_count']} load={info['loadavg_at_start']}", flush=True)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(8)
    doc = {**harness.new_doc("recovery", args, info), "runs": []}
    t_start = time.monotonic()
    try:
        # warm-up (discarded): on Spark the first job starts the Python workers (seconds)
        warm = run_once(1, args.backends[0], None, argparse.Namespace(**{**vars(args), "updates": 10_000,
                                                                         "updates_per_key": 0.0}), spark)
        doc["warmup"] = {k: warm.get(k) for k in ("duration_s", "error")}
        for size in args.sizes:
            keys = max(1, size * (1 << 20) // args.value_bytes)
            updates = updates_for(keys, args)
            probe = state.make_flow("probe", "/unused", keys, updates, args.value_bytes, args.parallelism)
            mine = records_of_subtask(keys, updates, 0, args.parallelism, probe.plan().max_parallelism)
            crash_record = max(1, int(args.crash_at * mine))
            after: dict[str, int | None] = {}
            for rep in range(args.repetitions):
                for backend in args.backends:
                    done = {}
                    # the first golden run decides the crash's epoch; later repetitions alternate the order
                    for kind in ("golden", "crash") if rep % 2 == 0 else ("crash", "golden"):
                        if kind == "crash" and after.get(backend) is None:
                            done["crash"] = {"size_mb": size, "backend": backend, "kind": "crash",
                                             "error": "the golden run has no full-state checkpoint followed by two "
                                                      "more periodic ones: raise --updates-per-key"}
                        else:
                            r = run_once(size, backend, None if kind == "golden" else (crash_record, after[backend]),
                                         args, spark)
                            done[kind] = r
                            if kind == "golden" and backend not in after and "error" not in r:
                                after[backend] = full_state_epoch(r)
                        done[kind]["repetition"] = rep
                        doc["runs"].append(done[kind])
                    _compare(done)
                    _print(done, t_start)
    finally:
        for r in doc["runs"]:
            r.pop("output", None)
        harness.finish(doc, info)
        doc["summary"] = aggregate(doc["runs"])
        doc["errors"] = [f"{r['size_mb']} MB {r['backend']} {r['kind']} rep {r['repetition']}: {r['error']}"
                         for r in doc["runs"] if "error" in r]
        harness.write_json(args.out, doc)
        if spark is not None:
            spark.stop()
    print()
    print(render(doc["summary"]))
    return harness.plot_and_exit_code("recovery", doc, Path(args.out).with_suffix(".png"), args.out)


def _compare(done: dict) -> None:
    """The crash run's committed output must equal the golden run's, as a multiset."""
    golden, crash = done.get("golden"), done.get("crash")
    if not golden or not crash or "output" not in golden or "output" not in crash:
        return
    crash["output_equal"] = golden["output"] == crash["output"]
    if not crash["output_equal"]:
        lost = sum((golden["output"] - crash["output"]).values())
        extra = sum((crash["output"] - golden["output"]).values())
        crash.setdefault("error", f"output differs from the golden run: {lost} records missing, {extra} extra")


def _print(done: dict, t_start: float) -> None:
    for kind in ("golden", "crash"):
        r = done.get(kind)
        if r is None:
            continue
        head = f"[{time.monotonic() - t_start:5.0f} s] {r['size_mb']:>4} MB {r['backend']:<12} {kind:<6} "
        if "error" in r:
            print(head + f"ERROR {r['error']}", flush=True)
        elif kind == "golden":
            print(head + f"{r['duration_s']:6.1f} s  cold start {r['startup_s']:.2f} s  "
                  f"{r['output_records']} output records  checkpoint MB "
                  + " ".join(f"{e['state_mb']:.0f}" for e in r["epochs"]), flush=True)
        else:
            print(head + f"{r['duration_s']:6.1f} s  crash {r['crash']} at {r['failed_at_s']:.1f} s  restored epoch "
                  f"{r['restored_epoch']} ({r['restored_mb']:.1f} MB)  recovery {r['recovery_s']:.2f} s  "
                  + " ".join(f"{k[:-2]}={v:.2f}" for k, v in r["parts_s"].items())
                  + f"  output equal: {r.get('output_equal')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
