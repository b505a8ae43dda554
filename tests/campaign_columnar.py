"""The campaign's ``columnar`` topology (issue 46; the family is ``tests/campaign_topologies.py``):
event-time tumbling windows over Arrow batches, ``test_columnar_time``'s job, and its
plain-Python oracles. Its model is :func:`campaign.check`'s, as ``windows``': exactly-once
equals the oracle; at-least-once fires every window with at least its true count."""
from __future__ import annotations

import collections
import sys

import cloudpickle

import epochal as ep
import test_columnar_time

cloudpickle.register_pickle_by_value(test_columnar_time)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Arrow batches of ``test_columnar_time`` (4 splits × 15 batches of 100 events, offsets count
#: batches) at COLUMNAR_RATE batches/s per split: ≈ 5 s a run; COLUMNAR_WINDOW its tumbling window
COLUMNAR_RATE, COLUMNAR_WINDOW = 3.0, 2.0


def flow(history, target, parallelism: int) -> ep.Dataflow:
    """A columnar event-time tumbling window over Arrow batches (``test_columnar_time``'s
    job: watermarks from the ``ts`` column, ``count`` and ``sum`` per key and window),
    converted to records for the sinks: ``(key, start, end, count, sum)`` as ``windows``."""
    from epochal.columnar import count, sum as asum
    from epochal.windows import Tumbling

    f = ep.Dataflow("campaign", parallelism=parallelism)
    source = ep.sources.GeneratorSource(test_columnar_time.batches, num_splits=test_columnar_time.SPLITS,
                                        schema=test_columnar_time.SCHEMA,
                                        records_per_second=COLUMNAR_RATE * history.speed)
    fired = (f.source("ev", source, parallelism=test_columnar_time.SPLITS)
             .with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
             .key_by("k").window(Tumbling(f"{COLUMNAR_WINDOW:g}s")).aggregate("win", n=count(), total=asum("v")))
    target.into(fired.to_records("rows").map("row", _columnar_row))
    return f


def _seconds(t) -> float:
    """A window bound of a columnar record (a datetime, or µs) in seconds, rounded to the µs."""
    if hasattr(t, "timestamp"):
        return round(t.timestamp(), 6)
    return round(t / 1_000_000, 6)


def _columnar_row(r) -> tuple:
    start = _seconds(r["window_start"])
    return (r["k"], start, round(start + COLUMNAR_WINDOW, 6), int(r["n"]), int(r["total"]))


def _columnar_of(events) -> collections.Counter:
    """Plain Python: ``(key, start, end, count, sum)`` per key and tumbling window of ``events``."""
    out: dict = collections.defaultdict(list)
    for k, t, v in events:
        start = round(t * 1_000_000) // round(COLUMNAR_WINDOW * 1_000_000) * round(COLUMNAR_WINDOW * 1_000_000)
        out[(k, start)].append(v)
    return collections.Counter((k, round(s / 1_000_000, 6), round(s / 1_000_000 + COLUMNAR_WINDOW, 6), len(vs),
                                sum(vs)) for (k, s), vs in out.items())


def oracle(history) -> collections.Counter:
    return _columnar_of(test_columnar_time.every_event())


def drained(history, read: dict) -> collections.Counter:
    """A drain ends event time: every window of the batches read fires (offsets count batches)."""
    rows = test_columnar_time.ROWS
    return _columnar_of([test_columnar_time.event(s, i) for s, n in read.items()
                         for i in range(min(n * rows, test_columnar_time.PER_SPLIT))])
