"""The columnar interval join's operator alone: CPU seconds to probe and buffer a stream of
batch pairs, this code against an earlier commit's, rounds interleaved.

    python benchmarks/join_probe.py                       # 512 pairs of 1,400 rows, 4 rounds
    python benchmarks/join_probe.py --pairs 256 --rounds 3 --old-commit <sha>
    python benchmarks/join_probe.py --smoke               # 16 pairs of 200 rows, 1 round; JSON to --out

The shape of Nexmark q3 with a longer life: persons (``id``, ``name``, ``city``, ``state``,
``t``) and auctions (``id``, ``seller``, ``t``), each auction's seller a person among the
5,000 newest, joined ``auction.t - 1 day <= person.t <= auction.t`` — so the persons' buffer
only grows (to ``pairs × rows`` rows) and every auction batch finds its partners in the
newest chunks of it. Each round runs the old code and the new in fresh processes (the old
``epochal/columnar/joins.py`` from ``git show``, loaded beside the current package); CPU is
the process time of the feed loop only (no data generation), and both must emit the same
number of rows.

Writes ``benchmarks/results/join_probe.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import harness  # noqa: E402

DAY_US = 86_400 * 10**6
#: main before the per-chunk gather of join output rows (epochal/columnar/gather.py)
OLD_COMMIT = "d73c04f"


def _operator_class(commit: str | None):
    if commit is None:
        from epochal.columnar.joins import ColumnJoinOperator

        return ColumnJoinOperator
    from join_snapshots import old_operator_class

    return old_operator_class(commit)


def _data(pairs: int, rows: int) -> list:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    data, pid = [], 0
    for e in range(pairs):
        t = np.sort((e * 10**6 + rng.integers(0, 10**6, rows)).astype(np.int64))
        ids = np.arange(pid, pid + rows)
        pid += rows
        persons = pa.record_batch({"id": pa.array(ids), "name": pa.array([f"name-{i}" for i in ids]),
                                   "city": pa.array([f"city-{i % 97}" for i in ids]),
                                   "state": pa.array(rng.choice(["OR", "ID", "CA"], rows)), "t": pa.array(t)})
        sellers = np.maximum(0, pid - 1 - rng.integers(0, 5000, rows))
        auctions = pa.record_batch({"id": pa.array(np.arange(e * rows, (e + 1) * rows)),
                                    "seller": pa.array(sellers), "t": pa.array(t + 1)})
        data.append((auctions, persons))
    return data


def one_run(commit: str | None, pairs: int, rows: int) -> dict:
    """Feed the operator of ``commit`` (None: this checkout) in this process."""
    from epochal.backends.heap import HeapStateBackend
    from epochal.columnar.joins import ColumnJoinSpec
    from epochal.columnar.time import ColumnTime
    from epochal.operators.base import OperatorContext

    cls = _operator_class(commit)
    data = _data(pairs, rows)
    ctx = OperatorContext("j", "j[0]", 0, 1, 0, "bench", 128,
                          keyed_backend=HeapStateBackend(range(128), snapshot_mode="thread"), key_groups=range(128))
    spec = ColumnJoinSpec(("seller", "id"), (ColumnTime("t", "us"), ColumnTime("t", "us")), (False, False),
                          lower=-DAY_US, upper=0)
    op = cls(ctx, spec, 1)
    op.bind_input_channels([0, 1])
    op.restore(None)
    out = 0
    start = time.process_time()
    for e, (auctions, persons) in enumerate(data, start=1):
        for side, batch in ((1, persons), (0, auctions)):
            op.select_input(side)
            out += sum(b.num_rows for b in op.process_batch([batch]) if hasattr(b, "num_rows"))
        for channel in (0, 1):
            op.input_watermark(channel, e * 10**6 - 1, False)
        op.on_watermark(e * 10**6 - 1)
    return {"cpu_s": round(time.process_time() - start, 3), "output_rows": out,
            "buffer_rows": max(b.num_rows for b in op.buffers if b is not None)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=512)
    p.add_argument("--rows", type=int, default=1400)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--old-commit", default=OLD_COMMIT)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "join_probe.json")
    p.add_argument("--smoke", action="store_true", help="16 pairs of 200 rows, one round")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one run, JSON to stdout
    args = p.parse_args(argv)
    if args.smoke:
        args.pairs, args.rows, args.rounds = 16, 200, 1
    if args.one is not None:
        print(json.dumps(one_run(args.one or None, args.pairs, args.rows)))
        return 0
    info = harness.machine()
    doc = harness.new_doc("join_probe", args, info)
    doc.update({"rounds": [], "errors": []})
    for _ in range(args.rounds):
        row = {}
        for name, commit in (("old", args.old_commit), ("new", "")):
            got = subprocess.run([sys.executable, __file__, "--one", commit, "--pairs", str(args.pairs),
                                  "--rows", str(args.rows)], capture_output=True, text=True, check=True,
                                 env=dict(os.environ, PYTHONHASHSEED="0"))
            row[name] = json.loads(got.stdout.strip().splitlines()[-1])
        if row["old"]["output_rows"] != row["new"]["output_rows"]:
            raise AssertionError(f"output rows differ: {row}")
        row["new_over_old"] = round(row["new"]["cpu_s"] / row["old"]["cpu_s"], 3)
        doc["rounds"].append(row)
        print(f"old {row['old']['cpu_s']:.3f} s, new {row['new']['cpu_s']:.3f} s CPU "
              f"(new/old {row['new_over_old']:.2f}; {row['new']['output_rows']} rows out, buffer "
              f"{row['new']['buffer_rows']} rows)", flush=True)
    harness.finish(doc, info)
    harness.write_json(args.out, doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
