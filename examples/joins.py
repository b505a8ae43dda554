"""Joins in event time: an interval join, a window join and a temporal join of an auction
site's streams, exactly once through a crash.

Three streams keyed by auction: ``auctions`` (an auction opens), ``bids`` (out of order by up
to half a second) and ``reserves`` (a changelog: the reserve price of an auction, changed
over time). The job pairs

* each bid with the auctions of its key opened at most 10 s before it, or ``None`` (a left
  interval join);
* bids and auctions of a key in the same 10 s window (an inner tumbling-window join);
* each bid with its auction's reserve price as of the bid's time (a left temporal join).

Half-way, the interval join's process exits after a completed checkpoint. Each output is
compared with the same pairs found by nested loops in plain Python.

    python examples/joins.py [--runtime spark|local] [--no-crash]

Contract: :func:`run` runs the job once in a fresh directory and returns what each sink
committed; :func:`oracle` computes the same from :data:`BIDS`, :data:`AUCTIONS` and
:data:`RESERVES` without epochal.
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord
from epochal.windows import Tumbling

KEYS = ("a1", "a2", "a3", "a4", "a5", "a6")
BIDS = [{"auction": KEYS[i * 7 % 6], "ts": round(i * 0.2 - (i * 7919 % 97) / 97 * 0.5, 6), "price": i % 50 + 1}
        for i in range(600)]
AUCTIONS = [{"auction": KEYS[k % 6], "ts": 2.0 * k + 0.5, "item": f"item-{k}"} for k in range(60)]
RESERVES = [{"auction": KEYS[j % 6], "ts": 3.0 * j + 0.05, "reserve": 10 + j % 30} for j in range(40)]


def replay(rows):
    """A source generator over a fixed list: the rows from ``offset`` on."""
    return lambda split, offset: iter(rows[offset:])


def source(rows, seconds: float = 1.5) -> ep.sources.GeneratorSource:
    """``rows`` spread over about ``seconds`` of wall time, so checkpoints fall among them."""
    return ep.sources.GeneratorSource(replay(rows), num_splits=1, limit=len(rows), records_per_second=len(rows) / seconds)


# --8<-- [start:graph]
def build(work: str) -> ep.Dataflow:
    flow = ep.Dataflow("auction-joins", parallelism=2)
    stamp = dict(timestamp=lambda row: row["ts"], max_out_of_orderness="1s")  # seconds; bids are 0.5 s out of order
    bids = flow.source("bids", source(BIDS), parallelism=1).with_watermarks("bid-time", **stamp)
    auctions = flow.source("auctions", source(AUCTIONS), parallelism=1).with_watermarks("auction-time", **stamp)
    reserves = flow.source("reserves", source(RESERVES), parallelism=1).with_watermarks("reserve-time", **stamp)
    by_auction = lambda row: row["auction"]  # noqa: E731

    # every bid with the auctions of its key opened at most 10 s before it (None: no such auction)
    opened = (bids.key_by(by_auction)
                  .interval_join(auctions.key_by(by_auction), "-10s", 0, how="left")
                  .apply("bid-after-open", lambda bid, auction: {**bid, "item": auction and auction["item"]},
                         parallelism=2))
    opened.sink("opened", FileSink(f"{work}/opened"))
    opened.late().sink("opened-late", FileSink(f"{work}/opened-late"))  # ("left" | "right", row) too late

    # bids and auctions of a key in the same 10 s window: the pair (bid, auction)
    (bids.key_by(by_auction)
         .window_join(auctions.key_by(by_auction), Tumbling("10s"), how="inner")
         .apply("same-window", parallelism=2)
         .sink("windowed", FileSink(f"{work}/windowed")))

    # every bid with its auction's reserve price as of the bid's time (None before the first)
    (bids.key_by(by_auction)
         .temporal_join(reserves.key_by(by_auction), how="left")
         .apply("bid-vs-reserve", lambda bid, r: {**bid, "reserve": r and r["reserve"]}, parallelism=2)
         .sink("vs-reserve", FileSink(f"{work}/vs-reserve")))
    return flow
# --8<-- [end:graph]


OUTPUTS = ("opened", "opened-late", "windowed", "vs-reserve")


def run(work: str, runtime: str = "spark", spark=None, crash: bool = True):
    """Run the job once; returns ``(result, outputs)`` with each sink's committed rows."""
    faults = [CrashAtRecord("bid-after-open", subtask=0, record=150, how="exit", after_epoch=1)] if crash else []
    # --8<-- [start:run]
    result = build(work).run(checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/checkpoints"),
                             runtime=runtime, spark=spark, faults=faults)
    # --8<-- [end:run]
    return result, {name: list(read_committed(f"{work}/{name}")) for name in OUTPUTS}


def _us(t: float) -> int:
    return round(t * 1_000_000)


def _row(row) -> tuple:
    return tuple(sorted(row.items())) if isinstance(row, dict) else None


def oracle() -> dict:
    """Every sink's rows by nested loops, as multisets of hashable rows."""
    opened = collections.Counter()
    for b in BIDS:
        items = [a["item"] for a in AUCTIONS if a["auction"] == b["auction"]
                 and _us(b["ts"]) - _us(10) <= _us(a["ts"]) <= _us(b["ts"])]
        opened.update(_row({**b, "item": item}) for item in items or [None])
    window = lambda row: _us(row["ts"]) // _us(10)  # noqa: E731
    same = collections.Counter((_row(b), _row(a)) for b in BIDS for a in AUCTIONS
                               if a["auction"] == b["auction"] and window(a) == window(b))
    reserve = collections.Counter()
    for b in BIDS:
        before = [r for r in RESERVES if r["auction"] == b["auction"] and _us(r["ts"]) <= _us(b["ts"])]
        reserve[_row({**b, "reserve": max(before, key=lambda r: r["ts"])["reserve"] if before else None})] += 1
    return {"opened": opened, "opened-late": collections.Counter(), "windowed": same, "vs-reserve": reserve}


def as_counters(outputs: dict) -> dict:
    """The committed rows as the oracle's multisets (JSON made the pairs lists)."""
    return {"opened": collections.Counter(map(_row, outputs["opened"])),
            "opened-late": collections.Counter(map(repr, outputs["opened-late"])),
            "windowed": collections.Counter((_row(b), _row(a)) for b, a in outputs["windowed"]),
            "vs-reserve": collections.Counter(map(_row, outputs["vs-reserve"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"), choices=["spark", "local"])
    parser.add_argument("--no-crash", action="store_true")
    args = parser.parse_args()
    result, outputs = run(tempfile.mkdtemp(prefix="epochal-joins-"), args.runtime, crash=not args.no_crash)
    print(f"{result.attempts} attempt(s), restored from epochs {result.restored_from[1:]}")
    got, expected = as_counters(outputs), oracle()
    for name in OUTPUTS:
        print(f"  {name}: {sum(got[name].values())} rows; equal to nested loops: {got[name] == expected[name]}")
    if got != expected:
        raise SystemExit("the committed joins differ from the nested loops")


if __name__ == "__main__":
    main()
