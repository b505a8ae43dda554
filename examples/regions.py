"""Consistent regions and failover regions: parts of one job that checkpoint and restart on
their own.

One job, two consistent regions (seed 000): ``payments`` counts payments per account with
short epochs; ``audit`` copies events through a forward-only pipeline per source split with
rarer epochs. Inside ``audit`` no channel connects the two pipelines, so each is a failover
region of its own.

Two faults, after a completed checkpoint each: the ``count`` process of ``payments`` exits
(``payments`` restarts from its latest epoch; ``audit`` runs on, untouched), and pipeline 1 of
``audit`` exits (only that pipeline's task restarts). Both outputs are compared with plain
Python: every payment counted once, every event copied once.

    python examples/regions.py [--runtime spark|local] [--no-crash]

Contract: :func:`run` runs the job once in a fresh directory and returns the result and each
sink's committed rows.
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord

PER_SPLIT = 2000  # records per source split, read at 1000 records/s: two seconds per region
ACCOUNTS = ("acc-1", "acc-2", "acc-3", "acc-4", "acc-5")


def payment(split: int, i: int) -> dict:
    """Payment ``i`` of ``split``: a pure function of its position (so a source can replay it)."""
    return {"account": ACCOUNTS[(i * 3 + split) % len(ACCOUNTS)], "cents": (i * 37 + split) % 500, "id": f"p{split}-{i}"}


def event(split: int, i: int) -> str:
    return f"e{split}-{i}"


def payments(split: int, offset: int):
    return (payment(split, i) for i in range(offset, PER_SPLIT))


def events(split: int, offset: int):
    return (event(split, i) for i in range(offset, PER_SPLIT))


def generator(fn) -> ep.sources.GeneratorSource:
    return ep.sources.GeneratorSource(fn, num_splits=2, limit=PER_SPLIT, records_per_second=PER_SPLIT / 2)


# --8<-- [start:graph]
def build(work: str) -> ep.Dataflow:
    payments_region = ep.Region("payments", checkpoint=ep.CheckpointConfig(interval="100ms"))
    audit_region = ep.Region("audit", checkpoint=ep.CheckpointConfig(interval="300ms"),
                             restart=ep.RestartStrategy(max_attempts=5, failover="region"))

    flow = ep.Dataflow("shop", parallelism=2)
    # region "payments": everything connected to its source (the shuffle, the count, the sink)
    (flow.source("payments", generator(payments), region=payments_region)
         .map("one", lambda p: (p["account"], 1))
         .key_by(lambda pair: pair[0])
         .reduce("count", lambda a, b: (a[0], a[1] + b[1]))
         .sink("counts", FileSink(f"{work}/counts")))
    # region "audit": no key_by, so each split's pipeline (source -> map -> sink, one task) is a
    # failover region of its own
    (flow.source("events", generator(events), region=audit_region)
         .map("tag", lambda e: {"event": e, "audited": True})
         .sink("audited", FileSink(f"{work}/audited")))
    return flow
# --8<-- [end:graph]


FAULTS = [CrashAtRecord("count", subtask=0, record=300, how="exit", after_epoch=2),
          CrashAtRecord("tag", subtask=1, record=300, how="exit", after_epoch=1)]


def run(work: str, runtime: str = "spark", spark=None, crash: bool = True):
    """Run the job once; returns ``(result, outputs)``."""
    result = build(work).run(checkpoint=ep.CheckpointConfig(storage=f"file://{work}/checkpoints"),
                             runtime=runtime, spark=spark, faults=FAULTS if crash else [])
    return result, {name: list(read_committed(f"{work}/{name}")) for name in ("counts", "audited")}


def oracle() -> dict:
    """Each account's running counts 1..n, and every event once."""
    per_account = collections.Counter(payment(s, i)["account"] for s in range(2) for i in range(PER_SPLIT))
    return {"counts": collections.Counter((a, n) for a, c in per_account.items() for n in range(1, c + 1)),
            "audited": collections.Counter(event(s, i) for s in range(2) for i in range(PER_SPLIT))}


def as_counters(outputs: dict) -> dict:
    return {"counts": collections.Counter(tuple(r) for r in outputs["counts"]),
            "audited": collections.Counter(r["event"] for r in outputs["audited"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"), choices=["spark", "local"])
    parser.add_argument("--no-crash", action="store_true")
    args = parser.parse_args()
    result, outputs = run(tempfile.mkdtemp(prefix="epochal-regions-"), args.runtime, crash=not args.no_crash)
    # --8<-- [start:result]
    for name, region in result.regions.items():  # each region's own JobResult
        restarted = [f["tasks"] for f in region.failovers]  # failover regions that restarted alone
        print(f"region {name}: {region.attempts} attempt(s), {len(region.completed_epochs)} epochs, "
              f"restarted alone: {restarted}")
    # --8<-- [end:result]
    got, expected = as_counters(outputs), oracle()
    for name in got:
        print(f"  {name}: {sum(got[name].values())} rows; equal to plain Python: {got[name] == expected[name]}")
    if got != expected:
        raise SystemExit("a region's committed output differs from plain Python")


if __name__ == "__main__":
    main()
