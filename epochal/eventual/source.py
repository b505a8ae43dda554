"""A CEC window aggregation in the engine: the operator and its seekable input run as one
*source* of the job, whose read position is a position in the operator's persisted output
queue (seed 003 §II.B; the design is in docs/eventual.md, "In a job").

Why a source. Seed 003 recovers an operator by asking *its upstream* to replay from T, the
oldest footprint of the eventual checkpoint — not from an epoch's cut. So the CEC operator
reads its input itself, from a source that can be replayed from an event-time position
(:class:`SeekableInput`), and its output queue — results and Gopen/Gcheck records in one log
under the job's checkpoint storage — is what the rest of the job reads. The rest of the job
is an ordinary epoch region downstream of it: its epoch snapshot of this source holds only
``(segment, byte, records)`` of the queue (no window state, no pause), and a sink commits per
epoch what it read. After a crash:

1. the engine restores the downstream region from its latest completed epoch and creates
   this reader at the queue position that epoch read to;
2. the reader rebuilds each split's operator from its own log — the seed's recovery path,
   :func:`~epochal.eventual.recovery.construct`: read back until N footprints, closed windows
   skipped, T = the oldest; each window ignores replayed tuples its footprint already holds —
   and reads its input again after T;
3. it hands downstream the durable results after the restored position first (those the lost
   attempt handed over after the epoch, or never), then new ones.

Only flushed (durable) results are ever handed downstream, and each at most once per
position, so the committed output is exactly-once: a result is in the log once (recovery
never re-emits what the log holds, seed 003 "skip ... windows that are known to have
closed"), and downstream reads each log position once per committed epoch.

Each split is one CEC operator over the keys whose stable hash falls in it, with its own log;
the split count (``Eventual(splits=)``, by default the window's parallelism) is fixed for the
logs' lifetime and the engine gives split ``j`` to subtask ``j % parallelism``. Rescaling is
therefore a restore at another parallelism with the same split count: every log moves whole to
its new subtask, which recovers it as after any crash (the seed's log per operator instance,
where an instance is a split, not a subtask); another split count is refused naming why. Every attempt's recovery is recorded in the
split's log directory as ``recovery-<n>.json`` (what was read: footprints, T, the extent).
"""
from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from epochal.backends.keygroups import stable_hash
from epochal.errors import ConfigError, DataError
from epochal.eventual.chain import Chain
from epochal.eventual.extent import CheckpointScheduler, ExtentPolicy
from epochal.eventual.log import OutputLog
from epochal.eventual.operator_state import EventualWindows
from epochal.eventual.records import Position, Result
from epochal.eventual.recovery import construct
from epochal.sources.base import Poll, Source, SourceReader, check_max_records

__all__ = ["EventualWindowSource", "SeekableInput"]


class SeekableInput(Protocol):
    """An input a CEC operator can ask to replay from an event-time position (seed 003: "ask
    upstream nodes to replay tuples from that point forward")."""

    def read_after(self, position: Position | None) -> Iterator[tuple[Any, Position]]:
        """``(record, position)`` in increasing position from the first record after
        ``position`` (``None``: the beginning); the same records at the same positions on every
        call."""


class ReadAll:
    """:class:`SeekableInput` over a finite, deterministic :class:`~epochal.sources.Source`: every
    split in split order, each record through ``chain`` (a
    :class:`~epochal.eventual.chain.Chain`: the map / filter / flat_map operators and the
    timestamp function between the source and ``key_by``; a bare timestamp function is a chain
    of none). The ``j``-th record made from source record ``i`` is at ``(its timestamp in µs,
    i * chain.fanout + j)``. A :class:`~epochal.sources.CollectionSource` seeks to the source
    record of the position (its splits are contiguous runs of its items, so the index is the
    item's) and skips that record's outputs up to the position; any other source is read from
    its start and skipped up to the position.

    Raises (while reading):
        DataError: timestamps going back (CEC needs its input in timestamp order), naming the
            source, the record's index and the operator.
    """

    def __init__(self, source: Source, chain: Callable[[Any], Any], where: str):
        if not isinstance(chain, Chain):
            chain = Chain([], chain, [], where)
        self.source, self.chain, self.where = source, chain, where

    def _seek(self, position: Position | None) -> tuple[dict | None, int]:
        """The reader state that starts at the source record of the first output after
        ``position``, and that record's index."""
        split_range = getattr(self.source, "split_range", None)
        if position is None or split_range is None:
            return None, 0
        fanout = self.chain.fanout
        first = position.seq // fanout + (fanout == 1)  # with a fan-out, the record may have outputs left
        return {str(s): min(max(first, r.start), r.stop) for s in self.source.splits()
                for r in (split_range(s),)}, first

    def read_after(self, position: Position | None) -> Iterator[tuple[Any, Position]]:
        state, index = self._seek(position)
        reader = self.source.create_reader(self.source.splits(), state)
        chain, fanout = self.chain, self.chain.fanout
        last = None
        try:
            while True:
                poll = reader.poll(4096)
                for record in poll.records:
                    for j, (out, ts) in enumerate(chain(record)):
                        if last is not None and ts < last:
                            raise DataError(f"{self.where}: record {index} of source {self.source.name} has "
                                            f"timestamp {ts} µs after {last} µs: eventual checkpoints need the input "
                                            "in timestamp order")
                        last, p = ts, Position(ts, index * fanout + j)
                        if position is None or p > position:
                            yield out, p
                    index += 1
                if poll.finished:
                    return
        finally:
            reader.close()


