"""What the table sinks share: records turned into Arrow tables of a fixed schema, and
parquet files staged in a table's location — written by the task thread, made durable by
the epoch's durability step, invisible until a table commit references them (seed 004
Table 4.1, "DBMS (MVCC)" row: pre-commit = new version, not yet visible).

* :class:`RowBuffer` collects records (dicts, named tuples, or plain tuples in schema
  order) and converts them in chunks with the FileSink's record→Arrow conversion, so a
  record that does not fit the schema is rejected with a
  :class:`~epochal.sinks.base.SinkWriteError` naming it, before any of it is written.
* :class:`TableFiles` is a table location: a local directory (files and directories are
  fsynced) or any ``pyarrow.fs.FileSystem`` (an object store persists a file when its upload
  completes, on close).
* :class:`StagedParquet` is one data file being written; ``close`` runs in the durability
  step, on the uploader thread, and returns what a table commit needs to reference it.
* :class:`TableRows` gives a :class:`~epochal.sinks.base.TwoPhaseCommitSink` the ``write_*_to``
  hooks over a :class:`RowBuffer`: the sink only says where a table of rows goes.
"""
from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from epochal.durable import fsync, fsync_dir
from epochal.sinks.base import SinkWriteError
from epochal.sinks.file_formats import Parquet, as_row  # the FileSink's record→Arrow conversion

#: rows converted (and written as one row group) at a time
ROW_GROUP = 8192


class RowBuffer:
    """Records of the open transaction, converted to Arrow ``schema`` every :data:`ROW_GROUP` rows.

    Accepts dicts (extra keys are rejected, missing ones are null), named tuples (as dicts)
    and plain tuples or lists with one value per schema column, in schema order.
    """

    def __init__(self, sink_name: str, schema: pa.Schema):
        self.sink_name = sink_name
        self.schema = schema
        self._names = schema.names
        self._convert = Parquet(sink_name, schema)
        self.rows: list[Mapping] = []

    def add(self, record) -> None:
        self.rows.append(self._as_row(record))

    def extend(self, records: list) -> None:
        convert = self._as_row
        self.rows.extend(r if type(r) is dict else convert(r) for r in records)

    def full(self) -> bool:
        return len(self.rows) >= ROW_GROUP

    def take(self) -> pa.Table | None:
        """The buffered rows as one table (None if none); raises SinkWriteError naming the
        first record that does not fit — then no row of the chunk was taken."""
        if not self.rows:
            return None
        table = self._convert.to_table(self.rows)
        self.rows = []
        return table

    def _as_row(self, record) -> Mapping:
        record = as_row(record)
        if isinstance(record, Mapping):
            return record
        if isinstance(record, (tuple, list)):
            if len(record) != len(self._names):
                raise SinkWriteError(self.sink_name, record, f"a tuple needs one value per column {self._names}, "
                                     f"got {len(record)} values")
            return dict(zip(self._names, record))
        raise SinkWriteError(self.sink_name, record, f"records must be dicts or tuples in the column order "
                             f"{self._names}, got {type(record).__name__}")


class TableRows:
    """Mixin of the table sinks' writers (before :class:`~epochal.sinks.base.TwoPhaseCommitSink`
    in the bases): records go through ``self._buffer`` (a :class:`RowBuffer` of
    ``self._schema``, set by the writer's start) into ``self._write_table(txn, table)``, one
    chunk of :data:`ROW_GROUP` rows at a time; Arrow batches are fitted to the schema and
    written after the records before them. ``self._flush(txn)`` writes what is buffered (the
    seal calls it, so a bad record raises there at the latest)."""

    def write_to(self, txn, record) -> None:
        self._buffer.add(record)
        if self._buffer.full():
            self._flush(txn)

    def write_many_to(self, txn, records: list) -> None:
        self._buffer.extend(records)
        if self._buffer.full():
            self._flush(txn)

    def write_batch_to(self, txn, batch) -> None:
        self._flush(txn)  # records before the batch keep their place
        self._write_table(txn, fit_batch(self.ctx.sink_name, batch, self._schema))

    def _flush(self, txn) -> None:
        table = self._buffer.take()
        if table is not None:
            self._write_table(txn, table)

    def _write_table(self, txn, table: pa.Table) -> None:
        raise NotImplementedError


