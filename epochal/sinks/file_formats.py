"""The part-file formats of :class:`~epochal.sinks.files.FileSink`: ``jsonl``, ``csv`` and
``parquet`` writers of one part file each, their readers, and :func:`read_committed` (all
records of a sink directory's committed part files, old-style names included).

A format object (:class:`JsonLines`, :class:`Csv`, :class:`Parquet`) is made once per
writer and fixes what all its part files share (csv columns, the parquet schema); its
:meth:`~JsonLines.part` opens a :class:`Part`. ``write`` / ``write_many`` / ``write_batch``
and ``seal`` run on the task thread; after ``seal`` the part is handed over and ``close``
(flush, fsync, upload) may run on the uploader thread. A record that cannot be written
raises :class:`~epochal.sinks.base.SinkWriteError` before any of its bytes reach the file.
"""
from __future__ import annotations

import csv
import datetime
import io
import json
import posixpath
from collections.abc import Mapping
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from epochal.durable import fsync
from epochal.errors import ConfigError
from epochal.sinks.base import SinkWriteError

__all__ = ["FORMATS", "OWNER_FILE", "READERS", "Csv", "JsonLines", "Parquet", "Part", "read_committed"]

_PARQUET_ROW_GROUP = 8192
_ARROW_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


class Part:
    """One part file being written; the file is created when the first bytes are ready.

    ``write`` and ``seal`` belong to the task thread; after ``seal`` the part is handed
    over and ``close`` may run on another thread (it never touches the shared format).
    """

    def __init__(self, fmt, fs, path: str):
        self._fmt, self._fs, self.path = fmt, fs, path
        self._file = None
        self.count = 0

    def _open(self):
        if self._file is None:
            self._file = self._fs.open(self.path, "wb")
        return self._file

    def write(self, record: Any) -> None:
        raise NotImplementedError

    def write_many(self, records: list) -> None:
        """``write`` for each record (formats override it when a batch is cheaper at once)."""
        write = self.write
        for record in records:
            write(record)

    def seal(self) -> None:
        """No more records: push buffered records into the file object (task thread)."""

    def discard(self) -> None:
        """Close without flushing buffered records (abort)."""
        self.close(sync=False)

    def close(self, sync: bool = True) -> None:
        """Seal, then close the file: flushed, fsynced if ``sync`` (object stores upload)."""
        self.seal()
        if self._file is not None:
            if sync:
                fsync(self._file)
            self._file.close()


def as_row(record: Any) -> Any:
    """Named tuples (e.g. :class:`~epochal.windows.WindowResult`) are written as objects."""
    if isinstance(record, tuple) and hasattr(record, "_asdict"):
        return record._asdict()
    return record


_JSON_ERRORS = (TypeError, ValueError, RecursionError)


