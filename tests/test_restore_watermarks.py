"""A restored source subtask that reads several splits resumes event time at the MINIMUM
over its splits (DESIGN.md "Time": each generator checkpoints its highest timestamp per
split and re-emits its watermark after a restore, so late records stay late — and on-time
ones stay on time).

The defect these tests pin down: the restored per-split generators were registered with the
subtask's watermark tracker one at a time, and the tracker (which never moves back) took the
first split's restored watermark as the subtask's before the other splits were known. A
split restored ahead of a later one in the split list then pushed the watermark past the
later split's records, which went to ``.late()`` instead of their windows: silent loss in
exactly-once output. ``tests/test_columnar_window_local.py``'s crash test lost rows of its
first window that way when its restore point fell early (1 run in 10).

The restore point is chosen, not raced: epochs are manual (``interval=None``) and the only
one in the first attempt is asked for by the source itself after half of split 0, whose
event time runs 100 s ahead of split 1's; the source then waits until that epoch completed
before it reads on, and the fault fires once the window task heard of that completion. The
second attempt restores split 0 at 101 s and split 1 untouched: its watermark must stay at
split 1's (nothing read: the beginning of time), not split 0's.
"""
from __future__ import annotations

import collections
import dataclasses

import pyarrow as pa
import pytest

import epochal as ep
from epochal.columnar import count
from epochal.operators.base import OperatorContext
from epochal.sinks import FileSink, read_committed
from epochal.sources.base import Poll, Source, SourceReader
from epochal.testing import CrashAtRecord
from epochal.time.assign import GeneratorState, WatermarkOperator, WatermarkSpec
from epochal.time.units import MIN_TIME
from epochal.windows import Count, Tumbling

from pipelines import unique_dir

N, CHUNK = 400, 50  # events per split, per poll
HALF = N // 2  # split 0 asks for the epoch after this many events
AHEAD = 100.0  # seconds split 0's event time runs ahead of split 1's
SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.float64()), ("split", pa.int64())])


def event(split: int, i: int) -> tuple:
    """In order within a split; split 0 is AHEAD seconds ahead of split 1."""
    return f"k{i % 3}", (AHEAD if split == 0 else 0.0) + i * 0.01, split


def oracle() -> collections.Counter:
    """Plain Python: ``{(key, start of its 1 s window in µs): count}`` over every event."""
    out = collections.Counter()
    for s in (0, 1):
        for i in range(N):
            k, t, _ = event(s, i)
            us = round(t * 1_000_000)
            out[(k, us - us % 1_000_000)] += 1
    return out


class SplitsInTurn(Source):
    """Splits 0 and 1 of :func:`event`, read one after the other, CHUNK events a poll (one
    Arrow batch with ``columns``). After the first HALF events of split 0 it asks for an
    epoch and reads nothing more until that epoch completed. State: ``{str(split): next}``."""

    def __init__(self, columns: bool):
        self.columns = columns

    @property
    def schema(self):
        return SCHEMA if self.columns else None

    def splits(self) -> list:
        return [0, 1]

    def create_reader(self, splits, state, *, subtask=0, parallelism=1):
        return _InTurnReader(self.columns, list(splits), state)


class _InTurnReader(SourceReader):
    def __init__(self, columns: bool, splits: list, state: dict | None):
        self.columns, self.splits = columns, splits
        self.next = {s: int((state or {}).get(str(s), 0)) for s in splits}
        self.waiting = False  # for the epoch it asked for

    def poll(self, max_records: int) -> Poll:
        if self.waiting:
            return Poll([], idle=True)
        for s in self.splits:
            i = self.next[s]
            if i == N:
                continue
            stop = min(N, i + CHUNK, HALF if s == 0 and i < HALF else N)
            self.next[s] = stop
            rows = [event(s, j) for j in range(i, stop)]
            records = [pa.record_batch([pa.array(c) for c in zip(*rows)], schema=SCHEMA)] if self.columns else rows
            ask = s == 0 and stop == HALF
            self.waiting = ask
            return Poll(records, finished=all(n == N for n in self.next.values()), request_epoch=ask,
                        split=s, split_finished=stop == N)
        return Poll([], finished=True)

    def snapshot(self) -> dict:
        return {str(s): n for s, n in self.next.items()}

    def notify_epoch_complete(self, epoch: int, offsets: dict) -> None:
        self.waiting = False


