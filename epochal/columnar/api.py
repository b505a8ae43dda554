"""The small callables behind the columnar stream helpers (``filter``, ``select``,
``with_column`` on streams of Arrow batches): picklable, named in errors."""
from __future__ import annotations

from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from epochal.errors import PipelineDefinitionError

__all__ = ["Filter", "Select", "WithColumn"]


class Filter:
    """Keep the rows where a ``pyarrow.compute.Expression`` holds, or where ``fn(batch)``
    (a boolean array) is true."""

    def __init__(self, predicate):
        self.predicate = predicate

    @classmethod
    def of(cls, name: str, predicate) -> "Filter":
        if not isinstance(predicate, pc.Expression) and not callable(predicate):
            raise PipelineDefinitionError(
                f"filter {name!r} on Arrow batches: expected a pyarrow.compute expression (e.g. pc.field('n') > 3) or "
                f"a function batch -> boolean array, got {predicate!r}")
        return cls(predicate)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        p = self.predicate
        return batch.filter(p if isinstance(p, pc.Expression) else p(batch))


class Select:
    def __init__(self, columns: tuple[str, ...]):
        self.columns = list(columns)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.select(self.columns)


class WithColumn:
    def __init__(self, column: str, fn: Callable):
        self.column, self.fn = column, fn

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        values = self.fn(batch)
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if not isinstance(values, pa.Array):
            values = pa.array([values] * batch.num_rows) if not isinstance(values, pa.Scalar) else \
                pa.array([values.as_py()] * batch.num_rows, values.type)
        names = batch.schema.names
        if self.column in names:
            i = names.index(self.column)
            return batch.set_column(i, self.column, values)
        return batch.append_column(self.column, values)
