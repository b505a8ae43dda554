"""The loop one CEC operator runs on its task thread — recovery, replay, foreground and
background paths — over a replayable source and its persisted output queue (seed 003 §III:
"In terms of execution paths we distinguish between foreground, background, and recovery.
All processing is performed in the main thread of the operator").

Internal: the protocol tests' driver, with no engine around it; in a job the same loop runs
inside :class:`~epochal.eventual.source.EventualReader`, a poll at a time.

One call of :func:`run_eventual` is one attempt of the operator::

    ec = construct(log.frames_backward())          # recovery path: the EC from the log
    op = make_operator(); op.restore(ec)
    for key, value, t in source.read_after(ec.T):  # upstream replays after T
        log.append(op.on_tuple(key, value, t))     # foreground path
        log.append(op.background())                # background path: Gchecks in the budget
        every flush_every tuples: log.flush(); log.truncate_behind(op.extent_start(), keep_from)
    log.append(op.end_of_input()); log.flush()

A crash anywhere (an exception, or the process killed) leaves the log with whole frames and
perhaps one torn tail; the next attempt recovers from it. So a crash loses nothing and
repeats nothing at the log: the results the log holds are exactly the failure-free run's.

A source is *replayable* when :meth:`ReplayableSource.read_after` can start after any
position it gave out and then yields the same tuples at the same positions as before.
:class:`JsonLinesSource` is one over a file; Kafka (offsets for a timestamp) and the
transactional log will follow. A source that cannot replay must be refused when the job is
built; that check belongs to the integration.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import fsspec

from epochal.errors import DataError
from epochal.eventual.log import OutputLog
from epochal.eventual.operator_state import EventualWindows
from epochal.eventual.records import Position
from epochal.eventual.recovery import EventualCheckpoint, construct

__all__ = ["AttemptReport", "JsonLinesSource", "ReplayableSource", "run_eventual"]


class ReplayableSource(Protocol):
    """Input an eventual checkpoint can be recovered from."""

    def read_after(self, position: Position | None) -> Iterator[tuple[Hashable, Any, Position]]:
        """``(key, value, position)`` in increasing position, from the first tuple after
        ``position`` (``None``: from the beginning). The same tuples at the same positions on
        every call."""


class JsonLinesSource:
    """A file (fsspec URL or path) of JSON lines ``[key, timestamp, value]`` in timestamp order;
    a tuple's position is ``(timestamp, line number)``. ``read_after`` reads from the start and
    skips up to the position (a sparse index of line offsets by timestamp is the obvious next
    step for large files).

    Raises (while reading):
        DataError: a line that is not ``[key, int timestamp, value]``, or timestamps going
            back; the message names the file and line.
    """

    def __init__(self, url: str):
        self.url = url

    def read_after(self, position: Position | None) -> Iterator[tuple[Hashable, Any, Position]]:
        last_ts = None
        with fsspec.open(self.url, "rt", encoding="utf-8") as f:
            for seq, line in enumerate(f):
                try:
                    key, ts, value = json.loads(line)
                    if isinstance(ts, bool) or not isinstance(ts, int):
                        raise ValueError(f"timestamp {ts!r} is not an int")
                except ValueError as exc:
                    raise DataError(f"source {self.url!r} line {seq + 1}: expected [key, int timestamp, value]: "
                                    f"{exc}") from None
                if last_ts is not None and ts < last_ts:
                    raise DataError(f"source {self.url!r} line {seq + 1}: timestamp {ts} after {last_ts} "
                                    "(eventual checkpoints need the input in timestamp order)")
                last_ts = ts
                t = Position(ts, seq)
                if position is None or t > position:
                    yield (tuple(key) if isinstance(key, list) else key), value, t


@dataclass(frozen=True)
class AttemptReport:
    """What one attempt did: the EC it recovered, tuples read, how many of them were replayed
    (at or before the recovered ``tc``), replayed tuples windows ignored, footprints written,
    segments truncated."""

    recovered: EventualCheckpoint
    tuples: int
    replayed: int
    ignored: int
    footprints: int
    truncated: int


def run_eventual(make_operator: Callable[[], EventualWindows], source: ReplayableSource, log: OutputLog, *,
                 flush_every: int = 1, truncate: bool = True, keep_from: Callable[[], int | None] = lambda: None,
                 on_tuple: Callable[[int, Position], None] | None = None) -> AttemptReport:
    """Run one attempt to the end of ``source`` (see the module docstring).

    Args:
        make_operator: a fresh operator (restored here).
        flush_every: flush (and truncate) after this many tuples; the end always flushes.
        truncate: delete segments behind the extent after each flush.
        keep_from: the downstream reader's segment index, bounding truncation (``None``: no
            reader to wait for).
        on_tuple: called with the attempt's tuple count and position before each tuple
            (progress, and the hook a test injects a crash through).

    Raises:
        CheckpointStorageError: the log cannot be read, is corrupt or truncated past its extent.
        ReplayMismatch: the source did not replay the input the log was written from.
    """
    if flush_every < 1:
        raise ValueError(f"run_eventual: flush_every must be >= 1, got {flush_every}")
    ec = construct(log.frames_backward(), where=f"output log {log.url!r}")
    op = make_operator()
    op.restore(ec)
    tuples = replayed = truncated = 0
    for key, value, t in source.read_after(ec.T):
        if on_tuple is not None:
            on_tuple(tuples, t)
        tuples += 1
        replayed += ec.tc is not None and t <= ec.tc
        log.append(op.on_tuple(key, value, t))
        log.append(op.background())
        if tuples % flush_every == 0:
            log.flush()
            if truncate:
                truncated += len(log.truncate_behind(op.extent_start(), keep_from()))
    log.append(op.end_of_input())
    log.flush()
    return AttemptReport(ec, tuples, replayed, op.ignored, op.footprints, truncated)
