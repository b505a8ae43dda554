"""``DeltaLookupTable``: a Delta table read by key, for lookup enrichment
(:mod:`epochal.lookup`; outside the exactly-once cut)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from epochal.connectors.delta.client import arrow_schema, check_storage_options, check_uri, require_table
from epochal.errors import ConfigError, DataError
from epochal.lookup.api import LookupTable

__all__ = ["DeltaLookupTable"]


class DeltaLookupTable(LookupTable):
    """Rows of the Delta table at ``uri`` by ``key_column``: each row a dict of ``columns``
    (all by default). The table is opened in each task at its first fetch; every later fetch
    first reads the commits made since (``update_incremental``), so a key the cache re-reads
    gets the table's latest version. The key must be unique in the table: two rows of one
    key fail the fetch with a :class:`~epochal.errors.DataError` naming it.

    Raises (at the first fetch):
        ConfigError: no table at ``uri``, or ``key_column`` / ``columns`` not in its schema.
    """

    def __init__(self, uri: str, key_column: str, columns: list[str] | None = None, *,
                 storage_options: dict | None = None):
        what = f"DeltaLookupTable({uri!r})"
        self.uri = check_uri(uri, what)
        self.storage_options = check_storage_options(storage_options, what)
        if not isinstance(key_column, str) or not key_column:
            raise ConfigError(f"{what}: key_column must be a column name, got {key_column!r}")
        if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
            raise ConfigError(f"{what}: columns must be a list of column names, got {columns!r}")
        self.what, self.key_column, self.columns = what, key_column, None if columns is None else list(columns)
        self._dt = None
        self._names: list[str] = []
        self._key_type: pa.DataType | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_dt"] = None  # each task opens the table itself
        return state

    def _open(self):
        dt = require_table(self.uri, self.storage_options, self.what)
        schema = arrow_schema(dt)
        wanted = [self.key_column] + (self.columns or [])
        missing = [c for c in wanted if c not in schema.names]
        if missing:
            raise ConfigError(f"{self.what}: no column {missing[0]!r} in the table (columns: {schema.names})")
        self._names = self.columns if self.columns is not None else list(schema.names)
        self._key_type = schema.field(self.key_column).type
        return dt

    def fetch(self, keys: list) -> dict:
        if self._dt is None:
            self._dt = self._open()
        else:
            self._dt.update_incremental()  # the commits since the last fetch
        key = self.key_column
        read = [key] + [n for n in self._names if n != key]
        table = self._dt.to_pyarrow_dataset().to_table(
            columns=read, filter=pc.field(key).isin(pa.array(list(keys), self._key_type)))
        out: dict = {}
        for row in table.to_pylist():
            k = row[key]
            if k in out:
                raise DataError(f"{self.what}: key {k!r} has more than one row in the table (version "
                                f"{self._dt.version()}); a lookup table needs a unique {key!r}")
            out[k] = {n: row[n] for n in self._names}
        return out

    def close(self) -> None:
        self._dt = None
