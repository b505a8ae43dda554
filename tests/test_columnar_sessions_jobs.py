"""Session windows of Arrow batches in a job on the local runtime, through a crash injected
mid-run (after the second checkpoint): out-of-order events of seven keys in four splits, in
bursts a session gap apart, give exactly the sessions a plain-Python oracle computes — each
once in the committed output, none late."""
from __future__ import annotations

import collections
import random

import pyarrow as pa
import pytest

import epochal as ep
from epochal.columnar import count, max as amax, sum as asum
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord, CrashDuringSnapshotUpload
from epochal.windows import Session

from pipelines import unique_dir

SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("v", pa.int64())])
SPLITS, PER_SPLIT, ROWS, KEYS = 4, 1500, 100, 7
GAP = 400_000  # µs


def event(split: int, i: int) -> tuple:
    """Event ``i`` of ``split`` (µs): bursts of 150 events 10 ms apart every 3 s, a jitter
    below 0.3 s (out of order within the 1 s bound); key k6 only in every other burst, and
    keys k0/k1 skip a stretch of each burst longer than the gap (two sessions per burst)."""
    g = i * SPLITS + split
    burst, step = divmod(i, 150)
    key = g % KEYS
    if key == 6 and burst % 2:
        key = 5
    if key < 2 and 60 <= step < 120:
        key = 2 + key
    t = burst * 3_000_000 + step * 10_000 + split * 1_000 - random.Random(g).randrange(300_000)
    return f"k{key}", t, g % 10


def batches(split: int, offset: int):
    for start in range(offset * ROWS, PER_SPLIT, ROWS):
        rows = [event(split, i) for i in range(start, min(PER_SPLIT, start + ROWS))]
        yield pa.record_batch([pa.array(c) for c in zip(*rows)], schema=SCHEMA)


def oracle() -> collections.Counter:
    """Plain Python: sort each key's times; a session ends where the next time is more than
    GAP after the latest before it; ``(key, start, end, count, sum, max)`` per session."""
    per_key = collections.defaultdict(list)
    for s in range(SPLITS):
        for i in range(PER_SPLIT):
            k, t, v = event(s, i)
            per_key[k].append((t, v))
    out = collections.Counter()
    for k, rows in per_key.items():
        rows.sort()
        session = [rows[0]]
        for t, v in rows[1:] + [(None, None)]:
            if t is None or t > session[-1][0] + GAP:
                vs = [x for _, x in session]
                out[(k, session[0][0], session[-1][0] + GAP, len(vs), sum(vs), max(vs))] += 1
                session = []
            if t is not None:
                session.append((t, v))
    return out


@pytest.mark.parametrize("backend,fault", [
    ("heap", CrashAtRecord("sess", subtask=1, record=20, how="exit", after_epoch=2)),
    pytest.param("rocksdb", CrashDuringSnapshotUpload("sess", subtask=0, epoch=3, how="exit"),
                 marks=pytest.mark.slow),  # ~5 s at load: opt-in (-m slow)
], ids=["heap-crash-at-batch", "rocksdb-crash-in-upload"])
def test_sessions_of_batches_equal_the_oracle_through_a_crash(tmp_path, backend, fault):
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("csess", parallelism=2)
    fired = (flow.source("ev", ep.sources.GeneratorSource(batches, num_splits=SPLITS, schema=SCHEMA,
                                                          records_per_second=10.0))  # ~1.5 s: the fault waits
             .with_watermarks("wm", timestamp="ts", timestamp_unit="us", max_out_of_orderness="1s")
             .key_by("k").window(Session(GAP / 1e6)).aggregate("sess", n=count(), total=asum("v"), top=amax("v")))
    fired.sink("out", FileSink(out, format="parquet"))
    fired.late().sink("late", FileSink(out + "-late", format="parquet"))
    result = flow.run(runtime="local", backend=backend, faults=[fault],
                      checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, result.failures  # the fault fired once ...
    assert result.restored_from[1] >= 2, result.restored_from  # ... mid-run: the retry restored a checkpoint
    got = collections.Counter(
        (r["k"], round(r["window_start"].timestamp() * 1e6), round(r["window_end"].timestamp() * 1e6),
         r["n"], r["total"], r["top"]) for r in read_committed(out, format="parquet"))
    expected = oracle()
    assert len(expected) > 60 and any(k == "k0" for k, *_ in expected)
    assert got == expected
    assert read_committed(out + "-late", format="parquet") == []
