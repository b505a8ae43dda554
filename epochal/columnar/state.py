"""The keyed state of a columnar aggregate, merged a whole epoch of partials at a time.

One merge takes a *partial table* — one row per key, the partial columns of every
aggregation (:mod:`epochal.columnar.partials`) — and returns the same keys with their
accumulators after the merge (what the aggregate emits). Two layouts, one per kind of
backend, both keyed by key group (seed 004 §4.2.1) so that snapshots, restores and
rescaling are the backends' own:

* :class:`BlockState` (heap backend: values stay Python objects in memory) — per key group
  one immutable :class:`KeyBlock`, the keys and accumulator columns of every key of that
  group, stored as the value ``"<operator>/blocks"`` → ``{kg: KeyBlock}``. A merge looks
  up all of an epoch's keys in the touched blocks at once (Arrow's hash ``index_in``), merges
  the matched accumulators column-wise, appends the new keys and writes each touched key
  group's new block with one ``put`` — no per-key Python for the built-in aggregations;
  the cost is linear in the rows of the touched key groups. A snapshot pickles a block as
  one Arrow IPC message (plus the object column of a user aggregation).
* :class:`EntryState` (RocksDB) — one entry per key, ``"<operator>/acc"`` → the tuple of its
  accumulators (the layout of earlier versions): a merge reads every key of the epoch with
  one ``get_many`` (RocksDB ``multi_get``), merges column-wise and writes them back with one
  ``put_many`` (a ``WriteBatch``), so state that outgrows memory stays on disk.

A restore converts what the snapshot holds into the backend's layout (a heap snapshot into
RocksDB, or the other way round, or the per-key entries of an older version into blocks):
:meth:`BlockState.restore` / :meth:`EntryState.restore`, once, before the first record.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.keys import KeyGroups
from epochal.columnar.partials import PartialPlan

__all__ = ["BlockState", "EntryState", "KeyBlock", "keyed_state"]


# ------------------------------------------------------------------- column helpers
def _take(column, indices: np.ndarray):
    if isinstance(column, np.ndarray):
        return column[indices]
    return column.take(pa.array(indices, pa.int64()))


def _concat(columns: list):
    if isinstance(columns[0], np.ndarray):
        return np.concatenate(columns)
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    if len({a.type for a in arrays}) > 1:
        # to the type with the fewest null parts: accumulators restored from Python values
        # (per-key entries) have null types where every value was None
        target = min(arrays, key=lambda a: _null_parts(a.type)).type
        arrays = [a.cast(target) for a in arrays]
    return pa.concat_arrays(arrays)


def _null_parts(t: pa.DataType) -> int:
    """How many parts of type ``t`` (itself, its fields, its items) are the null type."""
    if t == pa.null():
        return 1
    return sum(_null_parts(t.field(i).type) for i in range(t.num_fields)) if pa.types.is_nested(t) else 0


class KeyBlock:
    """The keys of one key group and their accumulator columns, flat over the
    aggregations (``widths``: columns per aggregation). Immutable: a merge makes a new
    block, so a pending snapshot can hold the old one without copying."""

    __slots__ = ("keys", "accs", "widths")

    def __init__(self, keys: pa.Array, accs, widths):
        self.keys = keys
        self.accs = tuple(accs)
        self.widths = tuple(widths)

    def __len__(self) -> int:
        return len(self.keys)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        arrow = [i for i, c in enumerate(self.accs) if not isinstance(c, np.ndarray)]
        batch = pa.RecordBatch.from_arrays([self.keys] + [self.accs[i] for i in arrow],
                                           names=[str(i) for i in range(len(arrow) + 1)])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:  # only the rows of a slice, unlike pickle
            writer.write_batch(batch)
        objects = {i: c for i, c in enumerate(self.accs) if isinstance(c, np.ndarray)}
        return _load_block, (sink.getvalue().to_pybytes(), self.widths, objects)

    def entries(self) -> list[tuple[Any, tuple]]:
        """``(key, accumulators)`` per key — one accumulator per aggregation, a tuple for
        the multi-column ones — as :class:`EntryState` stores them (and
        :func:`epochal.state.read` shows them)."""
        columns = [list(c) if isinstance(c, np.ndarray) else c.to_pylist() for c in self.accs]
        per_agg, pos = [], 0
        for w in self.widths:
            per_agg.append(columns[pos] if w == 1 else list(zip(*columns[pos:pos + w])))
            pos += w
        return list(zip(self.keys.to_pylist(), zip(*per_agg))) if per_agg else []

    def __repr__(self) -> str:
        return f"KeyBlock({len(self)} keys)"


def _load_block(ipc: bytes, widths: tuple, objects: dict) -> KeyBlock:
    batch = pa.ipc.open_stream(ipc).read_next_batch()
    arrow = iter(batch.columns[1:])
    return KeyBlock(batch.column(0), [objects[i] if i in objects else next(arrow) for i in range(sum(widths))],
                    widths)


def _block_of(entries: list, plan: PartialPlan) -> KeyBlock:
    """A block from ``(key, accumulators)`` entries (a restore of per-key state)."""
    keys = pa.array([k for k, _ in entries])
    columns = []
    for j, agg in enumerate(plan.aggs):
        columns += agg.columns_of([acc[j] for _, acc in entries])
    return KeyBlock(keys, columns, [a.width for a in plan.aggs])


# ------------------------------------------------------------------------- layouts
class _State:
    def __init__(self, backend, operator: str, plan: PartialPlan, key_groups: range, max_parallelism: int):
        self.backend = backend
        self.plan = plan
        self.key_groups = key_groups
        self.groups = KeyGroups(plan.key, max_parallelism)
        self.blocks_state = f"{operator}/blocks"
        self.entries_state = f"{operator}/acc"

    def key_groups_of(self, keys: pa.Array) -> np.ndarray:
        return np.asarray(self.groups.of_values(keys.to_pylist()), dtype=np.int32)

    def _merge_rows(self, old: list, partial: list) -> list:
        """Flat accumulator columns of matched keys after merging their partials."""
        out = []
        for agg, a, p in zip(self.plan.aggs, self.plan.split(old), self.plan.split(partial)):
            out += agg.merge(a, p)
        return out

    def _init_rows(self, partial: list) -> list:
        out = []
        for agg, p in zip(self.plan.aggs, self.plan.split(partial)):
            out += agg.init(p)
        return out


class BlockState(_State):
    """Accumulators as one :class:`KeyBlock` per key group (see the module docstring)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.blocks: dict[int, KeyBlock] = {}

    def restore(self) -> None:
        """Load the blocks of the restored key groups; per-key entries (a RocksDB snapshot
        or an older version's) become blocks. Task thread, before the first record."""
        backend, names = self.backend, self.backend.state_names()
        if self.blocks_state in names:
            for kg in self.key_groups:
                block = backend.get(self.blocks_state, kg, kg)
                if block is not None:
                    self.blocks[kg] = block
        if self.entries_state in names:
            for kg in self.key_groups:
                entries = backend.value_items(self.entries_state, kg)
                if entries:
                    block = _block_of(entries, self.plan)
                    if kg in self.blocks:
                        old = self.blocks[kg]
                        block = KeyBlock(_concat([old.keys, block.keys]),
                                         [_concat([a, b]) for a, b in zip(old.accs, block.accs)], block.widths)
                    self.blocks[kg] = block
                    backend.put(self.blocks_state, kg, kg, block)
            backend.drop_state(self.entries_state)

    def merge(self, partials: pa.Table) -> tuple[pa.Array, list]:
        """Merge one partial row per key into the blocks; returns the keys and their
        accumulator columns after the merge (matched keys first, then new ones)."""
        keys = partials.column(0).combine_chunks()
        partial = [c.combine_chunks() for c in partials.columns[1:]]
        kgs = self.key_groups_of(keys)
        touched = np.unique(kgs)
        present = [(kg, self.blocks[kg]) for kg in touched.tolist() if kg in self.blocks]
        n_old = sum(len(b) for _, b in present)
        if n_old:
            old_keys = _concat([b.keys for _, b in present])
            old_accs = [_concat([b.accs[i] for _, b in present]) for i in range(len(partial))]
            old_kgs = np.repeat(np.array([kg for kg, _ in present], np.int32), [len(b) for _, b in present])
            if old_keys.type != keys.type:
                keys = keys.cast(old_keys.type)
            pos = pc.fill_null(pc.index_in(keys, value_set=old_keys), -1).to_numpy()
        else:
            old_keys, old_accs, old_kgs = None, [], np.empty(0, np.int32)
            pos = np.full(len(keys), -1, np.int32)
        hit = np.flatnonzero(pos >= 0)
        miss = np.flatnonzero(pos < 0)
        at = pos[hit].astype(np.int64)
        merged = self._merge_rows([_take(c, at) for c in old_accs], [_take(c, hit) for c in partial]) if len(hit) \
            else []
        fresh = self._init_rows([_take(c, miss) for c in partial]) if len(miss) else []
        # the touched groups' rows after the merge: old rows (updated ones replaced) + new keys
        index = np.arange(n_old, dtype=np.int64)
        index[at] = n_old + np.arange(len(at), dtype=np.int64)
        index = np.concatenate([index, n_old + len(at) + np.arange(len(miss), dtype=np.int64)])
        parts = [[c] for c in old_accs] if n_old else [[] for _ in partial]
        for i in range(len(partial)):
            parts[i] += ([merged[i]] if len(hit) else []) + ([fresh[i]] if len(miss) else [])
        rows = [_concat(p) for p in parts]
        all_keys = _concat(([old_keys] if n_old else []) + [_take(keys, miss)]) if len(miss) or n_old else keys
        all_kgs = np.concatenate([old_kgs, kgs[miss]])
        order = np.argsort(all_kgs, kind="stable")
        sorted_kgs = all_kgs[order]
        starts = np.searchsorted(sorted_kgs, touched, "left")
        ends = np.searchsorted(sorted_kgs, touched, "right")
        backend, name, widths = self.backend, self.blocks_state, [a.width for a in self.plan.aggs]
        for kg, s, e in zip(touched.tolist(), starts.tolist(), ends.tolist()):
            rows_of_kg = index[order[s:e]]  # positions in rows (old rows, merged rows, fresh rows)
            key_of_kg = order[s:e]  # positions in all_keys (old keys, then new keys)
            block = KeyBlock(_take(all_keys, key_of_kg), [_take(r, rows_of_kg) for r in rows], widths)
            self.blocks[kg] = block
            backend.put(name, kg, kg, block)
        out_keys = _concat([_take(keys, hit), _take(keys, miss)])
        out = [_concat(([merged[i]] if len(hit) else []) + ([fresh[i]] if len(miss) else []))
               for i in range(len(partial))]
        return out_keys, out


