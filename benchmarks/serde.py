"""What records of classes from the user's ``__main__`` cost on the wire (``epochal.serde``).

Encodes and decodes batches of 512 records, the channel batch size, four ways, in one
process, interleaved over repetitions (median per-record ns):

* ``tuple / pickle`` — ``(id, str)`` tuples through plain pickle: the fast path's floor;
* ``tuple / serde`` — the same through ``serde.dumps`` (plain pickle first: should be equal);
* ``importable dataclass / serde`` — a dataclass of an importable module (pickled by reference);
* ``__main__ dataclass / serde`` — a class shipped by value, as a task process sees a class
  of the user's script: plain pickle fails, cloudpickle takes the batch.

    python benchmarks/serde.py [--repetitions 7] [--batches 200]
"""
from __future__ import annotations

import argparse
import dataclasses
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloudpickle  # noqa: E402
import harness  # noqa: E402

from epochal import serde  # noqa: E402


@dataclasses.dataclass
class Importable:
    id: int
    text: str


def shipped_class():
    """A dataclass as a task sees one from the driver's ``__main__``: reconstructed by
    cloudpickle by value, not importable by name."""
    ns: dict = {}
    exec("import dataclasses\n@dataclasses.dataclass\nclass Word:\n    id: int\n    text: str\n",
         {"__name__": "__main__"}, ns)
    return pickle.loads(cloudpickle.dumps(ns["Word"]))


def measure(batch, dumps, batches: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    frames = [dumps(batch) for _ in range(batches)]
    t1 = time.perf_counter()
    for f in frames:
        pickle.loads(f)
    t2 = time.perf_counter()
    n = batches * len(batch)
    return (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repetitions", type=int, default=7)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--out", type=Path, default=harness.RESULTS / "serde.json")
    args = p.parse_args(argv)
    Word = shipped_class()
    variants = {
        "tuple / pickle": ([(i, f"word{i}") for i in range(512)], lambda b: pickle.dumps(b, 5)),
        "tuple / serde": ([(i, f"word{i}") for i in range(512)], serde.dumps),
        "importable dataclass / serde": ([Importable(i, f"word{i}") for i in range(512)], serde.dumps),
        "__main__ dataclass / serde": ([Word(i, f"word{i}") for i in range(512)], serde.dumps),
    }
    raw = {v: [] for v in variants}
    for rep in range(args.repetitions):
        for v in harness.rotated(list(variants), rep):
            raw[v].append(measure(*variants[v], args.batches))
    summary = {v: {"encode_ns_per_record": statistics.median(r[0] for r in rs),
                   "decode_ns_per_record": statistics.median(r[1] for r in rs),
                   "bytes_per_record": len(variants[v][1](variants[v][0])) / 512} for v, rs in raw.items()}
    for v, s in summary.items():
        print(f"{v:32s} encode {s['encode_ns_per_record']:7.0f} ns  decode {s['decode_ns_per_record']:7.0f} ns  "
              f"{s['bytes_per_record']:6.1f} B/record")
    info = harness.machine()
    doc = harness.new_doc("serde", args, info)
    doc.update(summary=summary, raw=raw, batch_records=512)
    harness.finish(doc, info)
    harness.write_json(args.out, doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
