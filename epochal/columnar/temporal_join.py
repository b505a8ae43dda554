"""The vectorized event-time temporal join of Arrow batches:
``probes.key_by("k").temporal_join(table.key_by("k"), how="inner" | "left", is_delete="column")
.apply(name)`` when both inputs carry batches and event time in a column.

Semantics are the record path's (:mod:`epochal.joins.temporal`): each probe row comes out,
once the watermark passes its time ``t``, beside the version of its key that was current at
``t`` — the latest version at or before ``t`` (a version at the probe's own time counts; of
two versions at one time, the one that arrived later wins). No version, or a deletion (the
``is_delete`` column true): the probe comes out with nulls for the table's columns if the
join is ``"left"``, else not at all. A null key matches nothing (as in the other joins of
batches and SQL). Every version at or before ``t`` has arrived by then,
because one still to come has ``t`` after the watermark (or is late).

What is vectorized is how probes meet versions. Probes wait in their buffer; when the
watermark passes some, :func:`current_versions` finds all their versions in one sort of the
due probes and the versions of the keys they name (O((p + v) log(p + v)) per watermark that
makes probes due, v only the named keys' versions), and the joined rows come out at once.
Versions older than the newest one at or before the watermark can be seen by no probe still
to come (its ``t`` is after the watermark) and are dropped by :func:`superseded` — whenever
the versions' buffer has doubled since it was last pruned, so pruning costs O(1) per version
amortized, and a key deleted at or before the watermark with nothing after goes entirely.

The operator is :class:`~epochal.columnar.joins.ColumnJoinOperator` with probes as side 0 and
versions as side 1: the same buffers, incremental segment snapshots, floors, late rows
(``.late("left")`` / ``.late("right")``) and output columns (the probe's, then the version's
without its key column, a shared name suffixed with ``right_suffix``). ``ttl`` is not
vectorized (refused at build time, naming the record path).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.joins import ID, T, ColumnJoinOperator, _column
from epochal.columnar.matching import key_codes

__all__ = ["ColumnTemporalJoinOperator", "current_versions", "superseded"]

#: the versions' buffer is pruned when it holds at least this many rows and twice as many as
#: after the last pruning (``prune_from`` on an operator overrides it — for tests)
PRUNE_FROM = 256


def current_versions(probe_keys: pa.Array, probe_t: np.ndarray, version_keys: pa.Array, version_t: np.ndarray,
                     version_order: np.ndarray) -> np.ndarray:
    """For each probe, the position of the latest version of its key at or before its time
    (``-1``: none). ``version_order`` orders versions of one time: the higher, the later it
    arrived (it wins). Pure; one sort of probes and versions together."""
    n_p, n_v = len(probe_t), len(version_t)
    found = np.full(n_p, -1, np.int64)
    if not n_p or not n_v:
        return found
    pk, vk = key_codes(probe_keys, version_keys)
    code = np.concatenate([pk, vk])
    time = np.concatenate([probe_t, version_t])
    kind = np.concatenate([np.ones(n_p, np.int8), np.zeros(n_v, np.int8)])  # a version before a probe of its time
    order = np.concatenate([np.zeros(n_p, np.int64), np.asarray(version_order, np.int64)])
    s = np.lexsort((order, kind, time, code))
    is_version = kind[s] == 0
    last = np.maximum.accumulate(np.where(is_version, np.arange(len(s)), -1))  # the latest version so far
    probe_at = np.flatnonzero(~is_version)
    j = last[probe_at]
    ok = j >= 0
    ok[ok] = code[s[j[ok]]] == code[s[probe_at[ok]]]  # the same key
    found[s[probe_at[ok]]] = s[j[ok]] - n_p
    return found


def superseded(version_keys: pa.Array, version_t: np.ndarray, version_order: np.ndarray, wm: int,
               deleted: np.ndarray | None) -> np.ndarray:
    """Which versions no probe after ``wm`` can see: those older than their key's newest
    version at or before ``wm``, and that newest one too when it is a deletion with no
    version after it (the key then has no table). Pure."""
    n = len(version_t)
    gone = np.zeros(n, bool)
    if not n:
        return gone
    (code,) = key_codes(version_keys)
    s = np.lexsort((np.asarray(version_order, np.int64), version_t, code))
    c, past = code[s], version_t[s] <= wm
    same_next = np.zeros(n, bool)
    same_next[:-1] = c[1:] == c[:-1]
    next_past = np.zeros(n, bool)
    next_past[:-1] = past[1:]
    drop = past & same_next & next_past  # a newer version at or before wm follows it
    if deleted is not None:
        drop |= past & ~same_next & deleted[s]  # the key's last version: a deletion, already current
    drop |= c < 0  # a null key: no probe matches it
    gone[s] = drop
    return gone


class ColumnTemporalJoinOperator(ColumnJoinOperator):
    """The temporal join of Arrow batches (module docstring): probes on input 0, the
    table's versions on input 1."""

    def __init__(self, ctx, spec, first_inputs: int):
        super().__init__(ctx, spec, first_inputs)
        self.pruned_rows = 0  # versions buffered after the last pruning
        self.prune_from = PRUNE_FROM

    def _on_time(self, side: int, batch: pa.RecordBatch) -> pa.Table | None:
        column = self.spec.deleted
        if side == 1 and column is not None:
            field = batch.schema.field(column) if column in batch.schema.names else None
            if field is None or not pa.types.is_boolean(field.type):
                got = "has no such column" if field is None else f"has it as {field.type}"
                raise ValueError(f"temporal join {self.ctx.operator!r}: is_delete={column!r} names a boolean column "
                                 f"of the table's rows, and a batch of them {got} (columns {batch.schema.names})")
        return super()._on_time(side, batch)

    def on_watermark(self, watermark: int) -> list:
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        out = []
        if self.buffers[0] is not None and self.due[0] <= watermark and not self._held(0, watermark):
            out = self._emit(watermark)
        versions = self.buffers[1]
        if versions is not None and versions.num_rows >= max(self.prune_from, 2 * self.pruned_rows):
            self._prune(versions, watermark)
        return out

    def _deleted(self, versions: pa.Table) -> np.ndarray | None:
        column = self.spec.deleted
        if column is None:
            return None
        return _column(versions, column).fill_null(False).to_numpy(zero_copy_only=False).astype(bool)

    def _emit(self, wm: int) -> list:
        """The due probes (``t <= wm``) beside their current versions; drops them."""
        probes = self.buffers[0]
        assert probes is not None  # (on_watermark calls this only with probes buffered)
        t = _column(probes, T).to_numpy()
        due = t <= wm
        ready = probes.filter(pa.array(due))
        self._drop(0, probes, due, t)
        versions, n = self.buffers[1], ready.num_rows
        pos = np.full(n, -1, np.int64)
        if versions is not None and versions.num_rows:
            keys = _column(ready, self.spec.keys[0])
            vkeys = _column(versions, self.spec.keys[1])
            named = np.flatnonzero(pc.is_in(vkeys, value_set=pc.unique(keys.cast(vkeys.type)))
                                   .to_numpy(zero_copy_only=False))
            if len(named):
                sub = versions.take(pa.array(named))
                found = current_versions(keys, _column(ready, T).to_numpy(), _column(sub, self.spec.keys[1]),
                                         _column(sub, T).to_numpy(), _column(sub, ID).to_numpy())
                hit = found >= 0
                pos[hit] = named[found[hit]]
                deleted = self._deleted(versions)
                if deleted is not None:
                    pos[hit & deleted[np.maximum(pos, 0)]] = -1
        hit = pos >= 0
        if self.spec.outer[0]:
            right = pa.array(pos, pa.int64(), mask=~hit) if versions is not None else pa.nulls(n, pa.int64())
            positions = (np.arange(n), right)
        else:
            if not hit.any():
                return []
            positions = (np.flatnonzero(hit), pos[hit])
        return [self._assemble((ready, versions), positions)]

    def _prune(self, versions: pa.Table, wm: int) -> None:
        gone = superseded(_column(versions, self.spec.keys[1]), _column(versions, T).to_numpy(),
                          _column(versions, ID).to_numpy(), wm, self._deleted(versions))
        if gone.any():
            self._drop(1, versions, gone, _column(versions, T).to_numpy())
        self.pruned_rows = self.buffers[1].num_rows if self.buffers[1] is not None else 0