class EntryState(_State):
    """Accumulators as one entry per key, read and written in batches (module docstring)."""

    def restore(self) -> None:
        """Blocks of a heap snapshot become per-key entries. Task thread, before the first
        record."""
        backend = self.backend
        if self.blocks_state not in backend.state_names():
            return
        for kg in self.key_groups:
            block = backend.get(self.blocks_state, kg, kg)
            if block is not None and len(block):
                entries = block.entries()
                backend.put_many(self.entries_state, [kg] * len(entries), [k for k, _ in entries],
                                 [acc for _, acc in entries])
        backend.drop_state(self.blocks_state)

    def merge(self, partials: pa.Table) -> tuple[pa.Array, list]:
        """As :meth:`BlockState.merge`, one ``get_many`` and one ``put_many``."""
        keys = partials.column(0).combine_chunks()
        partial = [c.combine_chunks() for c in partials.columns[1:]]
        pykeys = keys.to_pylist()
        kgs = self.groups.of_values(pykeys)
        olds = self.backend.get_many(self.entries_state, kgs, pykeys)
        hit = np.array([i for i, o in enumerate(olds) if o is not None], np.int64)
        miss = np.array([i for i, o in enumerate(olds) if o is None], np.int64)
        columns = []
        if len(hit):
            found = [olds[i] for i in hit.tolist()]
            like = self.plan.split([_take(c, hit) for c in partial])
            old_cols = []
            for j, agg in enumerate(self.plan.aggs):
                old_cols += agg.columns_of([acc[j] for acc in found], like[j])
            merged = self._merge_rows(old_cols, [_take(c, hit) for c in partial])
        fresh = self._init_rows([_take(c, miss) for c in partial]) if len(miss) else []
        for i in range(len(partial)):
            columns.append(_concat(([merged[i]] if len(hit) else []) + ([fresh[i]] if len(miss) else [])))
        out_keys = _concat([_take(keys, hit), _take(keys, miss)])
        order = np.concatenate([hit, miss])
        per_agg = [agg.values(cols) for agg, cols in zip(self.plan.aggs, self.plan.split(columns))]
        self.backend.put_many(self.entries_state, [kgs[i] for i in order.tolist()],
                              [pykeys[i] for i in order.tolist()], list(zip(*per_agg)))
        return out_keys, columns


def keyed_state(backend, operator: str, plan: PartialPlan, key_groups: range, max_parallelism: int):
    """The layout for ``backend``: blocks where values stay objects in memory
    (``backend.keeps_objects``), per-key entries otherwise."""
    cls = BlockState if getattr(backend, "keeps_objects", False) else EntryState
    return cls(backend, operator, plan, key_groups, max_parallelism)
