"""Keyed state at scale: snapshot cost of the state backends as the state grows — in one run.

A keyed job first *loads* ``size / value_bytes`` keys (one incompressible value each),
then *updates* a hot 1 % of them for ``--updates`` records. Per state size, these modes
run the very same dataflow (runtime="local" by default, ``--runtime spark`` optional):

==================  ====================================================  ==========
mode                backend                                               interval
==================  ====================================================  ==========
no-checkpoint       heap                                                  None
heap-blocking       BackendSpec("heap", {"snapshot_mode": "blocking"})    --interval
heap-thread         heap, copy-on-write, pickled on the uploader thread   --interval
heap-fork           heap, serialized by a forked child (the default)      --interval
rocksdb-full        rocksdb (portable full snapshot per epoch)            --interval
rocksdb-incr        rocksdb {"incremental": True, "full_every": 10}       --interval
==================  ====================================================  ==========

The default interval is 8 s, IBM's for its Fig. 7(b) (seed 000 §7.2: "fix the
consistent region period to 8 seconds"); ``--interval 1`` is the stress variant.

Reported per size and mode (medians over ``--repetitions`` interleaved runs):
**steady-state throughput** normalised to no-checkpoint of the same size and repetition —
records per second of the update phase, from progress records the keyed operator emits
every 10,000 inputs with a timestamp (so start-up and loading do not dilute it);
whole-run throughput; checkpoint duration (trigger → metadata); bytes uploaded per
checkpoint (``bytes``) and referenced (``state_bytes``); and the recovery time of the
keyed state: the time to restore every keyed task's backend from the job's last
checkpoint (read + verify + deserialize, or download + open for incremental), measured
in this process.

Usage::

    python benchmarks/state.py                     # 8, 64, 256 MB (~15 min, 2 cores)
    python benchmarks/state.py --large             # adds 512 MB (~25 min)
    python benchmarks/state.py --smoke --runtime local --out /tmp/s.json   # < 60 s
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.backends.choice import BackendSpec  # noqa: E402
from epochal.backends.storage import CheckpointStorage, StateHandle  # noqa: E402
from epochal.runtime.task.snapshots import decode_task_state  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

MODES = {
    "no-checkpoint": BackendSpec("heap"),
    "heap-blocking": BackendSpec("heap", {"snapshot_mode": "blocking"}),
    "heap-thread": BackendSpec("heap", {"snapshot_mode": "thread"}),
    "heap-fork": BackendSpec("heap", {"snapshot_mode": "fork"}),
    "rocksdb-full": BackendSpec("rocksdb"),
    "rocksdb-incr": BackendSpec("rocksdb", {"incremental": True, "full_every": 10}),
}
COLOURS = {"no-checkpoint": "black", "heap-blocking": "tab:red", "heap-thread": "tab:orange",
           "heap-fork": "tab:green", "rocksdb-full": "tab:purple", "rocksdb-incr": "tab:blue"}


class Store(ep.KeyedProcessFunction):
    """Keeps the newest value per key; every ``progress_every`` inputs emits ``(subtask,
    inputs seen, wall-clock time)`` — the progress the steady-state throughput is computed
    from."""

    def __init__(self, value_bytes: int, progress_every: int):
        self.value_bytes = value_bytes
        self.progress_every = progress_every

    def open(self, ctx):
        self.v = ctx.value_state("v")
        self.subtask = ctx.subtask
        self.seen = 0

    def process(self, key, value):
        self.v.update(random.Random(value).randbytes(self.value_bytes))  # incompressible
        self.seen += 1
        if self.seen % self.progress_every == 0:
            yield (self.subtask, self.seen, time.time())


def steady_rate(out_dir: str, loaded: int) -> float | None:
    """Records/s of the update phase: from the progress records in the sink's output, the
    total inputs processed over time N(t) = sum of the subtasks' latest ``seen``; the rate
    between the first time N >= ``loaded`` and the last progress record. ``None`` if too
    few progress records."""
    points = []
    for path in glob.glob(os.path.join(out_dir, "**", "*.jsonl"), recursive=True):
        with open(path) as f:
            points.extend(tuple(json.loads(line)) for line in f if line.strip())
    points.sort(key=lambda p: p[2])
    latest: dict[int, int] = {}
    start = None
    for subtask, seen, t in points:
        latest[subtask] = max(seen, latest.get(subtask, 0))
        total = sum(latest.values())
        if start is None and total >= loaded:
            start = (total, t)
    if start is None or points[-1][2] - start[1] <= 0:
        return None
    return (sum(latest.values()) - start[0]) / (points[-1][2] - start[1])


def key_of_record(i: int, keys: int) -> int:
    """Record ``i``'s key: ``i`` itself while loading (``i < keys``), then one of a hot 1 %
    of the keys (every 100th key), spread out."""
    return i if i < keys else (i * 2654435761) % keys % max(1, keys // 100) * 100


def make_flow(name: str, out: str, keys: int, updates: int, value_bytes: int, parallelism: int,
              function: ep.KeyedProcessFunction | None = None, progress_every: int = 10_000) -> ep.Dataflow:
    """numbers → key_by(key_of_record) → ``function`` (default :class:`Store`) → jsonl sink:
    ``keys`` records load one value per key, then ``updates`` records update hot keys."""
    def gen(_split: int, offset: int):
        i = offset
        while True:
            yield i
            i += 1

    flow = ep.Dataflow(name, parallelism=parallelism)
    src = ep.sources.GeneratorSource(gen, num_splits=1, limit=keys + updates, records_per_second=None)
    (flow.source("numbers", src, parallelism=1).key_by(lambda i: key_of_record(i, keys))
         .process("store", function or Store(value_bytes, progress_every))
         .sink("out", FileSink(out, format="jsonl"), parallelism=1))
    return flow


def recovery_seconds(url: str, job: str, spec: BackendSpec) -> float | None:
    """Restore every keyed task's backend from the job's newest checkpoint; total seconds."""
    storage = CheckpointStorage(url, job)
    latest = storage.latest_completed()
    if latest is None:
        return None
    _epoch, meta = latest
    total = 0.0
    for tid, info in meta["tasks"].items():
        if "store" not in info["chain"]:
            continue
        t0 = time.perf_counter()
        state = decode_task_state(storage.read_state(StateHandle(**info["handle"])), tid)
        from epochal.backends.keygroups import key_group_range

        backend = spec.create(key_group_range(info["subtask"], info["parallelism"], meta["max_parallelism"]))
        backend.restore_from([state["keyed"]], storage)
        total += time.perf_counter() - t0
        backend.close()
    return total


def run_once(mode: str, size_mb: int, rep: int, args, spark) -> dict:
    keys = max(1, size_mb * (1 << 20) // args.value_bytes)
    work = tempfile.mkdtemp(prefix=f"epochal-state-{mode}-", dir=args.tmp)
    url = "file://" + os.path.join(work, "ckpt")
    job = f"state-{mode}-{size_mb}"
    out = os.path.join(work, "out")
    flow = make_flow(job, out, keys, args.updates, args.value_bytes, args.parallelism,
                     progress_every=1_000 if args.smoke else 10_000)
    interval = None if mode == "no-checkpoint" else args.interval
    record = {"mode": mode, "size_mb": size_mb, "repetition": rep, "keys": keys, "records": keys + args.updates,
              "loadavg_before": os.getloadavg()[0]}
    try:
        t0 = time.perf_counter()
        result = flow.run(runtime=args.runtime, spark=spark, backend=MODES[mode],
                          checkpoint=ep.CheckpointConfig(interval=interval, storage=url, timeout=600))
        wall = time.perf_counter() - t0
        epochs = [e for e in result.completed_epochs]
        record.update(
            wall_s=wall, records_per_s=record["records"] / wall, steady_records_per_s=steady_rate(out, keys),
            checkpoints=len(epochs), duration_s=[e["duration_s"] for e in epochs],
            sync_s=[e.get("max_sync_s") for e in epochs],
            bytes=[e["bytes"] for e in epochs], state_bytes=[e.get("state_bytes", e["bytes"]) for e in epochs],
        )
        if interval is not None:
            record["recovery_s"] = recovery_seconds(url, job, MODES[mode])
    except Exception as exc:  # keep going: one failed mode must not hide the others
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return record


def _ratio(r: dict, runs: list[dict], key: str) -> float | None:
    """``r[key]`` over the same repetition's no-checkpoint run of the same size."""
    base = next((b for b in runs if b["size_mb"] == r["size_mb"] and b["mode"] == "no-checkpoint"
                 and b["repetition"] == r["repetition"] and "error" not in b), None)
    if base is None or not r.get(key) or not base.get(key):
        return None
    return r[key] / base[key]


