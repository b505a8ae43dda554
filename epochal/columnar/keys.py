"""Key groups of whole Arrow batches: the columnar half of ``key_by`` (seed 004 §4.2.1).

A row's key group is the record path's: :func:`~epochal.backends.keygroups.key_group_for`
of its key's Python value — so a key lands on the same subtask whichever kind of stream
carries it, and keyed state, checkpoints and rescaling do not care. Per batch the hash runs
once per *distinct* key: the key column is dictionary-encoded, its dictionary hashed in
Python (through a bounded cache), and the per-row key groups are one ``take``. An integer
key column without nulls (int8–int64, uint8–uint32) is hashed row by row in numpy instead
(:func:`~epochal.backends.keygroups.key_groups_of_int64`: the MurmurHash3 finalizer that
:func:`~epochal.backends.keygroups.stable_hash` applies to 64-bit integers), for ids, where
nearly every key is distinct, the dictionary saves nothing.

    >>> import pyarrow as pa
    >>> b = pa.record_batch({"word": ["a", "b", "a"]})
    >>> groups = KeyGroups("word", 128)
    >>> from epochal.backends.keygroups import key_group_for
    >>> groups.of(b).to_pylist() == [key_group_for(w, 128) for w in ["a", "b", "a"]]
    True
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.backends.keygroups import KeyGroupAssigner, key_groups_of_int64

#: integer key types whose every value is a signed 64-bit integer (uint64 is not: its keys
#: past 2**63 - 1 hash another way)
_SIGNED_64 = frozenset((pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()))

__all__ = ["ColumnKey", "KeyGroups", "split_by_channel"]


class ColumnKey:
    """The partitioning key of ``key_by("column")`` on a stream of Arrow batches.

    Routers and restores recognise it and route whole batches; called on a single record
    (a row as a dict, e.g. after ``to_records``) it returns that row's key.
    """

    __slots__ = ("column",)

    def __init__(self, column: str):
        self.column = column

    def __call__(self, row):
        return row[self.column]

    def __reduce__(self):
        return ColumnKey, (self.column,)

    def __eq__(self, other):
        return type(other) is ColumnKey and other.column == self.column

    def __hash__(self):
        return hash(("ColumnKey", self.column))

    def __repr__(self):
        return f"ColumnKey({self.column!r})"


class KeyGroups:
    """Per-row key groups of one key column (see the module docstring)."""

    def __init__(self, column: str, max_parallelism: int):
        self.column = column
        self.max_parallelism = max_parallelism
        self._assigner = KeyGroupAssigner(max_parallelism)  # the record path's, memo and all

    def of_values(self, values: list) -> list[int]:
        """Key groups of distinct Python key values."""
        return self._assigner.assign_all(values)

    def encode(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        """``(distinct keys, per-row index into them)`` of ``batch``'s key column."""
        try:
            column = batch.column(self.column)
        except KeyError:
            raise KeyError(f"key column {self.column!r} is not in the batch (columns: {batch.schema.names})") from None
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column, null_encoding="encode")
        return column.dictionary, column.indices

    def of(self, batch: pa.RecordBatch) -> pa.Array:
        """The key group of every row (int32)."""
        column = batch.column(self.column) if self.column in batch.schema.names else None
        if column is not None and column.type in _SIGNED_64 and not column.null_count:
            # integer keys: the record path's hash of each row in numpy, no per-key Python
            # (equal to key_group_for: stable_hash takes the same MurmurHash3 path for them)
            return pa.array(key_groups_of_int64(column.to_numpy().astype(np.int64), self.max_parallelism), pa.int32())
        dictionary, indices = self.encode(batch)
        kgs = pa.array(self.of_values(dictionary.to_pylist()), pa.int32())
        return kgs.take(indices)


def split_by_channel(batch: pa.RecordBatch, channels: pa.Array, n: int) -> list[tuple[int, pa.RecordBatch]]:
    """``(channel, rows of batch for it)`` for every channel that gets rows, in channel
    order; ``channels`` holds each row's channel (``0 <= c < n``). Row order is kept."""
    if n == 1:
        return [(0, batch)] if batch.num_rows else []
    counts = pc.value_counts(channels)
    present = sorted(counts.field("values").to_pylist())
    if len(present) == 1:
        return [(present[0], batch)]
    return [(c, batch.filter(pc.equal(channels, c))) for c in present]


def rows(records: list) -> int:
    """How many records ``records`` holds: its length, or for Arrow batches their rows."""
    if records and type(records[0]) is pa.RecordBatch:
        return sum(b.num_rows for b in records)
    return len(records)