def fit_batch(sink_name: str, batch: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """``batch`` as a table of ``schema`` (columns selected by name and cast), or
    SinkWriteError naming the batch and the mismatch."""
    if batch.schema.equals(schema):
        return pa.Table.from_batches([batch])
    missing = [n for n in schema.names if n not in batch.schema.names]
    extra = [n for n in batch.schema.names if n not in schema.names]
    what = f"<RecordBatch of {batch.num_rows} rows>"
    if extra:
        raise SinkWriteError(sink_name, what, f"columns {extra} are not in the table schema {schema.names}")
    try:
        columns = [batch.column(n).cast(f.type) if n not in missing else pa.nulls(batch.num_rows, f.type)
                   for n, f in zip(schema.names, schema)]
        return pa.Table.from_arrays(columns, schema=schema)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise SinkWriteError(sink_name, what, f"does not fit the table schema "
                             f"({schema.to_string(show_schema_metadata=False)}): {exc}".replace("\n", ", ")) from exc


class TableFiles:
    """A table location: ``local`` directory (plain files, fsynced) or ``fs`` (a
    ``pyarrow.fs.FileSystem``) under ``root``. Paths given to methods are relative to it."""

    def __init__(self, *, local: str | None = None, fs=None, root: str = ""):
        if (local is None) == (fs is None):
            raise ValueError("TableFiles: give a local directory or a pyarrow file system")
        self.local, self.fs, self.root = local, fs, root.rstrip("/")

    def _full(self, rel: str) -> str:
        base = self.local if self.local is not None else self.root
        return posixpath.join(base, rel) if base else rel

    def open(self, rel: str):
        """A new binary file for writing (replacing any file of that name)."""
        path = self._full(rel)
        if self.local is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return open(path, "wb")
        return self.fs.open_output_stream(path)

    def open_read(self, rel: str):
        """A binary file for reading (random access); FileNotFoundError if missing."""
        path = self._full(rel)
        if self.local is not None:
            return open(path, "rb")
        return self.fs.open_input_file(path)

    def finish(self, f, durable: bool) -> None:
        """Close a file from :meth:`open`; ``durable``: fsync it first (local files)."""
        if durable and self.local is not None:
            fsync(f)
        f.close()

    def sync_dirs(self, rels) -> None:
        """Make the directory entries of the files ``rels`` durable (local only)."""
        if self.local is None:
            return
        for directory in sorted({os.path.dirname(self._full(r)) for r in rels}, key=len, reverse=True):
            fsync_dir(None, directory)
        fsync_dir(None, self.local)

    def size(self, rel: str) -> int | None:
        """Bytes of ``rel``, None if it does not exist."""
        path = self._full(rel)
        if self.local is not None:
            try:
                return os.path.getsize(path)
            except FileNotFoundError:
                return None
        import pyarrow.fs as pafs

        info = self.fs.get_file_info(path)
        return None if info.type == pafs.FileType.NotFound else info.size

    def delete(self, rel: str) -> None:
        """Delete ``rel``; a missing file is fine."""
        path = self._full(rel)
        if self.local is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def delete_unreferenced(self, rels: list[str], referenced) -> int:
        """Delete the staged files of ``rels`` that ``referenced(rel)`` says the table holds
        not (orphans of rolled-back epochs), then sync their directories; idempotent (a
        missing file is fine). Returns how many were deleted."""
        doomed = [rel for rel in rels if not referenced(rel)]
        for rel in doomed:
            self.delete(rel)
        self.sync_dirs(doomed)
        return len(doomed)

    def list(self, under: str = "", keep=None, hidden=None) -> list[str]:
        """Relative paths of the files below ``under`` (recursively) whose base name passes
        ``keep`` (all if None); directories ``hidden(name)`` says are table metadata are
        skipped (default: names starting with ``_`` or ``.``)."""
        hidden = hidden or metadata_dir
        out = []
        if self.local is not None:
            top = self._full(under)
            for directory, dirs, files in os.walk(top):
                dirs[:] = [d for d in dirs if not hidden(d)]
                for name in files:
                    if keep is None or keep(name):
                        out.append(os.path.relpath(os.path.join(directory, name), self.local))
            return sorted(out)
        import pyarrow.fs as pafs

        base = self._full(under)
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        prefix = (self.root + "/") if self.root else ""
        for info in self.fs.get_file_info(selector):
            rel = info.path[len(prefix):] if info.path.startswith(prefix) else info.path
            parts = rel.split("/")
            if info.type != pafs.FileType.File or any(hidden(p) for p in parts[:-1]):
                continue
            if keep is None or keep(parts[-1]):
                out.append(rel)
        return sorted(out)


def metadata_dir(name: str) -> bool:
    """Whether a directory of a table location holds metadata, not data: ``_`` or ``.`` first."""
    return name.startswith(("_", "."))


@dataclass
class WrittenFile:
    """A closed staged data file: where, how big, how many rows, and nulls per column."""

    path: str
    size: int
    rows: int
    null_counts: dict
    modification_time: int  # ms since the epoch


class StagedParquet:
    """One parquet data file at ``rel`` of ``files``, written in row groups of ``schema``.

    ``write`` belongs to the task thread; after the transaction is sealed, ``close`` may run
    on the uploader thread (it touches only this object). The file is created with the
    first row group, so a part without rows leaves nothing behind.
    """

    def __init__(self, files: TableFiles, rel: str, schema: pa.Schema):
        self.files, self.rel, self.schema = files, rel, schema
        self.rows = 0
        self._file = None
        self._writer: pq.ParquetWriter | None = None
        self._nulls = dict.fromkeys(schema.names, 0)

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self._writer is None:
            self._file = self.files.open(self.rel)
            self._writer = pq.ParquetWriter(self._file, self.schema)
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.rows += table.num_rows
        for name, column in zip(table.column_names, table.columns):
            self._nulls[name] += column.null_count

    def close(self, durable: bool = True) -> WrittenFile | None:
        """Finish the file (footer, fsync if ``durable``, close): None if it has no rows."""
        if self._writer is None:
            return None
        self._writer.close()
        self.files.finish(self._file, durable)
        size = self.files.size(self.rel)
        return WrittenFile(self.rel, size or 0, self.rows, dict(self._nulls), int(time.time() * 1000))

    def discard(self) -> None:
        """Abort: close without syncing and delete the file."""
        if self._writer is not None:
            try:
                self._writer.close()
                self.files.finish(self._file, durable=False)
            finally:
                self.files.delete(self.rel)


def flat_column(schema: pa.Schema, column: str) -> bool:
    """Whether ``column`` of ``schema`` is not nested (Delta keeps null counts of flat columns only)."""
    t = schema.field(column).type
    return not (pa.types.is_nested(t))


def split_partitions(table: pa.Table, columns: list[str]):
    """``(partition values, rows)`` for each distinct combination of ``columns`` in ``table``."""
    keys = table.select(columns).group_by(columns, use_threads=False).aggregate([]).to_pylist()
    if len(keys) == 1:
        yield tuple(keys[0][c] for c in columns), table
        return
    for key in keys:
        mask = None
        for c in columns:
            v = key[c]
            m = pc.is_null(table.column(c)) if v is None else pc.fill_null(pc.equal(table.column(c), v), False)
            mask = m if mask is None else pc.and_(mask, m)
        yield tuple(key[c] for c in columns), table.filter(mask)
