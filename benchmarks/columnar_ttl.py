"""Event-time TTL on the columnar aggregate and columnar windows: throughput and state.

The operators alone in this process (built by the real builders, heap backend; no job, no
transport), an unbounded key space: every batch of ``--batch`` rows has new keys (a key
lives for ``--key-span`` batches), event time advances ``--step`` s per batch, ttl 10 s
event time. Per variant (``ttl`` / ``none``), ``--repetitions`` runs with the variants
interleaved, median rows/s and the most keys stored at once (sampled every 10 batches):

* **aggregate** — ``key_by("k").aggregate(n=count(), s=sum("v"))``, a merge per batch
  (an epoch), the watermark at the batch's newest time;
* **window** — ``key_by("k").window(Tumbling(60 s)).aggregate(n=count(), s=sum("v"))``,
  a watermark after every batch (with the ttl a key's windows go 10 s after its last row;
  without, when the 60 s window ends).

    python benchmarks/columnar_ttl.py [--batches 120] [--batch 10000] [--repetitions 3]
                                      [--smoke] [--out PATH]

Writes ``benchmarks/results/columnar_ttl.json`` (``--smoke``: a few batches, a temporary file).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.columnar import count, sum as asum
from epochal.columnar.operators import KeyedAggregateOperator
from epochal.columnar.windows import ColumnWindowOperator
from epochal.operators.base import OperatorContext

RESULTS = Path(__file__).resolve().parent / "results" / "columnar_ttl.json"
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("ts", pa.float64())])
MAXP = 128
TTL_S, WINDOW_S = 10.0, 60.0


def spec(kind: str, ttl):
    flow = ep.Dataflow("columnar-ttl-bench")
    keyed = (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1, "ts": 0.0}]))
             .to_batches("b", SCHEMA).with_watermarks("wm", timestamp="ts").key_by("k"))
    if kind == "aggregate":
        keyed.aggregate("op", n=count(), s=asum("v"), ttl=ttl, local=False)
    else:
        keyed.window(ep.windows.Tumbling(WINDOW_S), ttl=ttl).aggregate("op", n=count(), s=asum("v"))
    return flow._nodes["op"].payload


def batches(n: int, rows: int, span: int, step: float) -> list:
    """Batch b: keys ``b // span`` × rows (each key lives ``span`` batches), times within
    the batch's ``step`` s."""
    out = []
    for b in range(n):
        base = (b // span) * rows
        keys = pa.array([f"u{base + i}" for i in range(rows)])
        ts = pa.array([b * step + i * step / rows for i in range(rows)], pa.float64())
        out.append(pa.record_batch([keys, pa.array([1] * rows, pa.int64()), ts], schema=SCHEMA))
    return out


def run(kind: str, variant: str, data: list, step: float) -> dict:
    backend = HeapStateBackend(range(MAXP), snapshot_mode="thread")
    ctx = OperatorContext("op", "op[0]", 0, 1, 0, "bench", MAXP, keyed_backend=backend, key_groups=range(MAXP))
    ttl = ep.StateTtl(TTL_S, time="event") if variant == "ttl" else None
    cls = KeyedAggregateOperator if kind == "aggregate" else ColumnWindowOperator
    op = cls(ctx, spec(kind, ttl))
    op.restore(None)
    seconds, stored = 0.0, 0
    for b, batch in enumerate(data):
        start = time.perf_counter()
        op.process_batch([batch])
        op.on_watermark(int((b + 1) * step * 1e6))
        op.prepare_snapshot_pre_barrier(b + 1)
        seconds += time.perf_counter() - start
        if b % 10 == 9 or b == len(data) - 1:  # the most keys held at once (outside the timing)
            stored = max(stored, stored_keys(kind, op))
    backend.close()
    rows = sum(b.num_rows for b in data)
    return {"kind": kind, "variant": variant, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
            "keys_stored": stored}


def stored_keys(kind: str, op) -> int:
    if kind == "aggregate":
        return sum(len(blk) for blk in op.state.blocks.values())
    return len({k for blk in op.blocks.values() for k in blk.keys.to_pylist()})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=120)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--key-span", type=int, default=3)
    p.add_argument("--step", type=float, default=1.0, help="event-time seconds per batch")
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.smoke:
        a.batches, a.batch, a.repetitions = 15, 500, 1
    out = a.out or (Path(tempfile.mkdtemp()) / "columnar_ttl.json" if a.smoke else RESULTS)
    data = batches(a.batches, a.batch, a.key_span, a.step)
    runs = []
    for rep in range(a.repetitions):
        for kind in ("aggregate", "window"):
            for variant in (("ttl", "none") if rep % 2 == 0 else ("none", "ttl")):
                r = run(kind, variant, data, a.step)
                r["repetition"] = rep
                runs.append(r)
                print(f"{kind:9} {variant:4} {r['rows_per_s']:>10,.0f} rows/s  {r['keys_stored']:>8} keys stored",
                      flush=True)
    summary = []
    for kind in ("aggregate", "window"):
        med = {v: statistics.median(r["rows_per_s"] for r in runs if (r["kind"], r["variant"]) == (kind, v))
               for v in ("ttl", "none")}
        keys = {v: max(r["keys_stored"] for r in runs if (r["kind"], r["variant"]) == (kind, v))
                for v in ("ttl", "none")}
        summary.append({"kind": kind, "median_rows_per_s": med, "ratio_ttl_to_none": med["ttl"] / med["none"],
                        "keys_stored": keys})
    doc = {"args": vars(a) | {"out": str(out)}, "loadavg_before_after": [os.getloadavg()], "runs": runs,
           "summary": summary, "errors": []}
    doc["loadavg_before_after"].append(os.getloadavg())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
