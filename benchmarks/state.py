"""Keyed state at scale: snapshot cost of the state backends as the state grows — in one run.

A keyed job first *loads* ``size / value_bytes`` keys (one incompressible value each),
then *updates* a hot 1 % of them for ``--updates`` records. Per state size, five modes run
the very same dataflow (runtime="local" by default, ``--runtime spark`` optional):

==================  ==============================================  ==========
mode                backend                                         interval
==================  ==============================================  ==========
no-checkpoint       heap                                            None
heap-blocking       BackendSpec("heap", {"blocking_snapshots": 1})  --interval
heap-cow            heap (copy-on-write, async serialization)       --interval
rocksdb-full        rocksdb (portable full snapshot per epoch)      --interval
rocksdb-incr        rocksdb {"incremental": True, "full_every": 10} --interval
==================  ==============================================  ==========

Reported per size and mode: throughput normalised to no-checkpoint of the same size,
checkpoint duration (trigger → metadata), bytes uploaded per checkpoint (``bytes``) and
bytes referenced (``state_bytes``), and the recovery time of the keyed state: the time to
restore every keyed task's backend from the job's last checkpoint (read + verify +
deserialize, or download + open for incremental), measured in this process.

Usage::

    python benchmarks/state.py                     # 8, 64, 256 MB (~10-15 min, 2 cores)
    python benchmarks/state.py --large             # adds 512 MB
    python benchmarks/state.py --smoke --runtime local --out /tmp/s.json   # < 60 s
"""
from __future__ import annotations

import argparse
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
from epochal.runtime.snapshots import decode_task_state  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

MODES = {
    "no-checkpoint": BackendSpec("heap"),
    "heap-blocking": BackendSpec("heap", {"blocking_snapshots": True}),
    "heap-cow": BackendSpec("heap"),
    "rocksdb-full": BackendSpec("rocksdb"),
    "rocksdb-incr": BackendSpec("rocksdb", {"incremental": True, "full_every": 10}),
}


class Store(ep.KeyedProcessFunction):
    """Keeps the newest value per key; emits one small record per 10,000 inputs."""

    def __init__(self, value_bytes: int):
        self.value_bytes = value_bytes

    def open(self, ctx):
        self.v = ctx.value_state("v")
        self.seen = 0

    def process(self, key, value):
        self.v.update(random.Random(value).randbytes(self.value_bytes))  # incompressible
        self.seen += 1
        if self.seen % 10_000 == 0:
            yield (key, self.seen)


def key_of_record(i: int, keys: int) -> int:
    """Record ``i``'s key: ``i`` itself while loading (``i < keys``), then one of a hot 1 %
    of the keys (every 100th key), spread out."""
    return i if i < keys else (i * 2654435761) % keys % max(1, keys // 100) * 100


def make_flow(name: str, out: str, keys: int, updates: int, value_bytes: int, parallelism: int,
              function: ep.KeyedProcessFunction | None = None) -> ep.Dataflow:
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
         .process("store", function or Store(value_bytes)).sink("out", FileSink(out, format="jsonl"), parallelism=1))
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


