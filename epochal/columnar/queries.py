"""Queryable results of the columnar keyed aggregate (seed 004 §4.3.1, :mod:`epochal.query`).

``key_by("word").aggregate("counts", n=count(), bytes=sum("size"), queryable=True)``
serves state ``"results"`` of operator ``counts``: a lookup of a key returns
``{"n": ..., "bytes": ...}`` — one entry per aggregation, the value the aggregate would
emit for the key (``mean`` as a float, a user aggregation's ``result(acc)``) — or ``None``
for a key it has not seen.

The aggregate merges each epoch's partials into keyed state *before* the epoch's barrier
(:meth:`~epochal.columnar.operators.KeyedAggregateOperator.prepare_snapshot_pre_barrier`),
so a version pinned at the barrier holds every row of the epoch's cut. The reader looks the
key up in whichever layout the backend keeps (:mod:`epochal.columnar.state`): the key
group's immutable :class:`~epochal.columnar.state.KeyBlock` (heap; one search of the
block's key column) or the key's entry (RocksDB; one point read).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.partials import PartialPlan
from epochal.query.readers import StateReader

__all__ = ["AggregateResultsReader"]


class AggregateResultsReader(StateReader):
    """Reads a key's results from the aggregate's blocks or entries (module docstring)."""

    kind = "aggregate"

    def __init__(self, operator: str, plan: PartialPlan):
        self.blocks, self.entries = f"{operator}/blocks", f"{operator}/acc"
        self.states = (self.blocks, self.entries)
        self.plan = plan

    def read(self, source, kg, key, mark):
        accs = source.get(self.entries, kg, key, None)
        if accs is None:
            block = source.get(self.blocks, kg, kg, None)
            accs = None if block is None else _accumulators(block, key)
        if accs is None:
            return None
        out = {}
        for name, agg, acc in zip(self.plan.names, self.plan.aggs, accs):
            out[name] = agg.result(agg.columns_of([acc])).to_pylist()[0]
        return out


def _accumulators(block, key) -> tuple | None:
    """``key``'s accumulators in ``block`` (one per aggregation, a tuple for the
    multi-column ones, as :meth:`KeyBlock.entries` gives them), or ``None``."""
    try:
        at = pc.index(block.keys, pa.scalar(key, block.keys.type)).as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None  # not a value of the key column's type: not a key of this aggregate
    if at < 0:
        return None
    columns = [c[at] if not isinstance(c, pa.Array) else c[at].as_py() for c in block.accs]
    out, pos = [], 0
    for width in block.widths:
        out.append(columns[pos] if width == 1 else tuple(columns[pos:pos + width]))
        pos += width
    return tuple(out)