class EventualWindowSource(Source):
    """The CEC window operator with its input, as a source of the job (module docstring).

    Args:
        operator: the window operator's name (it names the logs and errors).
        input: where the operator's input is replayed from.
        key_fn, make_windows: the key of a record; a fresh
            :class:`~epochal.eventual.operator_state.EventualWindows` given a scheduler.
        value: the value a record adds to its windows (default: the record).
        make_result: a durable ``R`` record → the record handed downstream.
        policy: the extent policy (budget, max_extent in µs).
        splits: the number of splits (one CEC operator and one log each; a key's split is
            ``stable_hash(key) % splits``). Fixed for the logs' lifetime; the job's parallelism
            is not: the engine gives split ``j`` to subtask ``j % parallelism``, so a restore at
            another parallelism moves whole logs between subtasks (rescaling, docs/eventual.md).
        flush_every: input tuples per flush (one log segment); a flush is what makes results
            visible downstream.
        storage: the log root; ``None``: the job's checkpoint storage, bound by the task.
    """

    def __init__(self, operator: str, input: SeekableInput, key_fn: Callable, make_windows: Callable,
                 value: Callable | None, make_result: Callable[[Result], Any], policy: ExtentPolicy,
                 splits: int, flush_every: int, storage: str | None = None):
        self.operator, self.input, self.key_fn, self.make_windows = operator, input, key_fn, make_windows
        self.make_result = make_result
        self.value, self.policy, self.n_splits, self.flush_every = value, policy, splits, flush_every
        self.storage = storage

    @property
    def name(self) -> str:
        return f"eventual window {self.operator!r}"

    def splits(self) -> list[int]:
        return list(range(self.n_splits))

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        return EventualReader(self, list(splits), state or {})


class _Split:
    """One split: its operator, log, input and hand-over cursor (``index``, ``offset``: the next
    frame to hand over; ``skip``: that frame's results already handed over)."""

    def __init__(self, src: EventualWindowSource, split: int, root: str, position, key: bytes | None = None):
        self.split = split
        self.log = OutputLog(f"{root}/{split}", key=key)
        self.index, self.offset, self.skip = (int(x) for x in position)
        self.committed = self.index  # segments below it may go: a completed epoch read past them
        # the recovery path (seed 003 §II.B "Constructing an EC"): N footprints back, T = the oldest
        ec = construct(self.log.frames_backward(), where=f"{src.name} split {split}, log {self.log.url!r}")
        self.op: EventualWindows = src.make_windows(CheckpointScheduler(src.policy))
        self.op.restore(ec)
        self.recovered = ec
        attempt = len(self.log.side_files("recovery-"))
        self.log.write_side_file(f"recovery-{attempt:06d}.json", json.dumps({
            "tc": ec.tc and list(ec.tc), "n": ec.n, "T": ec.T and list(ec.T), "extent": ec.extent,
            "frames": ec.frames, "footprints": sorted(repr(w) for w in ec.footprints),
            "position": [self.index, self.offset, self.skip], "at": time.time()}))
        p, key_fn = src.n_splits, src.key_fn
        # "request replay of input tuples with timestamps t > T": only this split's keys
        self.input = ((r, t) for r, t in src.input.read_after(ec.T) if stable_hash(key_fn(r)) % p == split)
        self.done = False