def _json_default(value):
    """What JSON has no type for: a date, time or datetime (an Arrow timestamp column — a
    window's ``window_start`` — comes out of ``to_pylist`` as one) is written as its ISO 8601
    text, as Spark's JSON writer does; anything else raises ``TypeError`` (the record is then
    refused naming it, :class:`~epochal.sinks.base.SinkWriteError`)."""
    if isinstance(value, (datetime.date, datetime.time)):  # datetime.datetime is a date
        return value.isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_chunks_encoder():
    """``json.dumps`` without its per-call set-up (which costs more than encoding a small
    record): the C encoder ``json.dumps`` uses, made once with its defaults, called as
    ``"".join(encoder(record, 0))``. It gives ``json.dumps``'s text for every record it
    encodes; made without circular-reference markers (a quarter of its time), so a cyclic
    record raises RecursionError where ``json.dumps`` raises ValueError — the caller then
    goes through ``json.dumps``, whose error it reports. ``None`` where the C accelerator is
    missing or gives other text (the caller then always uses ``json.dumps``)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    d = json.JSONEncoder()
    try:
        encoder = make(None, _json_default, json.encoder.encode_basestring_ascii, None, d.key_separator,
                       d.item_separator, d.sort_keys, d.skipkeys, d.allow_nan)
        sample = [{"k": [1.5, None, True]}, "\u00e9", 2**70, float("nan"), datetime.date(2026, 1, 2)]
        if "".join(encoder(sample, 0)) == json.dumps(sample, default=_json_default):
            return encoder
    except TypeError:  # pragma: no cover - no C accelerator, or another signature
        pass
    return None  # pragma: no cover


class JsonLinesPart(Part):
    def write(self, record: Any) -> None:
        record = as_row(record)
        try:
            line = json.dumps(record, default=_json_default).encode("utf-8") + b"\n"
        except _JSON_ERRORS as exc:
            raise SinkWriteError(self._fmt.sink_name, record, f"not JSON-serializable: {exc}") from exc
        self._open().write(line)  # only whole, encoded records reach the file
        self.count += 1

    def write_many(self, records: list) -> None:
        """One encode and one file write for the batch; the same bytes as ``write`` per
        record. If a record fails, the batch goes through ``write`` record by record, which
        writes the records before it and raises for it."""
        encoder = self._fmt.encoder
        if encoder is None:  # pragma: no cover - no C encoder
            super().write_many(records)
            return
        if any(issubclass(t, tuple) for t in set(map(type, records))):  # named tuples become objects
            records = [as_row(r) for r in records]
        join = "".join
        try:
            lines = [join(encoder(r, 0)) for r in records]
        except _JSON_ERRORS:
            super().write_many(records)
            return
        if lines:
            lines.append("")
            self._open().write("\n".join(lines).encode("utf-8"))
            self.count += len(lines) - 1


class CsvPart(Part):
    def write(self, record: Any) -> None:
        fmt = self._fmt
        record = as_row(record)
        if not isinstance(record, Mapping):
            raise SinkWriteError(fmt.sink_name, record,
                                 f"csv records must be dicts (column -> value), got {type(record).__name__}")
        columns = fmt.columns_for(record)
        extra = [k for k in record if k not in fmt.column_set]
        if extra:
            raise SinkWriteError(fmt.sink_name, record, f"keys {extra} are not csv columns {columns}")
        for k, v in record.items():
            if isinstance(v, (Mapping, list, tuple, set, bytes)):
                raise SinkWriteError(fmt.sink_name, record,
                                     f"csv cell {k!r} must be a scalar, got {type(v).__name__}")
        row = fmt.encode([record.get(c) for c in columns])
        if self._file is None:
            self._open().write(fmt.encode(columns))
        self._file.write(row)
        self.count += 1


class ParquetPart(Part):
    def __init__(self, fmt, fs, path: str):
        super().__init__(fmt, fs, path)
        self._rows: list[Mapping] = []
        self._writer: pq.ParquetWriter | None = None

    def write(self, record: Any) -> None:
        record = as_row(record)
        if not isinstance(record, Mapping):
            raise SinkWriteError(self._fmt.sink_name, record,
                                 f"parquet records must be dicts (column -> value), got {type(record).__name__}")
        self._rows.append(record)
        self.count += 1
        if len(self._rows) >= _PARQUET_ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        rows, self._rows = self._rows, []
        table = self._fmt.to_table(rows)  # raises SinkWriteError before anything is written
        self._write_table(table)

    def _write_table(self, table) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._open(), table.schema, **self._fmt.options)
        self._writer.write_table(table)

    def write_batch(self, batch) -> None:
        """A ``pyarrow.RecordBatch`` as row group(s), after any buffered dict rows."""
        if self._rows:
            self._flush()
        schema = self._fmt.schema
        if schema is not None and not batch.schema.equals(schema):
            try:
                batch = batch.select(schema.names).cast(schema)
            except Exception as exc:
                raise SinkWriteError(self._fmt.sink_name, f"<RecordBatch of {batch.num_rows} rows>",
                                     f"does not fit parquet schema {schema}: {exc}") from exc
        if self._writer is not None and not batch.schema.equals(self._writer.schema):
            raise SinkWriteError(self._fmt.sink_name, f"<RecordBatch of {batch.num_rows} rows>",
                                 f"schema {batch.schema} differs from the part file's {self._writer.schema}")
        self._write_table(pa.Table.from_batches([batch]))
        self.count += batch.num_rows

    def seal(self) -> None:
        if self._rows:
            self._flush()

    def discard(self) -> None:
        self._rows = []
        self.close(sync=False)

    def close(self, sync: bool = True) -> None:
        self.seal()
        if self._writer is not None:
            self._writer.close()
        super().close(sync)


class JsonLines:
    ext, part_class = "jsonl", JsonLinesPart

    def __init__(self, sink_name: str, schema: pa.Schema | None):
        self.sink_name = sink_name
        self.encoder = _json_chunks_encoder()

    def part(self, fs, path: str) -> Part:
        return self.part_class(self, fs, path)


class Csv(JsonLines):
    """Columns are fixed per writer (schema or first record), so all part files agree."""

    ext, part_class = "csv", CsvPart

    def __init__(self, sink_name: str, schema: pa.Schema | None):
        super().__init__(sink_name, schema)
        self.columns: list[str] | None = list(schema.names) if schema is not None else None
        self.column_set = frozenset(self.columns or ())
        self._buf = io.StringIO()
        self._csv = csv.writer(self._buf)

    def columns_for(self, record: Mapping) -> list[str]:
        if self.columns is None:
            self.columns = list(record)
            self.column_set = frozenset(record)
        return self.columns

    def encode(self, values: list) -> bytes:
        self._buf.seek(0)
        self._buf.truncate()
        self._csv.writerow(values)
        return self._buf.getvalue().encode("utf-8")


class Parquet(JsonLines):
    """The schema is fixed per writer (given or inferred from the first batch)."""

    ext, part_class = "parquet", ParquetPart

    def __init__(self, sink_name: str, schema: pa.Schema | None):
        super().__init__(sink_name, schema)
        self.schema = schema
        self.options: dict = {}  # ParquetWriter keyword arguments (FileSink parquet_options)

    def to_table(self, rows: list[Mapping]) -> pa.Table:
        try:
            table = pa.Table.from_pylist(rows, schema=self.schema)
        except _ARROW_ERRORS as exc:
            raise self._rejection(rows, exc) from exc
        names = set(table.schema.names)
        for row in rows:
            if not names.issuperset(row):
                raise SinkWriteError(self.sink_name, row, f"keys {sorted(set(row) - names, key=str)} "
                                     f"are not columns of the parquet schema {table.schema.names}")
        self.schema = table.schema
        return table

    def _rejection(self, rows: list[Mapping], exc: Exception) -> SinkWriteError:
        schema = self.schema
        for row in rows:  # find the first record that does not convert on its own
            try:
                schema = pa.Table.from_pylist([row], schema=schema).schema
            except _ARROW_ERRORS as err:
                return SinkWriteError(self.sink_name, row, f"does not fit parquet schema "
                                      f"({schema.to_string(show_schema_metadata=False) if schema else 'none'}"
                                      f"): {err}".replace("\n", ", "))
        return SinkWriteError(self.sink_name, rows[0], f"parquet conversion of its batch failed: {exc}")


FORMATS = {"jsonl": JsonLines, "csv": Csv, "parquet": Parquet}


READERS = {
    "jsonl": lambda f: [json.loads(line) for line in f.read().decode("utf-8").splitlines() if line],
    "csv": lambda f: [dict(r) for r in csv.DictReader(io.StringIO(f.read().decode("utf-8"), newline=""))],
    "parquet": lambda f: pq.read_table(f).to_pylist(),
}


# ------------------------------------------------------------------------- reading


def read_committed(path: str, format: str | None = None) -> list:
    """All records of the committed part files under ``path`` (staging and hidden files are
    skipped), file by file in name order. csv values come back as strings.

    ``format``: ``None`` reads the one the sink wrote, as its ownership marker
    (``_epochal_sink.json``) says — or, in a directory without one, the one format its part
    files have (``jsonl`` when there are none).

    Raises:
        ConfigError: an unknown ``format``, one that contradicts the marker, or (no marker)
            part files of several formats.

    >>> read_committed("memory://no-such-dir")
    []
    """
    if format is not None and format not in FORMATS:
        raise ConfigError(f"read_committed format: expected one of {sorted(FORMATS)}, got {format!r}")
    fs, root = fsspec.core.url_to_fs(path)
    fs.invalidate_cache(root)
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    format = _committed_format(fs, root, entries, format, path)
    suffix = "." + FORMATS[format].ext
    records: list = []
    for p in sorted(entries):
        name = posixpath.basename(p.rstrip("/"))
        if name.startswith("part-") and name.endswith(suffix):
            with fs.open(p, "rb") as f:
                records.extend(READERS[format](f))
    return records


OWNER_FILE = "_epochal_sink.json"


def _committed_format(fs, root: str, entries: list, asked: str | None, path: str) -> str:
    """The part-file format of a sink directory (see :func:`read_committed`)."""
    written = None
    marker = posixpath.join(root, OWNER_FILE)
    if any(posixpath.basename(e.rstrip("/")) == OWNER_FILE for e in entries):
        try:
            written = json.loads(fs.cat_file(marker)).get("file_format")
        except (ValueError, AttributeError):
            written = None
    if written is not None:
        if asked is not None and asked != written:
            raise ConfigError(f"read_committed({path!r}, format={asked!r}): the sink wrote {written!r} part files "
                              f"({OWNER_FILE}); pass format={written!r} or leave format out")
        return written
    if asked is not None:
        return asked
    by_ext = {fmt.ext: name for name, fmt in FORMATS.items()}
    found = {by_ext[ext] for e in entries for name in [posixpath.basename(e.rstrip("/"))] if name.startswith("part-")
             for ext in [name.rsplit(".", 1)[-1]] if ext in by_ext}
    if len(found) > 1:
        raise ConfigError(f"read_committed({path!r}): part files of several formats {sorted(found)} and no "
                          f"{OWNER_FILE} saying which the sink wrote: pass format=")
    return found.pop() if found else "jsonl"
