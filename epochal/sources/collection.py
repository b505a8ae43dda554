"""In-memory and generated sources: replayable by construction (tests, examples, benchmarks).

:class:`CollectionSource` replays a finite list by index; :class:`GeneratorSource` replays
a deterministic generator by re-generating from an offset. Both keep their state as
``{str(split): offset}``.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator

from epochal.errors import PipelineDefinitionError
from epochal.sources.base import Poll, Source, SourceReader, check_max_records, check_positive_int

__all__ = ["CollectionSource", "GeneratorSource"]


def _check_schema(schema, source: str, items: list | None = None):
    """``schema`` of a source of Arrow batches: a ``pyarrow.Schema``, and every given item a
    batch of it."""
    if schema is None:
        return None
    import pyarrow as pa

    if not isinstance(schema, pa.Schema):
        raise PipelineDefinitionError(f"{source}: schema must be a pyarrow.Schema, got {schema!r}")
    for i, item in enumerate(items or ()):
        if not isinstance(item, pa.RecordBatch) or not item.schema.equals(schema):
            raise PipelineDefinitionError(f"{source}: item {i} is not a pyarrow.RecordBatch of the schema")
    return schema


def _restored_offset(state: dict | None, split, default: int, source: str) -> int:
    """The offset of ``split`` in ``state`` (string keys; int keys tolerated), else ``default``."""
    if not state:
        return default
    value = state.get(str(split), state.get(split, default))
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{source}: restored state has offset {value!r} for split {split!r}; "
                         "expected an integer >= 0 (was the state written by another source?)")
    return value


class CollectionSource(Source):
    """A finite in-memory sequence, materialised as a list when the graph is built.

    Split ``s`` (``0 .. num_splits-1``) is the ``s``-th contiguous chunk of the items, so
    the order within a split is the items' order. State: ``{str(split): next index}``.

    Example::

        >>> src = CollectionSource(range(5), num_splits=2)
        >>> src.create_reader([1], None).poll(10).records
        [2, 3, 4]
    """

    def __init__(self, items: Iterable, *, num_splits: int | None = None, schema=None):
        self._items = list(items)
        self._num_splits = check_positive_int(1 if num_splits is None else num_splits,
                                              "num_splits", self.name)
        self._schema = _check_schema(schema, self.name, self._items)

    @property
    def schema(self):
        """The batches' schema when the items are Arrow batches (a columnar stream)."""
        return self._schema

    def splits(self) -> list[int]:
        return list(range(self._num_splits))

    def split_range(self, split: int) -> range:
        """The item indices covered by ``split``."""
        n, k = len(self._items), self._num_splits
        return range(split * n // k, (split + 1) * n // k)

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        return _CollectionReader(self, list(splits), state)


class _CollectionReader(SourceReader):
    """Reads its splits one after another; at most one poll's worth of items is copied."""

    def __init__(self, source: CollectionSource, splits: list[int], state: dict | None):
        self._items = source._items
        self._name = source.name
        self._ranges = {s: source.split_range(s) for s in splits}
        self._next = {s: _restored_offset(state, s, r.start, self._name) for s, r in self._ranges.items()}
        for s, r in self._ranges.items():
            if not r.start <= self._next[s] <= r.stop:
                raise ValueError(f"{self._name}: restored index {self._next[s]} is outside split {s} "
                                 f"({r.start}..{r.stop}); the collection changed since the snapshot")

    def poll(self, max_records: int) -> Poll:
        """Records of one split per poll (the splits one after another), tagged with it."""
        check_max_records(max_records, self._name)
        for s, r in self._ranges.items():
            start = self._next[s]
            if start == r.stop:
                continue
            stop = min(r.stop, start + max_records)
            self._next[s] = stop
            finished = all(self._next[k] == q.stop for k, q in self._ranges.items())
            return Poll(self._items[start:stop], finished=finished, split=s, split_finished=stop == r.stop)
        return Poll([], finished=True)

    def snapshot(self) -> dict:
        return {str(s): i for s, i in self._next.items()}


class _TokenBucket:
    """``rate`` tokens per second, bursts of at most ``max(1, rate / 10)`` (100 ms worth)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self._rate = rate
        self._capacity = max(1.0, rate / 10.0)
        self._tokens = self._capacity
        self._clock = clock
        self._last = clock()

    def take(self, wanted: int) -> int:
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
        self._last = now
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted


class GeneratorSource(Source):
    """Records re-generated deterministically from an offset: ``fn(split, offset)``.

    ``fn(split, offset)`` must yield the records of ``split`` starting at ``offset``, and
    the same ones every time (``fn(s, k)`` == ``fn(s, 0)`` without its first ``k``
    records): that is what makes the source replayable. A split ends when ``fn``'s
    iterator ends or after ``limit`` records; ``limit=None`` with an endless ``fn`` is an
    unbounded stream. State: ``{str(split): offset}``.

    Args:
        fn: a picklable (cloudpickle) function ``(split: int, offset: int) -> Iterator``.
        num_splits: number of splits ``0 .. num_splits-1``.
        limit: at most this many records per split; ``None`` for no cap.
        records_per_second: per-split rate limit (token bucket) for benchmarks and latency
            tests; a poll whose splits are all throttled returns ``idle=True``, no records.

    Example::

        >>> src = GeneratorSource(lambda split, offset: itertools.count(offset), limit=3)
        >>> src.create_reader([0], {"0": 1}).poll(10)
        Poll(records=[1, 2], finished=True, request_epoch=False, idle=False, split=0, split_finished=True)
    """

    def __init__(self, fn: Callable[[int, int], Iterator], *, num_splits: int = 1,
                 limit: int | None = None, records_per_second: float | None = None, schema=None):
        if not callable(fn):
            raise PipelineDefinitionError(f"{self.name}: fn must be callable (split, offset) -> iterator, got {fn!r}")
        self._fn = fn
        self._num_splits = check_positive_int(num_splits, "num_splits", self.name)
        self._limit = None if limit is None else check_positive_int(limit, "limit", self.name, minimum=0)
        if records_per_second is not None and (
                isinstance(records_per_second, bool) or not isinstance(records_per_second, (int, float))
                or not records_per_second > 0):
            raise PipelineDefinitionError(
                f"{self.name}: records_per_second must be a number > 0 (or None), got {records_per_second!r}")
        self._rate = records_per_second
        self._schema = _check_schema(schema, self.name)

    @property
    def schema(self):
        """With ``schema``, ``fn`` yields ``pyarrow.RecordBatch``es of it (a columnar stream;
        offsets, ``limit`` and the rate then count batches)."""
        return self._schema

    def splits(self) -> list[int]:
        return list(range(self._num_splits))

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        return _GeneratorReader(self, list(splits), state)


class _GeneratorReader(SourceReader):
    """Serves one split per poll, round-robin, so several unbounded splits all progress."""

    def __init__(self, source: GeneratorSource, splits: list[int], state: dict | None):
        self._fn, self._limit, self._name = source._fn, source._limit, source.name
        self._splits = splits
        self._offset = {s: _restored_offset(state, s, 0, self._name) for s in splits}
        self._iters: dict[int, Iterator] = {}
        self._done = {s for s in splits if self._limit is not None and self._offset[s] >= self._limit}
        self._buckets = {s: _TokenBucket(source._rate) for s in splits} if source._rate else None
        self._turn = 0

    def poll(self, max_records: int) -> Poll:
        check_max_records(max_records, self._name)
        n = len(self._splits)
        for i in range(n):
            s = self._splits[(self._turn + i) % n]
            if s in self._done:
                continue
            wanted = max_records if self._limit is None else min(max_records, self._limit - self._offset[s])
            if self._buckets is not None:
                wanted = self._buckets[s].take(wanted)
                if wanted == 0:
                    continue
            self._turn = (self._turn + i + 1) % n
            records = self._read(s, wanted)
            return Poll(records, finished=len(self._done) == n, split=s, split_finished=s in self._done)
        if len(self._done) == n:
            return Poll([], finished=True)
        return Poll([], idle=True)

    def _read(self, s: int, wanted: int) -> list:
        it = self._iters.get(s)
        if it is None:
            it = self._iters[s] = iter(self._fn(s, self._offset[s]))
        records = list(itertools.islice(it, wanted))
        self._offset[s] += len(records)
        if len(records) < wanted or (self._limit is not None and self._offset[s] >= self._limit):
            self._done.add(s)
            self._iters.pop(s, None)
        return records

    def snapshot(self) -> dict:
        return {str(s): k for s, k in self._offset.items()}

    def close(self) -> None:
        for it in self._iters.values():
            close = getattr(it, "close", None)
            if close is not None:
                close()
        self._iters.clear()