def flow(name: str, out: str, columns: bool) -> ep.Dataflow:
    f = ep.Dataflow(name, parallelism=1)
    source = f.source("ev", SplitsInTurn(columns))
    if columns:
        counts = (source.with_watermarks("wm", timestamp="ts", max_out_of_orderness="1s")
                  .key_by("k").window(Tumbling("1s")).aggregate("win", n=count()))
        counts.sink("out", FileSink(out, format="parquet"))
        counts.late().sink("late", FileSink(out + "-late", format="parquet"))
    else:
        counts = (source.with_watermarks("wm", timestamp=lambda e: e[1], max_out_of_orderness="1s")
                  .key_by(lambda e: e[0]).window(Tumbling("1s")).aggregate("win", Count()))
        counts.sink("out", FileSink(out))
        counts.late().sink("late", FileSink(out + "-late"))
    return f


def windows(out: str, columns: bool) -> collections.Counter:
    if columns:
        return collections.Counter({(r["k"], round(r["window_start"].timestamp() * 1_000_000)): r["n"]
                                    for r in read_committed(out, format="parquet")})
    return collections.Counter({(r["key"], round(r["start"] * 1_000_000)): r["value"] for r in read_committed(out)})


@pytest.mark.parametrize("columns", [False, True], ids=["records", "columns"])
def test_a_split_restored_ahead_of_a_later_one_does_not_make_its_records_late(tmp_path, columns):
    out = unique_dir(tmp_path, "out")
    result = flow(f"restore-wm-{'c' if columns else 'r'}", out, columns).run(
        runtime="local", faults=[CrashAtRecord("win", subtask=0, record=1, how="exit", after_epoch=1)],
        checkpoint=ep.CheckpointConfig(interval=None, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2 and result.restored_from == [None, 1], (result.restored_from, result.failures)
    late = read_committed(out + "-late", format="parquet") if columns else read_committed(out + "-late")
    assert late == []
    assert windows(out, columns) == oracle()


def _operator(state) -> WatermarkOperator:
    ctx = OperatorContext("wm", "ev[0]", 0, 1, 0, "restore-wm", 128, None, range(0))
    op = WatermarkOperator(ctx, WatermarkSpec.build("wm", lambda e: e[1], 1.0, None))
    op.restore(state)
    return op


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 0, 2]])
def test_the_restored_watermark_is_the_minimum_over_the_splits_in_any_order(order):
    """Whatever the order the splits are bound in, the first watermark after a restore is
    the lowest split's (here split 1's: 5 s - 1 s bound - 1 µs), and a split restored with
    nothing read holds it at the beginning of time."""
    highest = {"0": 100_000_000, "1": 5_000_000, "2": 40_000_000}
    op = _operator(GeneratorState(max(highest.values()), highest))
    op.bind_source_splits(order)
    assert op.emit_watermark() == (5_000_000 - 1_000_000 - 1, False)

    held = _operator(GeneratorState(100_000_000, {"0": 100_000_000, "1": MIN_TIME}))
    held.bind_source_splits([0, 1])
    assert held.emit_watermark() is None  # nothing to say yet: split 1 read nothing
    held.set_input_split(1, False)
    held.process_batch([("k", 2.0)])
    assert held.emit_watermark() == (1_000_000 - 1, False)


def test_state_round_trip_keeps_every_splits_position():
    """The snapshot keys positions by split; restoring them into a fresh operator gives each
    split its own (not another split's) generator position."""
    op = _operator(None)
    op.bind_source_splits([0, 1])
    for split, ts in ((0, 50.0), (1, 7.0)):
        op.set_input_split(split, False)
        op.process_batch([("k", ts)])
    state = op.snapshot(1)
    assert state.splits == {"0": 50_000_000, "1": 7_000_000}
    again = _operator(dataclasses.replace(state))
    again.bind_source_splits([0, 1])
    assert again.emit_watermark() == (6_000_000 - 1, False)