def summarise(runs: list[dict]) -> dict:
    """Per size and mode: medians over repetitions; percentiles over all periodic epochs
    (the first, taken while loading, and the final one are left out when others exist)."""
    out: dict = {}
    groups: dict[tuple[int, str], list[dict]] = {}
    for r in runs:
        if "error" not in r:
            groups.setdefault((r["size_mb"], r["mode"]), []).append(r)
    for (size, mode), rs in sorted(groups.items()):
        periodic = []
        for r in rs:
            rows = list(zip(r["bytes"], r["state_bytes"], r["duration_s"], r["sync_s"]))
            periodic.extend(rows[1:-1] or rows)
        durations = [d for _b, _s, d, _y in periodic]
        out.setdefault(str(size), {})[mode] = {
            "repetitions": len(rs),
            "steady_records_per_s": harness.median([r["steady_records_per_s"] for r in rs
                                                    if r["steady_records_per_s"]]),
            "records_per_s": harness.median([r["records_per_s"] for r in rs]),
            "ratio_to_baseline": harness.median([x for r in rs if (x := _ratio(r, runs, "steady_records_per_s"))]),
            "ratios": [_ratio(r, runs, "steady_records_per_s") for r in rs],
            "whole_run_ratio": harness.median([x for r in rs if (x := _ratio(r, runs, "records_per_s"))]),
            "checkpoints": harness.median([r["checkpoints"] for r in rs]),
            "checkpoint_duration_s": dict(harness.summary(durations), p99=harness.percentile(durations, 99)),
            "sync_s": harness.summary([y for *_x, y in periodic if y is not None]),
            "uploaded_bytes_per_checkpoint": harness.summary([b for b, _s, _d, _y in periodic]),
            "state_bytes_per_checkpoint": harness.summary([s for _b, s, _d, _y in periodic]),
            "recovery_s": harness.median([r["recovery_s"] for r in rs if r.get("recovery_s") is not None]),
        }
    return out


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(s) for s in doc["summary"])
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for mode in MODES:
        rows = [doc["summary"][str(s)].get(mode) for s in sizes]
        xs = [s for s, r in zip(sizes, rows) if r]
        rows = [r for r in rows if r]
        if not rows:
            continue
        style = {"marker": "o", "label": mode, "color": COLOURS[mode]}
        axes[0].plot(xs, [r["ratio_to_baseline"] for r in rows], **style)
        if mode == "no-checkpoint":
            continue
        axes[1].plot(xs, [r["checkpoint_duration_s"]["median"] for r in rows], **style)
        axes[2].plot(xs, [(r["uploaded_bytes_per_checkpoint"]["median"] or 0) / 2**20 for r in rows], **style)
        axes[3].plot(xs, [r["recovery_s"] for r in rows], **style)
    interval = doc["config"]["interval"]
    titles = (f"steady throughput / no-checkpoint ({interval:g} s interval)", "checkpoint duration (median, s)",
              "uploaded per checkpoint (median, MB)", "keyed-state recovery (s)")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("state size (MB)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.95, color="grey", linestyle=":", linewidth=1)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="state sizes in MB (default 8 64 256)")
    p.add_argument("--large", action="store_true", help="add 512 MB")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                   help="modes to run (no-checkpoint is always added: it is the baseline)")
    p.add_argument("--updates", type=int, default=None, help="hot-key updates after loading")
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--interval", type=float, default=8.0, help="checkpoint interval (s); IBM Fig. 7(b) used 8")
    p.add_argument("--repetitions", type=int, default=1, help="interleaved repetitions of every cell")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--runtime", choices=("local", "spark"), default="local")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, < 60 s")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = [1, 2] if args.smoke else [8, 64, 256] + ([512] if args.large else [])
    if "no-checkpoint" not in args.modes:
        args.modes.insert(0, "no-checkpoint")
    if args.updates is None:
        args.updates = 30_000 if args.smoke else 2_000_000
    if args.smoke:
        args.interval = min(args.interval, 0.3)
    if args.out is None:
        args.out = harness.RESULTS / "state.json"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.launch.spark import _local_session

        spark = _local_session(8)
    started = time.perf_counter()
    runs = []
    for rep in range(args.repetitions):
        for size in args.sizes:
            modes = args.modes if rep % 2 == 0 else list(reversed(args.modes))  # interleave the order
            for mode in modes:
                r = run_once(mode, size, rep, args, spark)
                runs.append(r)
                print(f"rep {rep + 1} {size:>5} MB {mode:<14} " + (r.get("error") or
                      f"steady {harness.fmt(r['steady_records_per_s'])} rec/s, whole run "
                      f"{r['records_per_s']:>9,.0f} rec/s  {r['checkpoints']:>3} checkpoints  "
                      f"median upload {harness.fmt(harness.median(r['bytes'][1:-1] or r['bytes']))} B  "
                      f"recovery {harness.fmt(r.get('recovery_s'), '.2f')} s"), flush=True)
    doc = {
        "benchmark": "state", "command": [sys.executable, *sys.argv], "created": harness.now_iso(),
        "machine": harness.machine(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "modes": {m: {"kind": s.kind, "options": s.options} for m, s in MODES.items() if m in args.modes},
        "runs": runs, "summary": summarise(runs), "errors": [r for r in runs if "error" in r],
        "total_s": time.perf_counter() - started,
    }
    path = harness.write_json(args.out, doc)
    png = Path(args.out).with_suffix(".png")
    try:
        plot(doc, png)
    except ImportError:
        print("matplotlib missing: pip install 'epochal[bench]' for the plot")
    rows = []
    for size, modes in doc["summary"].items():
        for mode, s in modes.items():
            rows.append([size, mode, harness.fmt(s["ratio_to_baseline"], ".2f"), harness.fmt(s["whole_run_ratio"], ".2f"),
                         harness.fmt(s["checkpoint_duration_s"]["median"], ".2f"),
                         harness.fmt(s["sync_s"]["median"], ".3f"),
                         harness.fmt(s["uploaded_bytes_per_checkpoint"]["median"]),
                         harness.fmt(s["state_bytes_per_checkpoint"]["median"]),
                         harness.fmt(s["recovery_s"], ".2f")])
    print(harness.table(["MB", "mode", "steady ratio", "run ratio", "ckpt s", "sync s", "uploaded B", "state B",
                         "recovery s"], rows))
    print(f"wrote {path} and {png} in {doc['total_s']:.0f} s")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