def run_once(mode: str, size_mb: int, args, spark) -> dict:
    keys = max(1, size_mb * (1 << 20) // args.value_bytes)
    work = tempfile.mkdtemp(prefix=f"epochal-state-{mode}-", dir=args.tmp)
    url = "file://" + os.path.join(work, "ckpt")
    job = f"state-{mode}-{size_mb}"
    flow = make_flow(job, os.path.join(work, "out"), keys, args.updates, args.value_bytes, args.parallelism)
    interval = None if mode == "no-checkpoint" else args.interval
    record = {"mode": mode, "size_mb": size_mb, "keys": keys, "records": keys + args.updates}
    try:
        t0 = time.perf_counter()
        result = flow.run(runtime=args.runtime, spark=spark, backend=MODES[mode],
                          checkpoint=ep.CheckpointConfig(interval=interval, storage=url, timeout=600))
        wall = time.perf_counter() - t0
        epochs = [e for e in result.completed_epochs]
        record.update(
            wall_s=wall, records_per_s=record["records"] / wall, checkpoints=len(epochs),
            duration_s=[e["duration_s"] for e in epochs],
            bytes=[e["bytes"] for e in epochs], state_bytes=[e.get("state_bytes", e["bytes"]) for e in epochs],
        )
        if interval is not None:
            record["recovery_s"] = recovery_seconds(url, job, MODES[mode])
    except Exception as exc:  # keep going: one failed mode must not hide the others
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return record


def summarise(runs: list[dict]) -> dict:
    out: dict = {}
    for r in runs:
        if "error" in r:
            continue
        base = next((b for b in runs if b["size_mb"] == r["size_mb"] and b["mode"] == "no-checkpoint"
                     and "error" not in b), None)
        periodic = list(zip(r["bytes"], r["state_bytes"], r["duration_s"]))[1:-1] or \
            list(zip(r["bytes"], r["state_bytes"], r["duration_s"]))
        out.setdefault(str(r["size_mb"]), {})[r["mode"]] = {
            "records_per_s": r["records_per_s"],
            "ratio_to_baseline": r["records_per_s"] / base["records_per_s"] if base else None,
            "checkpoints": r["checkpoints"],
            "checkpoint_duration_s": harness.summary([d for _b, _s, d in periodic]),
            "uploaded_bytes_per_checkpoint": harness.summary([b for b, _s, _d in periodic]),
            "state_bytes_per_checkpoint": harness.summary([s for _b, s, _d in periodic]),
            "recovery_s": r.get("recovery_s"),
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
        axes[0].plot(xs, [r["ratio_to_baseline"] for r in rows], marker="o", label=mode)
        if mode == "no-checkpoint":
            continue
        axes[1].plot(xs, [r["checkpoint_duration_s"]["median"] for r in rows], marker="o", label=mode)
        axes[2].plot(xs, [(r["uploaded_bytes_per_checkpoint"]["median"] or 0) / 2**20 for r in rows],
                     marker="o", label=mode)
        axes[3].plot(xs, [r["recovery_s"] for r in rows], marker="o", label=mode)
    titles = ("throughput / no-checkpoint", "checkpoint duration (median, s)",
              "uploaded per checkpoint (median, MB)", "keyed-state recovery (s)")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("state size (MB)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("symlog")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="state sizes in MB (default 8 64 256)")
    p.add_argument("--large", action="store_true", help="add 512 MB")
    p.add_argument("--updates", type=int, default=None, help="hot-key updates after loading")
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--runtime", choices=("local", "spark"), default="local")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, < 60 s")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tmp", default=None)
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = [1, 2] if args.smoke else [8, 64, 256] + ([512] if args.large else [])
    if args.updates is None:
        args.updates = 5_000 if args.smoke else 200_000
    if args.smoke:
        args.interval = min(args.interval, 0.3)
    if args.out is None:
        args.out = harness.RESULTS / "state.json"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spark = None
    if args.runtime == "spark":
        from epochal.runtime.spark import _local_session

        spark = _local_session(8)
    started = time.perf_counter()
    runs = []
    for size in args.sizes:
        for mode in MODES:
            r = run_once(mode, size, args, spark)
            runs.append(r)
            print(f"{size:>5} MB {mode:<14} " + (r.get("error") or
                  f"{r['records_per_s']:>9,.0f} rec/s  {r['checkpoints']:>3} checkpoints  "
                  f"median upload {harness.fmt(harness.median(r['bytes'][1:-1] or r['bytes']))} B  "
                  f"recovery {harness.fmt(r.get('recovery_s'), '.2f')} s"), flush=True)
    doc = {
        "benchmark": "state", "created": harness.now_iso(), "machine": harness.machine(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "modes": {m: {"kind": s.kind, "options": s.options} for m, s in MODES.items()},
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
            rows.append([size, mode, harness.fmt(s["ratio_to_baseline"], ".2f"),
                         harness.fmt(s["checkpoint_duration_s"]["median"], ".2f"),
                         harness.fmt(s["uploaded_bytes_per_checkpoint"]["median"]),
                         harness.fmt(s["state_bytes_per_checkpoint"]["median"]),
                         harness.fmt(s["recovery_s"], ".2f")])
    print(harness.table(["MB", "mode", "tput ratio", "ckpt s", "uploaded B", "state B", "recovery s"], rows))
    print(f"wrote {path} and {png} in {doc['total_s']:.0f} s")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