class EventualReader(SourceReader):
    """Runs the CEC operators of one subtask's splits and hands over their durable results
    (module docstring). State: ``{str(split): [segment, byte, skip]}``."""

    def __init__(self, src: EventualWindowSource, split_ids: list[int], state: dict):
        self.src, self._ids, self._state = src, split_ids, state
        self._root = None if src.storage is None else src.storage.rstrip("/")
        self._key: bytes | None = None  # bind_storage
        self._splits: list[_Split] | None = None
        self._pending: deque = deque()  # (WindowResult, split, its position)
        self._turn = 0
        self._new_run = False

    def bind_storage(self, url: str, job: str, generation: int = 0, key: bytes | None = None) -> None:
        """The task binds the job's checkpoint storage before the first poll (logs go to
        ``<storage>/<job>/eventual/<operator>/<split>/``), and the attempt: a first attempt
        restoring no epoch is a new run, whose logs start over.

        ``key`` signs and checks every log frame (``AttemptSpec.log_key``, derived from the
        job's ``CheckpointConfig.signing_key``): with it, a frame planted in the storage by
        someone without the key is refused before anything in it is unpickled."""
        self._key = key
        if self._root is None:
            self._root = f"{url.rstrip('/')}/{job}"
        self._new_run = generation == 0 and not self._state

    @property
    def splits(self) -> list[_Split]:
        """The splits, opened (and recovered from their logs) on first use."""
        if self._splits is None:
            if self._root is None:
                raise RuntimeError(f"{self.src.name}: no storage bound (the task binds the job's checkpoint storage)")
            if not self._ids:  # more subtasks than splits: this one has none (it never touches the logs)
                self._splits = []
                return self._splits
            root = f"{self._root}/eventual/{self.src.operator}"
            layout = OutputLog(root)  # the operator's directory: its split count is fixed by its logs
            found = layout.side_files("layout-")
            n = self.src.n_splits
            mine = f"layout-{n}"
            if found and not self._new_run and not found[0].endswith(mine):
                raise ConfigError(f"{self.src.name}: its logs under {root!r} were written by "
                                  f"{found[0].rsplit('-', 1)[-1]} splits, the job now has {n}: a split's log holds "
                                  "the windows of its keys, so the split count is fixed for the logs' lifetime — "
                                  f"restore with Eventual(splits={found[0].rsplit('-', 1)[-1]}) at any parallelism, "
                                  "or start over in new storage")
            restored = sorted(k for k, v in self._state.items() if tuple(v) != (0, 0, 0))
            if not found and not self._new_run and restored:
                raise ConfigError(f"{self.src.name}: the restored epoch read its logs up to a position (splits "
                                  f"{', '.join(restored)}) but there are no logs under {root!r}: restore with the "
                                  "checkpoint storage the job wrote them to, or pin them with Eventual(storage=...)")
            if not found or self._new_run:
                for path in found:
                    try:
                        layout.remove_side_file(path)
                    except FileNotFoundError:  # another subtask of the new run was first
                        pass
                layout.write_side_file(mine, "")
            if self._new_run:
                for s in self._ids:
                    OutputLog(f"{root}/{s}").discard()
            self._splits = [_Split(self.src, s, root, self._state.get(str(s), (0, 0, 0)), self._key) for s in self._ids]
            for s in self._splits:  # what the lost attempt handed over after the restored epoch, first
                self._collect(s)
        return self._splits

    def poll(self, max_records: int) -> Poll:
        check_max_records(max_records, self.src.name)
        splits = self.splits
        if not self._pending:
            live = [s for s in splits if not s.done]
            if live:
                self._advance(live[self._turn % len(live)])
                self._turn += 1
        out = [self._pending.popleft()[0] for _ in range(min(max_records, len(self._pending)))]
        finished = not self._pending and all(s.done for s in splits)
        return Poll(out, finished=finished)

    def _advance(self, s: _Split) -> None:
        """Foreground and background paths over up to ``flush_every`` input tuples, then one
        flush (a segment), truncation behind the extent and the committed reader, and the
        hand-over of what became durable."""
        op, log, key_fn, value = s.op, s.log, self.src.key_fn, self.src.value
        n = 0
        for record, t in s.input:
            log.append(op.on_tuple(key_fn(record), (record if value is None else value(record), t.ts), t))
            log.append(op.background())
            n += 1
            if n >= self.src.flush_every:
                break
        else:
            log.append(op.end_of_input())
            s.done = True
        log.flush()
        start = op.extent_start()
        if start is not None:
            log.truncate_behind(start, keep_from=s.committed)
        self._collect(s)

    def _collect(self, s: _Split) -> None:
        """Queue the durable results after ``s``'s cursor, control records skipped."""
        for segment, start, end, records in s.log.frames_after(s.index, s.offset):
            if segment != s.index:
                s.index, s.skip = segment, 0
            results = [r for r in records if isinstance(r, Result)]
            for k in range(s.skip, len(results)):
                self._pending.append((self.src.make_result(results[k]), s, (segment, start, k)))
            s.offset, s.skip = end, 0

    def snapshot(self) -> dict:
        first: dict = {}
        for _, s, position in self._pending:
            first.setdefault(s.split, position)
        splits = self._splits
        if splits is None:  # nothing read yet: the restored positions
            return {str(k): list(self._state.get(str(k), (0, 0, 0))) for k in self._ids}
        return {str(s.split): list(first.get(s.split, (s.index, s.offset, s.skip))) for s in splits}

    def notify_epoch_complete(self, epoch: int, offsets: dict) -> None:
        for s in self._splits or ():
            position = offsets.get(str(s.split))
            if position:
                s.committed = max(s.committed, int(position[0]))

    def metrics(self) -> dict:
        """Per split: the operator's gauges (open windows, extent lag, footprints) and the
        log's counters."""
        return {s.split: dict(s.op.metrics(), segments=s.log.segments_written, torn=s.log.torn_frames)
                for s in self._splits or ()}
