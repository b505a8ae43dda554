"""An index of one side of a columnar interval join's buffer, for its probe
(:mod:`epochal.columnar.joins`): every input batch is matched on the key against the other
side's buffer, and a buffer holds all the rows of the join's time bound — a 1-day bound keeps a
day of rows. Scanning the buffer per batch (:func:`epochal.columnar.matching.equal_key_pairs`,
one ``is_in`` over it) made a probe O(buffer): 2.2 ms per 700-row batch against 175k
buffered rows, growing with the bound (Nexmark q3 at 32M events, whose buffers stay near
100k rows, did not change measurably; a join keeping hours of rows does).

:class:`KeyIndex` keeps ``(key, row id, time)`` of the buffered rows as **sorted runs**: a
batch added is one run sorted by key; runs of similar size are merged (the newest ``FANOUT``
when none is more than ``FANOUT`` times the newest), so there are O(log rows) runs and a row
is re-sorted O(log rows) times over its life. A probe sorts the batch's keys and finds each
key's range in every run with two ``searchsorted`` — O(batch × log buffer) (0.45 ms for the
same batch).

Rows dropped from the buffer (expired, see the join) stay in the runs until the index is
rebuilt (when they outnumber the live ones): :meth:`KeyIndex.pairs` may return ids that are
no longer buffered, and :class:`RowIds` tells which ids are (and where): the caller keeps
only those. The index is an in-memory cache: it is never snapshotted; a restored operator
rebuilds it from its restored buffers.

Keys are compared as int64: the index applies when both sides' keys are integer columns
(``uint64`` excluded: not every value fits); other keys (strings, bytes, booleans, floats)
keep the scan. Null keys are never indexed and never looked up (nulls never match).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["FANOUT", "KeyIndex", "RowIds", "int_keys", "comparable"]

#: runs merged at once: the newest FANOUT runs when none is more than FANOUT times the newest
FANOUT = 2
_EMPTY = np.zeros(0, np.int64)


def comparable(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether keys of types ``a`` and ``b`` compare equal exactly when their int64 values do."""
    return all(pa.types.is_integer(t) and t != pa.uint64() for t in (a, b))


def int_keys(array: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """``array`` (an integer key column) as int64 numpy values, and the mask of its non-null
    rows (``None``: no nulls; a null's value is 0 and must be masked out)."""
    if array.type != pa.int64():
        array = array.cast(pa.int64())
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        return array.fill_null(0).to_numpy(), valid
    return array.to_numpy(), None


class KeyIndex:
    """``(key, id, time)`` of one side's buffered rows, in sorted runs (module docstring)."""

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (keys sorted, ids, times)
        self.entries = 0  # rows in the runs, dropped ones included
        self.dropped = 0  # of which dropped from the buffer since the last rebuild

    def add(self, keys: np.ndarray, ids: np.ndarray, times: np.ndarray, valid: np.ndarray | None = None) -> None:
        """Rows just buffered (``valid``: those with a non-null key; the others are left out)."""
        if valid is not None:
            keys, ids, times = keys[valid], ids[valid], times[valid]
        if not len(keys):
            return
        order = np.argsort(keys, kind="stable")
        self.runs.append((keys[order], ids[order], times[order]))
        self.entries += len(keys)
        while len(self.runs) >= FANOUT and all(len(r[0]) <= FANOUT * len(self.runs[-1][0])
                                               for r in self.runs[-FANOUT:]):
            newest = self.runs[-FANOUT:]
            del self.runs[-FANOUT:]
            self.runs.append(_merge(newest))

    def rebuild(self, keys: np.ndarray, ids: np.ndarray, times: np.ndarray, valid: np.ndarray | None = None) -> None:
        """The index of exactly these rows (a restored buffer; one that lost most of its rows)."""
        self.runs, self.entries, self.dropped = [], 0, 0
        self.add(keys, ids, times, valid)

    def pairs(self, keys: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every indexed row whose key equals one of ``keys`` (a probing batch; ``valid``: its
        non-null keys): ``(batch positions, ids, times)``, one entry per pair, in no order.
        Ids of rows dropped since they were indexed may be among them."""
        if not self.runs or not len(keys):
            return _EMPTY, _EMPTY, _EMPTY
        order = np.flatnonzero(valid) if valid is not None else np.arange(len(keys))
        order = order[np.argsort(keys[order], kind="stable")]
        needles = keys[order]  # sorted: searchsorted walks each run once, in order
        positions, ids, times = [], [], []
        for run_keys, run_ids, run_times in self.runs:
            lo = np.searchsorted(run_keys, needles, "left")
            counts = np.searchsorted(run_keys, needles, "right") - lo
            total = int(counts.sum())
            if not total:
                continue
            # the i-th pair of a needle with k matches is run entry lo + 0 .. lo + k - 1
            at = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(total)
            positions.append(np.repeat(order, counts))
            ids.append(run_ids[at])
            times.append(run_times[at])
        if not positions:
            return _EMPTY, _EMPTY, _EMPTY
        return np.concatenate(positions), np.concatenate(ids), np.concatenate(times)

    def on_dropped(self, n: int) -> bool:
        """``n`` of the indexed rows left the buffer; whether the index should be rebuilt now
        (dropped entries outnumber the live ones)."""
        self.dropped += n
        return self.dropped > self.entries - self.dropped


def _merge(runs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = np.concatenate([r[0] for r in runs])
    order = np.argsort(keys, kind="stable")  # sorted runs: a merge for the stable sort
    return keys[order], np.concatenate([r[1] for r in runs])[order], np.concatenate([r[2] for r in runs])[order]


class RowIds:
    """The ids of one side's buffered rows in buffer order (ascending), kept contiguous as
    rows are added (amortized O(rows added): capacity doubles) — where an id from
    :meth:`KeyIndex.pairs` sits in the buffer, if it is still there."""

    def __init__(self) -> None:
        self._ids = _EMPTY
        self.n = 0

    def reset(self, ids: np.ndarray) -> None:
        self._ids, self.n = np.array(ids, np.int64), len(ids)

    def append(self, ids: np.ndarray) -> None:
        need = self.n + len(ids)
        if need > len(self._ids):
            grown = np.empty(max(need, 2 * len(self._ids), 1024), np.int64)
            grown[:self.n] = self._ids[:self.n]
            self._ids = grown
        self._ids[self.n:need] = ids
        self.n = need

    def keep(self, mask: np.ndarray) -> None:
        """Only the rows ``mask`` selects stay (the buffer dropped the others), in order."""
        self._ids = self._ids[:self.n][mask]  # a fresh array: one copy
        self.n = len(self._ids)

    def positions(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, present)``: where each of ``ids`` is in the buffer, and whether it is
        there at all (a dropped row's id is not)."""
        live = self._ids[:self.n]
        pos = np.searchsorted(live, ids)
        present = pos < self.n
        present[present] = live[pos[present]] == ids[present]
        return pos, present
