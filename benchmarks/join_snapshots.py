"""Per-checkpoint snapshot cost of a columnar interval join whose state only grows (issue 31):
the code before issue 31 (whole key groups re-encoded as ``"<op>/rows"``, loaded from git)
against the incremental segments (:mod:`epochal.columnar.segments`).

The operator alone in this process (no job, no transport), ``--maxp`` key groups, one inner
interval join ``persons.key_by("id").interval_join(auctions.key_by("seller"), -1 day, +1 day)``
shaped as Nexmark q3's state: every epoch ``--rows`` rows per side (random keys among
``--keys``, event time advancing 1 s per epoch, so nothing expires), then a watermark and a
checkpoint. Per checkpoint it records:

* ``prepare_ms`` — CPU (thread time) of ``prepare_snapshot_pre_barrier`` on the task thread
  (old: split/sort/take/IPC of every dirty key group; new: the epoch's rows only);
* ``put_bytes`` — bytes of the values handed to the backend (``put``);
* heap: ``snapshot_bytes`` / ``snapshot_ms`` — the heap backend's snapshot (it pickles every
  entry each checkpoint: O(state) bytes either way, but bytes objects pickle as copies);
* rocksdb (incremental): ``uploaded_bytes`` / ``state_bytes`` of the incremental snapshot
  (new SST files only) and ``snapshot_ms`` (flush + upload, wall).

    python benchmarks/join_snapshots.py [--epochs 100] [--rows 10000] [--keys 200000]
                                        [--backends heap,rocksdb] [--smoke] [--out PATH]

Writes ``benchmarks/results/join_snapshots.json`` (``--smoke``: 4 epochs, a temporary file).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.backends.storage import CheckpointStorage
from epochal.columnar.joins import ColumnJoinOperator, ColumnJoinSpec
from epochal.columnar.time import ColumnTime
from epochal.operators.base import OperatorContext

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "join_snapshots.json"
OLD_COMMIT = "88eb607e747ae19ab96fd66ac939c3dd179ecd1b"  # main before issue 31
DAY_US = 86_400 * 10**6


def old_operator_class(commit: str = OLD_COMMIT):
    """``ColumnJoinOperator`` as ``epochal/columnar/joins.py`` of ``commit`` has it (loaded from
    git beside the current package, whose other modules it imports)."""
    source = subprocess.run(["git", "show", f"{commit}:epochal/columnar/joins.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_column_joins.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_column_joins", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_column_joins"] = module
    spec.loader.exec_module(module)
    return module.ColumnJoinOperator


def batches(epochs: int, rows: int, keys: int) -> list:
    rng = np.random.default_rng(31)
    out = []
    for e in range(epochs):
        t = (e * 10**6 + rng.integers(0, 10**6, rows)).astype(np.int64)
        persons = pa.record_batch({"id": pa.array(rng.integers(0, keys, rows)), "t": pa.array(t),
                                   "name": pa.array([f"person-{i}" for i in rng.integers(0, 10**6, rows)]),
                                   "state": pa.array(rng.choice(["OR", "ID", "CA", "WA"], rows))})
        auctions = pa.record_batch({"seller": pa.array(rng.integers(0, keys, rows)), "t": pa.array(t),
                                    "auction": pa.array(np.arange(e * rows, (e + 1) * rows)),
                                    "category": pa.array(rng.integers(0, 20, rows))})
        out.append((persons, auctions))
    return out


def backend_of(kind: str, maxp: int):
    base = HeapStateBackend if kind == "heap" else RocksDBStateBackend

    class Counting(base):  # type: ignore[misc, valid-type]
        put_bytes = 0

        def put(self, state, kg, key, value):
            parts = value if isinstance(value, tuple) else (value,)
            self.put_bytes += sum(len(p) for p in parts if isinstance(p, bytes))
            super().put(state, kg, key, value)

    if kind == "heap":
        return Counting(range(maxp), snapshot_mode="thread")
    return Counting(range(maxp), incremental=True)


def run(code: str, kind: str, data: list, maxp: int, work: str) -> dict:
    cls = old_operator_class() if code == "old" else ColumnJoinOperator
    backend = backend_of(kind, maxp)
    storage = CheckpointStorage("file://" + os.path.join(work, f"{code}-{kind}"), "job")
    ctx = OperatorContext("j", "j[0]", 0, 1, 0, "bench", maxp, keyed_backend=backend, key_groups=range(maxp))
    spec = ColumnJoinSpec(("id", "seller"), (ColumnTime("t", "us"), ColumnTime("t", "us")), (False, False),
                          lower=-DAY_US, upper=DAY_US)
    op = cls(ctx, spec, 1)
    op.bind_input_channels([0, 1])
    op.restore(None)
    epochs = []
    for e, (persons, auctions) in enumerate(data, start=1):
        op.select_input(0)
        op.process_batch([persons])
        op.select_input(1)
        op.process_batch([auctions])
        for channel in (0, 1):
            op.input_watermark(channel, e * 10**6, False)
        op.on_watermark(e * 10**6)
        before_bytes = backend.put_bytes
        start = time.thread_time()
        op.prepare_snapshot_pre_barrier(e)
        prepare = time.thread_time() - start
        row = {"epoch": e, "buffer_rows": sum(b.num_rows for b in op.buffers if b is not None),
               "prepare_ms": round(prepare * 1e3, 2), "put_bytes": backend.put_bytes - before_bytes}
        start = time.perf_counter()
        job = backend.snapshot(e)
        if kind == "heap":
            row["snapshot_bytes"] = len(job.run())
        else:
            desc = job.run(storage, "j-0")
            row["uploaded_bytes"], row["state_bytes"] = desc["uploaded_bytes"], desc["state_bytes"]
        row["snapshot_ms"] = round((time.perf_counter() - start) * 1e3, 1)
        epochs.append(row)
    backend.close()
    last = epochs[-10:]
    summary = {"prepare_ms_total": round(sum(r["prepare_ms"] for r in epochs), 1),
               "prepare_ms_last10_mean": round(sum(r["prepare_ms"] for r in last) / len(last), 2),
               "put_bytes_total": sum(r["put_bytes"] for r in epochs),
               "put_bytes_last10_mean": sum(r["put_bytes"] for r in last) // len(last),
               "snapshot_ms_last10_mean": round(sum(r["snapshot_ms"] for r in last) / len(last), 1)}
    if kind == "rocksdb":
        summary["uploaded_bytes_total"] = sum(r["uploaded_bytes"] for r in epochs)
        summary["uploaded_bytes_last10_mean"] = sum(r["uploaded_bytes"] for r in last) // len(last)
    else:
        summary["snapshot_bytes_last"] = epochs[-1]["snapshot_bytes"]
    return {"code": code, "backend": kind, "summary": summary, "epochs": epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--rows", type=int, default=10_000, help="rows per side per epoch")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--maxp", type=int, default=128, help="key groups (max parallelism)")
    parser.add_argument("--backends", default="heap,rocksdb")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.epochs, args.rows, args.keys = 4, 500, 1000
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp()) / "join_snapshots.json" if args.smoke
                                           else RESULTS)
    data = batches(args.epochs, args.rows, args.keys)
    runs, errors = [], []
    with tempfile.TemporaryDirectory() as work:
        for kind in args.backends.split(","):
            for code in ("old", "new"):
                try:
                    runs.append(run(code, kind, data, args.maxp, work))
                    print(code, kind, runs[-1]["summary"], flush=True)
                except Exception as exc:  # recorded, the other runs go on
                    errors.append(f"{code}/{kind}: {exc!r}")
    doc = {"benchmark": "join_snapshots", "config": vars(args), "load_average_end": os.getloadavg(),
           "old_commit": OLD_COMMIT, "runs": runs, "errors": errors}
    out.write_text(json.dumps(doc, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
