"""Records → table rows for the PostgreSQL sink, checked per value before anything is sent,
so a record the table cannot take is a :class:`~epochal.sinks.base.SinkWriteError` naming it
(not a COPY failure at the barrier that would fail the whole epoch, again after every restart)."""
from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from epochal.connectors.postgres.client import Column

_INT = ("int2", "int4", "int8")
_FLOAT = ("float4", "float8", "numeric")
_TEXT = ("text", "varchar", "bpchar", "name", "citext")


def _check_for(col: Column) -> Callable[[Any], Any]:
    """A function that returns the value to send for ``col`` or raises TypeError."""
    t = col.type

    def kind(ok: tuple, label: str):
        def check(v):
            if not isinstance(v, ok) or (bool not in ok and isinstance(v, bool)):
                raise TypeError(f"column {col.name!r} ({t}) takes {label}, got {type(v).__name__} {v!r:.80}")
            return v
        return check

    if t in _INT:
        return kind((int,), "an int")
    if t in _FLOAT:
        return kind((int, float, decimal.Decimal), "a number")
    if t in _TEXT:
        return kind((str,), "a str")
    if t == "bool":
        return kind((bool,), "a bool")
    if t == "bytea":
        return kind((bytes, bytearray, memoryview), "bytes")
    if t in ("timestamp", "timestamptz"):
        return kind((datetime.datetime,), "a datetime")
    if t == "date":
        return kind((datetime.date,), "a date")
    if t == "uuid":
        return kind((uuid.UUID, str), "a UUID")
    if t in ("json", "jsonb"):
        from psycopg.types.json import Json, Jsonb

        wrap = Jsonb if t == "jsonb" else Json

        def json_value(v):
            return wrap(v)
        return json_value
    return lambda v: v  # other types: the server parses the value's text


class RowMaker:
    """Turns one record into a tuple in ``columns`` order: a dict by column name (absent keys
    are NULL, unknown keys an error), a tuple or list by position, or a ``pyarrow`` row dict."""

    def __init__(self, columns: list[Column]):
        self.columns = columns
        self.names = [c.name for c in columns]
        self._index = {c.name: i for i, c in enumerate(columns)}
        self._checks = [_check_for(c) for c in columns]
        self._not_null = [c.not_null for c in columns]

    def __call__(self, record: Any) -> tuple:
        """The row of ``record``; TypeError/ValueError saying which column or key is wrong."""
        if isinstance(record, Mapping):
            unknown = [k for k in record if k not in self._index]
            if unknown:
                raise ValueError(f"key(s) {unknown} are not columns of the sink (its columns: {self.names})")
            values = [record.get(name) for name in self.names]
        elif isinstance(record, (tuple, list)):
            if len(record) != len(self.names):
                raise ValueError(f"a row of {len(record)} value(s) for {len(self.names)} column(s) {self.names}")
            values = list(record)
        else:
            raise TypeError(f"a record must be a dict (by column) or a tuple (in column order {self.names}), "
                            f"got {type(record).__name__}")
        checks, not_null = self._checks, self._not_null
        for i, v in enumerate(values):
            if v is None:
                if not_null[i]:
                    raise ValueError(f"column {self.names[i]!r} is NOT NULL but the record has no value for it")
            else:
                values[i] = checks[i](v)
        return tuple(values)
