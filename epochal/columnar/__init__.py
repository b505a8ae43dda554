"""Columnar streams: ``pyarrow.RecordBatch``es end to end (the fast path, DESIGN.md
"Records on the wire").

A stream carries Arrow batches when its source has a ``schema`` (``ArrowFileSource``,
``GeneratorSource(..., schema=)``, ``CollectionSource(..., schema=)``) or after
``to_batches``. On such a stream: ``map_batches``, ``filter`` (a ``pyarrow.compute``
expression), ``select``, ``with_column``, ``key_by("column")`` — whole batches routed by key
group, hashed once per distinct key (:mod:`epochal.columnar.keys`) — then
``.aggregate(name, n=count(), ...)`` (:mod:`epochal.columnar.aggregates`; selections such as
``arg_max`` and ``top_k``: :mod:`epochal.columnar.selections`; user aggregations over Arrow
batches: :mod:`epochal.columnar.accumulators`), sinks (Parquet
row groups straight from the batches), and ``to_records``. Batches cross channels as Arrow
IPC (:func:`epochal.runtime.transport.channels.encode_batch`). Exactly-once, snapshots, rescaling and
loops are the record path's: a batch is one element of the engine's record lists.
"""
from epochal.columnar.accumulators import BatchAggregateFunction, aggregate_batches
from epochal.columnar.aggregates import ColumnAggregateFunction, aggregate, count, max, mean, min, sum
from epochal.columnar.selections import arg_max, arg_min, count_distinct, first, last, top_k
from epochal.columnar.sketches import approx_count_distinct
from epochal.columnar.sources import ArrowFileSource

__all__ = ["ArrowFileSource", "BatchAggregateFunction", "ColumnAggregateFunction", "aggregate", "aggregate_batches",
           "approx_count_distinct", "arg_max", "arg_min", "count", "count_distinct", "first", "last", "max", "mean", "min", "sum", "top_k"]
