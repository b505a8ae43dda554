"""``Lookup``: the function a pipeline author passes to ``flat_map`` to enrich records from a
table (:mod:`epochal.lookup`), and ``LookupTable``, what a table must answer."""
from __future__ import annotations

from typing import Any, Callable

from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.lookup.cache import MISSING, LookupCache
from epochal.time.units import duration_micros

__all__ = ["Lookup", "LookupTable"]


class LookupTable:
    """A table read by key. ``fetch`` is called in a task process (open connections lazily
    there: the object is pickled to the tasks) with the keys the cache lacks; it returns
    ``{key: row}`` for the keys the table has. Should be idempotent and read-only."""

    def fetch(self, keys: list) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (the task ends). Idempotent."""


def _both(record, row) -> tuple:
    return (record, row)


def _seconds(value, what: str) -> float | None:
    if value is None:
        return None
    try:
        return duration_micros(value, what) / 1_000_000
    except ConfigError as exc:
        raise PipelineDefinitionError(str(exc)) from None


class Lookup:
    """``flat_map`` function: each record with the row of ``key(record)`` in ``table``,
    as ``combine(record, row)`` (``(record, row)`` by default).

    ``how="left"``: a key the table lacks gives ``combine(record, None)``; ``"inner"``: the
    record is dropped. Rows go through a :class:`~epochal.lookup.cache.LookupCache` of
    ``max_entries`` keys per task, re-read ``refresh_after`` (a duration; ``None``: never)
    after they were read; a key found missing is asked again after ``missing_after``
    (default: ``refresh_after``). Not part of the exactly-once cut (see :mod:`epochal.lookup`).
    """

    def __init__(self, table: LookupTable, key: Callable, *, combine: Callable = _both, how: str = "left",
                 max_entries: int = 10_000, refresh_after="60s", missing_after=None):
        if not isinstance(table, LookupTable):
            raise PipelineDefinitionError(f"Lookup: table must be a LookupTable (e.g. PostgresTable), got {table!r}")
        if not callable(key) or not callable(combine):
            raise PipelineDefinitionError("Lookup: key and combine must be functions")
        if how not in ("left", "inner"):
            raise PipelineDefinitionError(f"Lookup: how must be 'left' or 'inner', got {how!r}")
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
            raise PipelineDefinitionError(f"Lookup: max_entries must be a positive integer, got {max_entries!r}")
        self.table, self.key, self.combine, self.inner = table, key, combine, how == "inner"
        self.max_entries = max_entries
        self.refresh_after = _seconds(refresh_after, "Lookup: refresh_after")
        self.missing_after = _seconds(missing_after, "Lookup: missing_after")
        self.cache: LookupCache | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["cache"] = None  # each task starts with its own, empty
        return state

    def row(self, key) -> Any:
        """The row of ``key`` (``None``: none), from the cache or the table."""
        cache = self.cache
        if cache is None:
            cache = self.cache = LookupCache(self.max_entries, self.refresh_after, self.missing_after)
        row = cache.get(key)
        if row is MISSING:
            row = self.table.fetch([key]).get(key)
            cache.put(key, row)
        return row

    def __call__(self, record) -> list:
        row = self.row(self.key(record))
        if row is None and self.inner:
            return []
        return [self.combine(record, row)]
